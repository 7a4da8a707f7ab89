"""What every checkpoint converter shares: the one :class:`ConversionError` and :func:`count_params`."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx


class ConversionError(ValueError):
    """A checkpoint that does not fit the target model; the message lists every missing, unexpected
    or mis-shaped key (one class for every converter in ``animegamer_jax.convert``)."""


def count_params(state: Any) -> int:
    """Number of scalars in every array leaf of an NNX module, ``nnx.State`` (abstract or concrete)
    or pure dict; a module counts its ``nnx.Param`` variables."""
    if isinstance(state, nnx.Module):
        state = nnx.state(state, nnx.Param)
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state) if hasattr(x, "shape")))
