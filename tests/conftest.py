"""Shared test set-up: CPU only, fp32 matmuls, absl flags parsed (grain workers read them)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
from absl import flags  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
