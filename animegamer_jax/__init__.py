"""animegamer-jax: a JAX/Flax NNX reimplementation of AnimeGamer (arXiv 2504.01014).

Layers, bottom to top (docs/design.md "Layers"; a module imports only from its own layer or below,
pyproject.toml ``[tool.importlinter]``, tests/test_layers.py):
  paths, config, fileio, parallel   user paths and file operations, config files, meshes and targets
  cli                               flag parsing and the command pattern (``cli.run_command``)
  video_io, mllm_tokenizer, t5_tokenizer, weights
                                    video files, tokenizers, reading foreign state dicts
  models, diffusion                 networks (one folder per family); schedules, losses, samplers
  checkpoint                        one directory per trained system: save, load, integrity, cast
  game, data                        playing games; films -> clips -> labels -> ArrayRecord
  train, convert                    the training phases; converters of released checkpoints
  eval, aot                         quality evaluation; ahead-of-time compiles ("will it fit?")
  play, generate, web               the commands
"""

__version__ = "0.1.0"

# Parameters carry logical axis names; shardings are applied explicitly by
# animegamer_jax.parallel (create_sharded_model / shard_params), which drops mesh axes that do
# not divide a dimension. Flax's eager sharding would instead demand a mesh at every module
# construction (even a 1-CPU test), so it is turned off for the whole package.
from flax import nnx as _nnx

from animegamer_jax import paths as _paths

_nnx.use_eager_sharding(False)
# STORAGE_EMULATOR_HOST reroutes every GCS access, orbax's tensorstore included (paths.py).
_paths.configure_gcs_emulator()
