"""animegamer-jax: a JAX/Flax NNX reimplementation of AnimeGamer (arXiv 2504.01014).

Subpackages (docs/design.md#who-may-import-whom says who may import whom):
  models/     pure networks, one folder per family with its converter's key table: mistral/ (Mistral,
              MLLM), cogvideox/ (DiT, VAE), clip/, t5/, shot_encoder/; shared attention, lora, remat
  diffusion/  schedules, losses and samplers that take a denoise function
  data/       films -> clips -> labels -> ArrayRecord -> Grain loaders
  train/      the three training phases
  game/       game play and batch generation, writers
  convert/    PyTorch / SAT / HF checkpoints -> our orbax layout: the CLI fronts, the release
              converter and the helpers every key table shares (common.py)
  eval/       metrics and benchmark runner
  parallel/   mesh, logical axis rules, multi-host start
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
