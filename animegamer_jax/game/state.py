"""Deprecated alias of animegamer_jax.game.window (removed next release)."""
from animegamer_jax.game.window import *  # noqa: F401,F403
