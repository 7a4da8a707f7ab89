"""Deprecated alias of animegamer_jax.game.loading (removed next release)."""
from animegamer_jax.game.loading import *  # noqa: F401,F403
