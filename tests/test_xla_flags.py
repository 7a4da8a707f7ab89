"""parallel/xla_flags.py: the collective-overlap compile options of a train step, per platform, and what
they change in the real TPU compiler's schedule (deviceless)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from animegamer_jax.config import load_config
from animegamer_jax.parallel import xla_flags
from tests.tpu import tpu_devices


class _Mesh:
    def __init__(self, platform):
        self.devices = np.array([type("D", (), {"platform": platform})()])


def test_options_follow_the_mesh_platform_and_the_config():
    cfg = load_config("configs/tiny.py")
    assert cfg.train.overlap_collectives is True
    assert xla_flags.train_compile_options(cfg, _Mesh("tpu")) == xla_flags.TPU
    assert xla_flags.train_compile_options(cfg, _Mesh("cuda")) == xla_flags.GPU
    assert xla_flags.train_compile_options(cfg, _Mesh("cpu")) is None
    fast = {"xla_backend_optimization_level": 0}
    assert xla_flags.train_compile_options(cfg, _Mesh("cpu"), fast) == fast
    cfg.train.overlap_collectives = False
    assert xla_flags.train_compile_options(cfg, _Mesh("tpu")) is None
    assert xla_flags.train_compile_options(cfg, _Mesh("gpu"), fast) == fast


def test_gpu_options_are_xla_debug_options():
    # XLA:CPU parses the same DebugOptions as XLA:GPU: a misspelt or retyped option fails here
    lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(3))
    lowered.compile(compiler_options=xla_flags.GPU)


def test_tpu_options_make_the_fsdp_all_gather_async():
    """The gradient of a scanned stack whose weights are FSDP-split over 2 of 4 v5p chips all-gathers a
    layer's weight inside the scan: with the overlap options the TPU compiler issues it as an async
    collective (scheduled against the layers' compute), without them as a blocking one."""
    devs = tpu_devices("v5p-8")
    mesh = Mesh(np.array(devs).reshape(-1, 2), ("data", "model"))

    def loss(ws, x):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
        return jnp.sum(h)

    ws = jax.ShapeDtypeStruct((4, 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "data", None)))
    x = jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("data", None)))
    lowered = jax.jit(jax.grad(loss)).lower(ws, x)
    marker = 'async_collective_name="all-gather-start"'
    assert marker not in lowered.compile().as_text()
    assert marker in lowered.compile(compiler_options=xla_flags.overlap_options("tpu")).as_text()


def test_the_compile_tool_compiles_the_train_step_with_the_train_commands_options():
    from animegamer_jax.aot import programs
    from tests.tpu import FSDP

    devs = tpu_devices("v5e-4")
    prog = programs.train_program(load_config("configs/tiny.py", FSDP), "a2", devs)
    assert prog.compiler_options == xla_flags.TPU
    off = programs.train_program(load_config("configs/tiny.py", FSDP + ["train.overlap_collectives=False"]), "a2", devs)
    assert off.compiler_options is None
