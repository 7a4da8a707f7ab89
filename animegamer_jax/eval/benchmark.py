"""Deprecated alias of animegamer_jax.eval.table1, the Table 1 evaluation (removed next release)."""
from animegamer_jax.eval.table1 import *  # noqa: F401,F403
