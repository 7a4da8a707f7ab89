"""Random (non-trivial) weights for tiny test models, without a jax.random compile."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def random_model(model_fn, seed=0, scale=0.1):
    """Builds the module abstractly and fills it with numpy noise (norm weights near 1).

    Random init through jax.random costs a multi-second XLA compile per shape on a busy CPU;
    these tests only need some non-trivial weights.
    """
    graphdef, state = nnx.split(nnx.eval_shape(model_fn))
    rng = np.random.RandomState(seed)
    flat = []
    for path, v in nnx.to_flat_state(state):
        base = 1.0 if path[-1] == "weight" else 0.0
        flat.append((path, v.replace(jnp.asarray(base + scale * rng.standard_normal(v.shape), v.dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def normal_model(model_fn, seed=0, scale=0.2):
    """Builds the module abstractly and fills every parameter, norm weights included, with N(0, scale)
    noise from ``np.random.default_rng(seed)`` (the shot encoder's tests and their pinned values)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(model_fn))
    rng = np.random.default_rng(seed)
    state = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, scale, s.shape), s.dtype), abstract)
    return nnx.merge(graphdef, state)
