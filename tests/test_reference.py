"""Reference conditioning (training phase r): the DiT's reference adapter, the sampler's reference
input, phase r's step and batches, at toy sizes (docs/dit.md#reference-conditioning)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from animegamer_jax.models.cogvideox.dit import CogVideoXDiT, DiTConfig
from animegamer_jax.models.cogvideox.reference import ReferenceAdapter, ReferenceConfig

CFG = DiTConfig(hidden_size=32, num_layers=2, num_heads=2, head_dim=16, time_embed_dim=16, in_channels=4,
                out_channels=4, text_length=8, lora_rank=2)
RCFG = ReferenceConfig(hidden_size=32, num_layers=2, num_heads=2, head_dim=16, lora_rank=2, lora_alpha=2.0)


def _inputs(seed=0, b=2):
    rs = np.random.RandomState(seed)
    x = jnp.asarray(rs.randn(b, 2, 4, 8, 12), jnp.float32)
    cond = jnp.asarray(rs.randn(b, 8, 32), jnp.float32)
    ref = jnp.asarray(rs.randn(b, 1, 4, 8, 12), jnp.float32)
    return x, cond, jnp.array([999, 37]), jnp.array([2.5, 10.0]), ref


def _call(dit, *args, **kw):
    return np.asarray(nnx.jit(lambda m, *a: m(*a, **kw))(dit, *args))


def test_no_reference_is_the_plain_dit_with_or_without_adapter():
    dit = CogVideoXDiT(CFG, rngs=nnx.Rngs(0))
    adapter = ReferenceAdapter(RCFG, rngs=nnx.Rngs(1))
    # move the adapter's zero-initialized B factors, so "no effect" cannot come from zeros
    nnx.update(adapter, jax.tree.map(lambda a: a + 0.3, nnx.state(adapter)))
    x, cond, t, flow, _ = _inputs()
    plain = _call(dit, x, cond, t, flow)
    with_adapter = np.asarray(nnx.jit(lambda m, a, *args: m(*args, reference=None, adapter=a))(
        dit, adapter, x, cond, t, flow))
    assert np.array_equal(plain, with_adapter)
    # the same program: the adapter is not traced into the no-reference call
    j0 = str(jax.make_jaxpr(lambda *a: dit(*a))(x, cond, t, flow))
    j1 = str(jax.make_jaxpr(lambda *a: dit(*a, reference=None, adapter=adapter))(x, cond, t, flow))
    assert j0 == j1


def test_reference_changes_output_and_output_depends_on_it():
    dit = CogVideoXDiT(CFG, rngs=nnx.Rngs(0))
    adapter = ReferenceAdapter(RCFG, rngs=nnx.Rngs(1))
    x, cond, t, flow, ref = _inputs()
    run = nnx.jit(lambda m, a, r: m(x, cond, t, flow, reference=r, adapter=a))
    plain = _call(dit, x, cond, t, flow)
    out1 = np.asarray(run(dit, adapter, ref))
    out2 = np.asarray(run(dit, adapter, ref * -1.0 + 0.5))
    assert out1.shape == plain.shape == x.shape
    assert np.abs(out1 - plain).mean() > 1e-3
    assert np.abs(out1 - out2).mean() > 1e-3
    # per sample: sample 0's output does not depend on sample 1's reference
    ref_b = ref.at[1].set(ref[1] * 2.0)
    out3 = np.asarray(run(dit, adapter, ref_b))
    np.testing.assert_allclose(out3[0], out1[0], rtol=1e-5, atol=1e-5)
    assert np.abs(out3[1] - out1[1]).mean() > 1e-3
    # the adapter's LoRA acts (B factors moved off zero change the output)
    moved = ReferenceAdapter(RCFG, rngs=nnx.Rngs(1))
    nnx.update(moved.lora, jax.tree.map(lambda a: a + 0.1, nnx.state(moved.lora)))
    assert np.abs(np.asarray(run(dit, moved, ref)) - out1).mean() > 1e-4


def test_reference_errors():
    dit = CogVideoXDiT(CFG, rngs=nnx.Rngs(0))
    adapter = ReferenceAdapter(RCFG, rngs=nnx.Rngs(1))
    x, cond, t, flow, ref = _inputs()
    with pytest.raises(ValueError, match="without the reference adapter"):
        dit(x, cond, t, flow, reference=ref)
    with pytest.raises(ValueError, match="one latent frame"):
        dit(x, cond, t, flow, reference=ref[:, :, :, :4], adapter=adapter)


def test_sampler_threads_the_reference_and_is_unchanged_without_it():
    from animegamer_jax.inference.clip_sampler import dit_sampler
    from animegamer_jax.models.registry import build_component
    from configs import tiny

    config = tiny.get_config()
    config.diffusion.num_sampling_steps = 2
    dit = build_component("dit", config, nnx.Rngs(0))
    adapter = build_component("reference", config, nnx.Rngs(1))
    g_dit, s_dit = nnx.split(dit)
    g_ref, s_ref = nnx.split(adapter)
    q, d = dit.cfg.text_length, dit.cfg.hidden_size
    rs = np.random.RandomState(0)
    rep = jnp.asarray(rs.randn(2, q, d), jnp.float32)
    ml, keys = jnp.array([1, 4]), jax.random.split(jax.random.key(3), 2)
    lat = (config.dit.in_channels, config.dit.sample_height, config.dit.sample_width)
    ref = jnp.asarray(rs.randn(2, 1, *lat), jnp.float32)
    p = {"dit": s_dit, "uncond": jnp.zeros((q, d), jnp.float32)}
    old = np.asarray(jax.jit(dit_sampler(g_dit, config))(p, rep, ml, keys))
    new = jax.jit(dit_sampler(g_dit, config, g_ref))
    pr = {**p, "reference": s_ref}
    assert np.array_equal(old, np.asarray(new(pr, rep, ml, keys)))
    with_ref = np.asarray(new(pr, rep, ml, keys, reference=ref))
    assert with_ref.shape == old.shape and np.isfinite(with_ref).all()
    assert np.abs(with_ref - old).mean() > 1e-3
    # a game's clip depends on its own reference only
    other = np.asarray(new(pr, rep, ml, keys, reference=ref.at[1].set(-ref[1])))
    np.testing.assert_allclose(other[0], with_ref[0], rtol=1e-5, atol=1e-5)
    assert np.abs(other[1] - with_ref[1]).mean() > 1e-3
    with pytest.raises(ValueError, match="needs the reference adapter"):
        dit_sampler(g_dit, config)(p, rep, ml, keys, reference=ref)
