"""Deprecated alias of animegamer_jax.data.label_schema, the labels JSONL format (removed next release)."""
from animegamer_jax.data.label_schema import *  # noqa: F401,F403
