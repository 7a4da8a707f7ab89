"""Helpers every model family shares (one of each)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


def param(rng: nnx.Rngs | jax.Array, init: Callable[..., jax.Array], shape: Sequence[int],
          axes: Sequence[str | None], dtype: Any = jnp.float32, cls: type = nnx.Param) -> nnx.Param:
    """A parameter ``init(key, shape, dtype)`` annotated with logical ``axes`` (parallel/mesh.py names).

    Args:
      rng: an ``nnx.Rngs`` (its ``params`` stream is drawn once) or a PRNG key.
      init: a ``jax.nn.initializers``-style function.
      shape / axes: array shape and one logical axis name (or None) per dimension.
      dtype: storage dtype; cls: the Variable class (``nnx.Param`` or a subclass).
    """
    key = rng.params() if isinstance(rng, nnx.Rngs) else rng
    return cls(nnx.with_partitioning(init, tuple(axes))(key, tuple(shape), dtype))
