"""Deprecated alias of animegamer_jax.game.standin_system (removed next release)."""
from animegamer_jax.game.standin_system import *  # noqa: F401,F403
