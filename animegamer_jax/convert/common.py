"""Deprecated alias of animegamer_jax.weights (removed next release)."""

from animegamer_jax.weights import *  # noqa: F401,F403
from animegamer_jax.weights import (ConversionError, StateDictReader, check_keys, count_params,  # noqa: F401
                                    fill_state, load_state_dict, raise_key_problems, restore_state, save_state,
                                    state_from_pure_dict, to_numpy)
