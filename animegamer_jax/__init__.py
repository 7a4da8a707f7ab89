"""animegamer-jax: AnimeGamer (arXiv 2504.01014) in JAX / Flax NNX; its layers and module map are docs/design.md."""

__version__ = "0.1.0"

# Parameters carry logical axis names; shardings are applied explicitly by
# animegamer_jax.parallel (create_sharded_model / shard_params), which drops mesh axes that do
# not divide a dimension. Flax's eager sharding would instead demand a mesh at every module
# construction (even a 1-CPU test), so it is turned off for the whole package.
from flax import nnx as _nnx

from animegamer_jax.io import paths as _paths

_nnx.use_eager_sharding(False)
# STORAGE_EMULATOR_HOST reroutes every GCS access, orbax's tensorstore included (io/paths.py).
_paths.configure_gcs_emulator()
