"""Deprecated alias of animegamer_jax.game.turn_by_turn (removed next release)."""
from animegamer_jax.game.turn_by_turn import *  # noqa: F401,F403
