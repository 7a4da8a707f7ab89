"""Compile-only TPU devices for tests (the real TPU compiler, deviceless), and configs/tiny.py's programs
compiled for them."""

import os


def tpu_devices(topology: str = "v5e-4"):
    """Compile-only devices of a TPU ``topology`` (the real TPU compiler, libtpu, no TPU needed).

    Skips where libtpu is not installed (``make tpu-compiler``), except under CI (``CI=true``), where
    the Makefile installs it and its absence is a failure."""
    import pytest

    from animegamer_jax.parallel import target

    if not target.tpu_compiler_available():
        if os.environ.get("CI"):
            pytest.fail("the TPU compiler (libtpu) is missing under CI: `make tpu-compiler` installs it")
        pytest.skip("the TPU compiler (libtpu) is not installed: make tpu-compiler")
    return target.compile_devices(target.parse_topology(topology))


# FSDP over the 4 chips (the paper config's layout) and a batch they divide. Phase a1 runs T5 and CLIP
# in the step, as tiny.py does; the others take precomputed features (data/extract_features) so that
# each compiles in seconds. Every decoder phase takes latents: the VAE (slow to compile for a TPU, about
# 2 min at tiny size on 2 cores) is compiled once for training and once for play, in tests/test_aot_vae.py (make test-paper).
FSDP = ["mesh.shape=(1,-1,1,1)", "train.global_batch_size=4"]


def compile_tiny(program: str, overrides: list[str], layout: str = "latency") -> "report.Row":
    """Compiles ``program`` of configs/tiny.py (+ ``overrides``) for v5e-4 and returns its row."""
    import jax

    from animegamer_jax.aot import programs, report
    from animegamer_jax.config import load_config
    from animegamer_jax.parallel import target

    cfg = load_config("configs/tiny.py", overrides)
    devs = tpu_devices("v5e-4")
    prog = (programs.train_program(cfg, program, devs) if program in programs.TRAIN_PROGRAMS
            else programs.turn_programs(cfg, [program], devs, layout)[0])
    with jax.default_matmul_precision("default"):  # conftest's "highest" is for fp32 parity tests
        return report.compile_program(prog, target.of_device(devs[0]).chip)


def fsdp_step_hlo(devices, layers: int = 3):
    """(optimized HLO text, mesh) of the gradient of a scanned stack of ``layers`` [256, 256] matmuls with
    the weights split over the ``data`` axis of a (devices / 2, 2) mesh (FSDP): a layer's weight is
    all-gathered inside the scan (tests/test_aot_mfu.py)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices).reshape(-1, 2), ("data", "model"))

    def loss(ws, x):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
        return jnp.sum(h)

    ws = jax.ShapeDtypeStruct((layers, 256, 256), jnp.float32, sharding=NamedSharding(mesh, P(None, "data", None)))
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))
    return jax.jit(jax.grad(loss)).lower(ws, x).compile().as_text(), mesh
