"""Mesh, logical sharding and multi-host start: 8 fake CPU devices and two local processes."""

import json

import pytest

from animegamer_jax import parallel
from tests.subproc import WORKER_JOIN, run_processes, run_python


def test_resolve_mesh_shape_and_errors():
    assert parallel.resolve_mesh_shape((-1, 2, 1, 1), 8) == (4, 2, 1, 1)
    assert parallel.resolve_mesh_shape((2, 2, 2, 1), 8) == (2, 2, 2, 1)
    with pytest.raises(parallel.ShardingConfigError, match="does not divide the 8 devices"):
        parallel.resolve_mesh_shape((-1, 3, 1, 1), 8)
    with pytest.raises(parallel.ShardingConfigError, match="needs 4 devices but 8 are available"):
        parallel.resolve_mesh_shape((2, 2, 1, 1), 8)
    with pytest.raises(parallel.ShardingConfigError, match="at most one axis may be -1"):
        parallel.resolve_mesh_shape((-1, -1, 1, 1), 8)


def test_logical_to_spec_drops_reused_axes():
    rules = (("act_batch", ("data", "fsdp")), ("act_length", "fsdp"), ("embed", "fsdp"), ("mlp", "tensor"))
    spec = parallel.logical_to_spec(("act_batch", "act_length", None), rules)
    assert tuple(spec) == (("data", "fsdp"), None, None)
    assert tuple(parallel.logical_to_spec(("embed", "mlp", "unknown"), rules)) == ("fsdp", "tensor", None)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sharded_jit_on_8_cpu_devices():
    out = run_python("""
        import json
        import jax, jax.numpy as jnp, numpy as np
        from flax import nnx
        from animegamer_jax import parallel
        from configs import tiny

        class MLP(nnx.Module):
            def __init__(self, rngs):
                init = nnx.initializers.normal(0.5)
                self.w1 = nnx.Param(nnx.with_partitioning(init, ("embed", "mlp"))(rngs.params(), (16, 32)))
                self.w2 = nnx.Param(nnx.with_partitioning(init, ("mlp", "embed"))(rngs.params(), (32, 16)))
            def __call__(self, x):
                x = parallel.constrain(x, ("act_batch", "act_embed"))
                h = parallel.constrain(jnp.tanh(x @ self.w1[...]), ("act_batch", "act_mlp"))
                return parallel.constrain(h @ self.w2[...], ("act_batch", "act_embed"))

        cfg = tiny.get_config(); cfg.mesh.shape = (2, 2, 2, 1)
        mesh = parallel.mesh_from_config(cfg)
        rules = parallel.rules_from_config(cfg)
        model = parallel.create_sharded_model(lambda: MLP(nnx.Rngs(0)), mesh, rules)
        x = np.random.RandomState(0).randn(8, 16).astype(np.float32)
        xs = parallel.shard_batch({"x": x}, mesh, rules)["x"]
        with parallel.sharding_context(mesh, rules):
            y = nnx.jit(lambda m, x: m(x))(model, xs)
        ref = MLP(nnx.Rngs(0))(x)
        err = None
        try:
            parallel.shard_batch({"x": x[:6]}, mesh, rules)
        except parallel.ShardingConfigError as e:
            err = str(e)
        print(json.dumps({
            "devices": jax.device_count(), "mesh": dict(mesh.shape),
            "w1": str(model.w1[...].sharding.spec), "x": str(xs.sharding.spec), "y": str(y.sharding.spec),
            "shards": len(y.addressable_shards), "maxdiff": float(np.abs(np.asarray(y) - np.asarray(ref)).max()),
            "err": err}))
    """)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["devices"] == 8 and r["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2, "context": 1}
    assert r["w1"] == "P('fsdp', 'tensor')"
    for name in ("x", "y"):  # batch split over data x fsdp, features replicated
        assert r[name] in ("P(('data', 'fsdp'), None)", "P(('data', 'fsdp'),)"), r[name]
    assert r["shards"] == 8
    assert r["maxdiff"] < 1e-5
    assert "global batch size 6 does not divide the 4 data-parallel shards" in r["err"]


_WORKER = WORKER_JOIN + r"""
import jax.numpy as jnp, numpy as np
mesh = parallel.make_mesh((-1, 1, 1, 1))
# each process holds its half of the global batch [0..7]
local = np.arange(4, dtype=np.float32) + 4 * pid
sharding = parallel.batch_sharding(mesh, 1)
garr = jax.make_array_from_process_local_data(sharding, local, (8,))
total = jax.jit(jnp.sum, out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))(garr)
print(json.dumps({"pid": jax.process_index(), "count": jax.process_count(), "devices": jax.device_count(),
                  "sum": float(total)}))
jax.distributed.shutdown()
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_process_distributed_global_sum(tmp_path):
    results = run_processes(_WORKER, tmp_path, devices=2, timeout=240)
    assert [r["pid"] for r in results] == [0, 1]
    for r in results:
        assert r["count"] == 2 and r["devices"] == 4
        assert r["sum"] == sum(range(8))


def test_initialize_is_skipped_for_one_process(monkeypatch):
    for k in ("JAX_NUM_PROCESSES", "SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    assert parallel.is_multiprocess_launch() is False
    assert parallel.initialize() is False
    assert parallel.is_multiprocess_launch({"JAX_NUM_PROCESSES": "4"}) is True
    assert parallel.is_multiprocess_launch({"SLURM_NTASKS": "2", "SLURM_PROCID": "1"}) is True


@pytest.mark.slow
def test_stage_lines_before_distributed_initialize_leave_the_backend_alone():
    """`train` prints its first stage line before jax.distributed.initialize, which fails once the XLA
    backend is up: the line must not start it (it did, through jax.process_index; every multi-process
    `python -m animegamer_jax.commands.train` stopped with "must be called before any JAX calls")."""
    out = run_python("""
        import jax
        from jax._src import xla_bridge
        from animegamer_jax.commands import cli
        cli._console["on"] = True
        cli.status("building %s ...", "the model")
        print(xla_bridge.backends_are_initialized())
        jax.devices()
        cli.status("compiling")
    """, devices=1, env={"JAX_PROCESS_ID": "1"})
    assert out.strip().splitlines()[-1] == "False"
