"""Shared test set-up: CPU only, fp32 matmuls, no persistent compilation cache, absl flags parsed (grain workers read them)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Commands cache compiled programs in the user's cache folder by default (cli.compilation_cache): tests
# (and the commands they start, which inherit this environment) use no persistent cache at all, so
# they write nothing into the home folder and do not depend on one another's compiles.
os.environ["JAX_COMPILATION_CACHE_DIR"] = ""

import jax  # noqa: E402
from absl import flags  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# With this JAX's default (partitionable threefry) a 5-D jax.random.normal compiles for ~13 s on
# this CPU instead of ~0.5 s; tests need speed, not shard-local random streams.
jax.config.update("jax_threefry_partitionable", False)
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
