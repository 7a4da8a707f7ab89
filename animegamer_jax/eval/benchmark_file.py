"""Deprecated alias of animegamer_jax.eval.table1_games, the benchmark file format (removed next release)."""
from animegamer_jax.eval.table1_games import *  # noqa: F401,F403
