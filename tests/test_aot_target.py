"""The target of a program is its mesh's devices: topology names, chip figures, attention `auto`, the VAE
tile budget and the Mistral decode layout follow it; Mosaic kernels compile partitioned (real TPU
compiler, deviceless)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from animegamer_jax import parallel
from animegamer_jax.models import attention
from animegamer_jax.parallel import target
from tests.tpu import tpu_devices


@pytest.mark.parametrize("name,kind,chips,spec", [
    ("v5p-64", "tpu", 32, "v5p:2x4x4"),  # v5p names count 2 TensorCores per chip
    ("v5p-8", "tpu", 4, "v5p:2x2x1"),
    ("v4-8", "tpu", 4, "v4:2x2x1"),
    ("v6e-8", "tpu", 8, "v6e:2x4"),
    ("v5e-16", "tpu", 16, "v5e:4x4"),
    ("v6e-1", "tpu", 1, "v6e:2x2"),  # one chip: the first of a 2x2 (libtpu refuses 1x1)
    ("h100-8", "gpu", 8, "1x1x8"),
    ("4xh100-8", "gpu", 32, "1x4x8"),
    ("b200-8", "gpu", 8, "1x1x8"),
    ("cpu-8", "cpu", 8, "cpu:8"),
])
def test_parse_topology(name, kind, chips, spec):
    t = target.parse_topology(name)
    assert (t.kind, t.num_devices, t.spec) == (kind, chips, spec)
    assert (t.chip is None) == (kind == "cpu")


def test_parse_topology_errors_name_the_forms():
    with pytest.raises(ValueError, match="v5p-64"):
        target.parse_topology("tpu9000")
    with pytest.raises(ValueError, match="multiple of 2"):
        target.parse_topology("v5p-7")
    with pytest.raises(ValueError, match="no v6e slice of 3 chips"):
        target.parse_topology("v6e-3")
    assert target.parse_topology("v5p-64", num_slices=2).num_devices == 64


def test_chip_table_matches_compile_only_devices():
    for name, chip in (("v5e-4", "v5e"), ("v5p-8", "v5p"), ("v6e-8", "v6e"), ("v4-8", "v4")):
        devs = tpu_devices(name)
        assert len(devs) == target.parse_topology(name).num_devices
        t = target.of_device(devs[0])
        assert (t.platform, t.chip.name) == ("tpu", chip), devs[0].device_kind
    assert target.chip_named("v6e").hbm_bytes == 32 * 2**30 and target.chip_named("h100").bf16_flops == 989e12
    assert target.chip_of("NVIDIA H100 80GB HBM3").name == "h100" and target.chip_of("cpu") is None


def _mesh(devices, shape=(1, -1, 1, 1)):
    return parallel.make_mesh(shape, devices=devices)


def test_attention_auto_follows_the_mesh_not_the_host():
    q = jnp.zeros((4, 256, 4, 64), jnp.bfloat16)
    hybrid = attention.causal_mask(block_first=jnp.array([10] * 4), block_last=jnp.array([20] * 4))
    bias = jnp.zeros((1, 4, 256, 256))  # made here: nothing runs eagerly on compile-only devices
    assert jax.default_backend() == "cpu"
    assert attention.resolve("auto", q, q) == "dense"  # no mesh: the default device (CPU)
    with parallel.sharding_context(_mesh(jax.devices()[:1])):
        assert attention.resolve("auto", q, q) == "dense"
    with parallel.sharding_context(_mesh(tpu_devices("v5e-4"))), attention.recording() as calls:
        assert attention.resolve("auto", q, q, mask=attention.causal_mask()) == "splash"
        assert attention.resolve("auto", q, q, mask=hybrid) == "blockwise"
        assert attention.resolve("auto", q, q, bias=bias) == "blockwise"
        assert attention.resolve("dense", q, q) == "dense"  # an explicit choice is kept
    assert [c["kernel"] for c in calls] == ["splash", "blockwise", "blockwise", "dense"]
    assert "bidirectional query block" in calls[1]["why"] and calls[3]["why"] == "requested"
    assert {c["platform"] for c in calls} == {"tpu"}
    # a GPU target (what current() reads from a GPU mesh's abstract device)
    gpu = types.SimpleNamespace(abstract_device=types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3"))
    t = target.current(gpu)
    assert (t.platform, t.chip.name) == ("gpu", "h100")
    assert attention._auto(q, q, None, attention.AttentionMask(), attention.DENSE_LIMIT_BYTES, "gpu")[0] == "cudnn"
    assert attention._auto(q.astype(jnp.float32), q, None, attention.AttentionMask(), attention.DENSE_LIMIT_BYTES, "gpu")[0] == "blockwise"


@pytest.mark.slow
def test_splash_compiles_partitioned_under_fsdp():
    """The DiT's failure on a pod (a1/a2): the Mosaic splash call under an FSDP-sharded batch. Called
    bare, the real TPU compiler refuses it; through dot_product_attention it runs in a shard_map."""
    devs = tpu_devices("v5e-4")
    mesh = _mesh(devs)
    sh = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    q = jax.ShapeDtypeStruct((4, 256, 4, 128), jnp.bfloat16, sharding=sh)

    def loss(fn):
        return jax.grad(lambda q, k, v: fn(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))

    # conftest asks for "highest" matmul precision (fp32 parity tests); Mosaic takes bf16 operands as they are
    with parallel.sharding_context(mesh), jax.default_matmul_precision("default"):
        with pytest.raises(NotImplementedError, match="shard_map"):
            jax.jit(loss(lambda q, k, v: attention._splash(q, k, v, attention.AttentionMask(), 128 ** -0.5))).lower(q, q, q).compile()
        compiled = jax.jit(loss(lambda q, k, v: attention.dot_product_attention(q, k, v, implementation="auto"))
                           ).lower(q, q, q).compile()
    text = compiled.as_text()
    assert "splash_mha_fwd" in text and "splash_mha_dkv" in text  # the real kernel, forward and backward


def test_vae_budget_and_decode_layout_follow_the_target():
    from animegamer_jax.models.cogvideox import vae_tiling
    from animegamer_jax.models.cogvideox.vae import VAEConfig

    cfg = VAEConfig(dtype="bfloat16", tile_size=-1)
    budget, src = vae_tiling.device_decode_budget(cfg, tpu_devices("v6e-1")[0])
    assert budget == 0.8 * 32 * 2**30 and "TPU v6 lite" in src
    assert vae_tiling.device_decode_budget(cfg, tpu_devices("v5e-4")[0])[0] == 0.8 * 16 * 2**30
    # the same latents tile on v5e (16 GiB) where a v5p (95 GiB) decodes them whole
    shape = (5, 60, 90)  # the paper's 17 frames at 480x720
    t_v5e = vae_tiling.resolve_decode_tiling(cfg, shape, device=tpu_devices("v5e-4")[0])
    t_v5p = vae_tiling.resolve_decode_tiling(cfg, shape, device=tpu_devices("v5p-8")[0])
    assert t_v5e[0] > 0 and "TPU v5 lite" in t_v5e[2], t_v5e
    assert t_v5p[0] == 0 and "untiled" in t_v5p[2] and "TPU v5 HBM" in t_v5p[2], t_v5p


@pytest.mark.slow
def test_mistral_decode_layers_follow_the_weights_devices():
    from flax import nnx

    from animegamer_jax.models.mistral import model as mistral_model

    cfg = mistral_model.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=8, decode_layers="auto")
    m = mistral_model.Mistral(cfg, rngs=nnx.Rngs(0))
    assert mistral_model.unstacked_layers(m) is not None  # weights on CPU devices: per-layer weights
    assert target.of_arrays([np.zeros(2)]).platform == "cpu"


def test_multislice_mesh_puts_data_across_slices():
    topo = target.parse_topology("v5e-4", num_slices=2)
    assert topo.num_devices == 8
    devs = tpu_devices("v5e-4") and target.compile_devices(topo)
    mesh = parallel.make_mesh((2, -1, 1, 1), devices=devs)
    assert [{d.slice_index for d in row.flat} for row in mesh.devices] == [{0}, {1}]


@pytest.mark.slow
def test_partitioned_kernel_equals_the_whole_call_on_4_devices():
    """attention._partitioned (the shard_map every splash / cuDNN call goes through) gives the
    unpartitioned result: batch over data, grouped heads over tensor, key padding, the hybrid mask's
    query block, a per-batch and a shared bias, and a mesh without logical rules."""
    import json

    from tests.subproc import run_python

    out = run_python("""
        import json, jax, jax.numpy as jnp
        from animegamer_jax import parallel
        from animegamer_jax.models import attention
        ks = jax.random.split(jax.random.PRNGKey(0), 5)
        q = jax.random.normal(ks[0], (4, 24, 4, 8)); k = jax.random.normal(ks[1], (4, 24, 2, 8))
        v = jax.random.normal(ks[2], (4, 24, 2, 8))
        valid = jnp.arange(24)[None] < jnp.array([24, 20, 17, 9])[:, None]
        masks = {"causal+padding": attention.causal_mask(kv_valid=valid),
                 "hybrid": attention.causal_mask(block_first=jnp.array([3, 5, 0, 9]), block_last=jnp.array([8, 12, 6, 20]))}
        biases = {"none": None, "per-batch": jax.random.normal(ks[3], (4, 4, 24, 24)),
                  "shared": jax.random.normal(ks[4], (1, 4, 24, 24))}
        dense = lambda q, k, v, b, m: attention._dense(q, k, v, b, m, 8 ** -0.5)
        mesh = parallel.make_mesh((2, 1, 2, 1))
        out = {}
        for mn, m in masks.items():
            for bn, b in biases.items():
                want = dense(q, k, v, b, m)
                for rules in ("rules", "no rules"):
                    ctx = parallel.sharding_context(mesh) if rules == "rules" else jax.set_mesh(mesh)
                    with ctx:
                        got = jax.jit(lambda q, k, v, b: attention._partitioned(dense, q, k, v, b, m))(q, k, v, b)
                    out[f"{mn}/{bn}/{rules}"] = float(jnp.max(jnp.abs(got - want)))
        print(json.dumps(out))
    """, devices=4)
    diffs = json.loads(out.strip().splitlines()[-1])
    assert len(diffs) == 12 and max(diffs.values()) < 1e-5, diffs


def test_arrays_and_remat_follow_the_target():
    from jax.sharding import NamedSharding

    from animegamer_jax.models import remat

    mesh = _mesh(tpu_devices("v5e-4"))
    weights = [jax.ShapeDtypeStruct((8, 8), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))]
    assert target.of_arrays(weights).platform == "tpu"  # Mistral's decode layout reads this: "scan" there
    assert target.of_arrays([jnp.zeros(2)]).platform == "cpu"
    with parallel.sharding_context(mesh):
        assert remat.checkpoint_policy("offload_dots") is not None  # a TPU target has
