"""Deprecated alias of animegamer_jax.game.release_decoding (removed next release)."""
from animegamer_jax.game.release_decoding import *  # noqa: F401,F403
