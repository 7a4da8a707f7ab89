"""Deprecated alias of animegamer_jax.mllm_tokenizer (removed next release)."""
from animegamer_jax.mllm_tokenizer import *  # noqa: F401,F403
from animegamer_jax.mllm_tokenizer import _added_tokens  # noqa: F401
