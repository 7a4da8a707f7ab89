"""Deprecated alias of animegamer_jax.game.real_system (removed next release)."""
from animegamer_jax.game.real_system import *  # noqa: F401,F403
