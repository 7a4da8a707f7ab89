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
    config.dit.num_layers = 2
    dit = build_component("dit", config, nnx.Rngs(0))
    adapter = build_component("reference", config, nnx.Rngs(1))
    g_dit, s_dit = nnx.split(dit)
    nnx.update(adapter.lora, jax.tree.map(lambda a: a + 0.05, nnx.state(adapter.lora)))  # a trained-like adapter
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
    assert np.abs(other[1] - with_ref[1]).mean() > 1e-4
    with pytest.raises(ValueError, match="needs the reference adapter"):
        dit_sampler(g_dit, config)(p, rep, ml, keys, reference=ref)


def test_sampler_reference_drops_image_tokens_only_with_a_reference():
    """dit.reference_drops_image: a game with a reference is sampled from s_a's text tokens and the
    unconditional image tokens (exactly the keep-mode sampler given that rep); without one, unchanged."""
    from animegamer_jax.inference.clip_sampler import dit_sampler
    from animegamer_jax.models.registry import build_component
    from configs import tiny

    config = tiny.get_config()
    config.diffusion.num_sampling_steps = 2
    config.dit.num_layers = 1
    dit = build_component("dit", config, nnx.Rngs(0))
    adapter = build_component("reference", config, nnx.Rngs(1))
    nnx.update(adapter.lora, jax.tree.map(lambda a: a + 0.05, nnx.state(adapter.lora)))
    (g_dit, s_dit), (g_ref, s_ref) = nnx.split(dit), nnx.split(adapter)
    q, d, nt = dit.cfg.text_length, dit.cfg.hidden_size, config.rep.num_text_tokens
    assert 0 < nt < q
    rs = np.random.RandomState(0)
    rep = jnp.asarray(rs.randn(2, q, d), jnp.float32)
    uncond = jnp.asarray(rs.randn(q, d), jnp.float32)
    ml, keys = jnp.array([1, 4]), jax.random.split(jax.random.key(3), 2)
    ref = jnp.asarray(rs.randn(2, 1, config.dit.in_channels, config.dit.sample_height, config.dit.sample_width),
                      jnp.float32)
    p = {"dit": s_dit, "uncond": uncond, "reference": s_ref}
    keep = jax.jit(dit_sampler(g_dit, config, g_ref))
    assert config.dit.reference_drops_image is False  # the default: s_a as it is
    config.dit.reference_drops_image = True
    drop = jax.jit(dit_sampler(g_dit, config, g_ref))
    # without a reference: byte-identical to the default sampler
    assert np.array_equal(np.asarray(keep(p, rep, ml, keys)), np.asarray(drop(p, rep, ml, keys)))
    # with one: the keep-mode sampler given s_a's text tokens + uncond's image tokens
    swapped = jnp.concatenate([rep[:, :nt], jnp.broadcast_to(uncond[nt:], (2, q - nt, d))], axis=1)
    got = np.asarray(drop(p, rep, ml, keys, reference=ref))
    np.testing.assert_allclose(got, np.asarray(keep(p, swapped, ml, keys, reference=ref)), rtol=1e-5, atol=1e-5)
    assert np.abs(got - np.asarray(keep(p, rep, ml, keys, reference=ref))).mean() > 1e-4
    # the image tokens no longer matter, the text tokens still do
    other_image = rep.at[:, nt:].set(-rep[:, nt:])
    np.testing.assert_allclose(np.asarray(drop(p, other_image, ml, keys, reference=ref)), got, rtol=1e-5, atol=1e-5)
    other_text = rep.at[:, :nt].set(-rep[:, :nt])
    assert np.abs(np.asarray(drop(p, other_text, ml, keys, reference=ref)) - got).mean() > 1e-4


def test_phase_r_image_dropout_rate_and_condition(monkeypatch):
    """Phase r's f_v dropout: diffusion.image_dropout by default (and for configs without the keys),
    train.reference_image_dropout when >= 0, 1 with dit.reference_drops_image; at rate 1 every sample's
    image tokens are E_a's unconditional ones, at rate 0 none are."""
    import ml_collections

    from animegamer_jax.models.registry import build_component
    from animegamer_jax.train import losses
    from configs import tiny

    config = tiny.get_config()
    assert losses.reference_image_dropout(config) == config.diffusion.image_dropout == 0.05
    old = ml_collections.ConfigDict({"dit": {}, "train": {}, "diffusion": {"image_dropout": 0.2}})
    assert losses.reference_image_dropout(old) == 0.2
    config.train.reference_image_dropout = 0.5
    assert losses.reference_image_dropout(config) == 0.5
    config.train.reference_image_dropout = 0.0
    assert losses.reference_image_dropout(config) == 0.0
    config.dit.reference_drops_image = True
    assert losses.reference_image_dropout(config) == 1.0
    config.dit.reference_drops_image = False
    config.train.reference_image_dropout = 1.5
    with pytest.raises(ValueError, match="train.reference_image_dropout=1.5"):
        losses.reference_image_dropout(config)

    config.diffusion.text_dropout = config.diffusion.text_ucg_rate = 0.0
    enc = build_component("shot_encoder", config, nnx.Rngs(0))
    se = enc.cfg
    rs = np.random.RandomState(0)
    f_md = jnp.asarray(rs.randn(4, se.num_text_tokens, se.text_dim), jnp.float32)
    f_v = jnp.asarray(rs.randn(4, se.num_image_tokens, se.image_dim), jnp.float32)
    monkeypatch.setattr(losses, "encode_features", lambda model, batch: (f_md, f_v))
    model = type("M", (), {"shot_encoder": enc})()
    ks = jax.random.split(jax.random.key(0), 3)
    full = np.asarray(enc(f_md, f_v))
    unc = np.asarray(enc.uncond(4))
    s_a, _, drop_i = losses._ea_condition(model, {}, config, *ks, image_dropout=1.0)
    assert np.asarray(drop_i).all()
    nt = se.num_text_tokens
    np.testing.assert_allclose(np.asarray(s_a)[:, nt:], unc[:, nt:], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(s_a)[:, :nt], full[:, :nt], rtol=1e-6, atol=1e-6)
    assert np.abs(full[:, nt:] - unc[:, nt:]).mean() > 1e-2
    s_a, _, drop_i = losses._ea_condition(model, {}, config, *ks, image_dropout=0.0)
    assert not np.asarray(drop_i).any()
    np.testing.assert_allclose(np.asarray(s_a), full, rtol=1e-6, atol=1e-6)


def test_fingerprint_leaves_out_the_image_dropout_keys_only_at_their_defaults():
    from animegamer_jax.config import load_config
    from animegamer_jax.game.folder.fingerprint import game_fingerprint

    cfg = load_config("configs/tiny.py")
    old = load_config("configs/tiny.py")  # a config from before the keys: games keep their fingerprints
    del old.dit["reference_drops_image"], old.train["reference_image_dropout"]
    fp = lambda c: game_fingerprint(c, ["a"], 1, "sys")["sha256"]  # noqa: E731
    assert fp(cfg) == fp(old)
    cfg.dit.reference_drops_image = True
    assert fp(cfg) != fp(old)
    assert game_fingerprint(cfg, ["a"], 1, "sys")["parts"]["config"]["dit"]["reference_drops_image"] is True


def _r_config():
    from tests.train_helpers import phase_config
    cfg = phase_config("r")
    cfg.train.dit_trainable = "paper"
    return cfg


def _r_example(cfg, seed=0):
    from tests.train_helpers import loader_example
    ex = loader_example(cfg, "a2", seed=seed)
    rs = np.random.RandomState(seed + 1)
    ex["first_frame"] = rs.randint(0, 256, (2, cfg.data.height, cfg.data.width, 3)).astype(np.uint8)
    ex["characters"] = np.array(["Bunny", "Bunny"])
    return ex


def test_pick_reference_frames_pairs_other_clips_of_the_same_character():
    from animegamer_jax.data.batches import pick_reference_frames
    first = np.arange(5, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 3, 3), np.uint8)
    labels = np.array(["a", "b", "a", "c", "b"])
    got = pick_reference_frames({"first_frame": first, "characters": labels})[:, 0, 0, 0]
    np.testing.assert_array_equal(got, [2, 4, 0, 4, 1])  # same label when one exists, else the next clip
    np.testing.assert_array_equal(pick_reference_frames({"frames": first[:, None]})[:, 0, 0, 0], [1, 2, 3, 4, 0])
    np.testing.assert_array_equal(pick_reference_frames({"first_frame": first[:1]})[:, 0, 0, 0], [0])
    with pytest.raises(KeyError, match="first frame"):
        pick_reference_frames({"latents": first})


@pytest.mark.slow  # ~50 s on a loaded 2-core host (the step's compile)
@pytest.mark.parametrize("given", ["frame", pytest.param("latent", marks=pytest.mark.paper)])
def test_phase_r_step_trains_only_the_adapter(given, tmp_path):
    """Two phase-r steps: finite losses, only the adapter changes. "latent" hands the step a reference
    latent (fast); "frame" VAE-encodes the uint8 reference frame in the step (the tiny VAE's compile)."""
    from animegamer_jax.data import batches
    from animegamer_jax.train import phases
    from tests.train_helpers import train_phase

    cfg = _r_config()
    rec = phases.phase("r")
    assert rec.components_for(cfg) == ("shot_encoder", "dit", "vae", "reference") and rec.outputs == ("reference",)
    batch = batches.BatchBuilder(cfg, "reference")(_r_example(cfg))
    assert batch["reference_frame"].dtype == np.uint8 and batch["reference_frame"].shape == (2, 64, 96, 3)
    np.testing.assert_array_equal(batch["reference_frame"], _r_example(cfg)["first_frame"][[1, 0]])
    if given == "latent":
        lat = batch["latents"][:, :1]
        batch = {k: v for k, v in batch.items() if k != "reference_frame"}
        batch["reference_latent"] = lat[::-1].copy()
    res, changed = train_phase(cfg, batch, tmp_path)
    assert all(np.isfinite(v) for v in res.losses.values()) and len(res.losses) == 2
    assert changed and all(k.startswith("reference/") for k in changed), sorted(changed)[:5]
    assert any(k.endswith("type_embed") for k in changed) and any(k.endswith("q/lora_b") for k in changed)


def test_adapters_stored_with_flat_factor_names_load_unchanged(tmp_path):
    """Systems written before the reference and character LoRAs held `LoRAFactors` store their factors as
    `lora.q_a`, ... (checkpoints/tiny_system's reference among them): they load into today's
    `lora.q.lora_a`, ... with every array unchanged; a layout that is neither still fails naming today's keys."""
    from animegamer_jax import checkpoint
    from animegamer_jax.models.cogvideox.character import CharacterLoRAs, CharacterSpec
    from animegamer_jax.models.cogvideox.reference import flat_factor_keys, nested_factor_keys
    from animegamer_jax.models.registry import build_component
    from configs import tiny

    config = tiny.get_config()
    spec = CharacterSpec(("Ann", "Bo"), lora_rank=2, lora_alpha=2.0)
    build_chars = lambda c, r: CharacterLoRAs(c.dit, spec, rngs=r)  # noqa: E731
    made = {"reference": build_component("reference", config, nnx.Rngs(3)),
            "characters": build_chars(config, nnx.Rngs(4))}
    for m in made.values():  # every factor non-zero and distinct from its init
        nnx.update(m, jax.tree.map(lambda a: a + 0.25, nnx.state(m)))
    new = {n: checkpoint.pure_dict(m) for n, m in made.items()}
    old = {n: flat_factor_keys(p) for n, p in new.items()}
    assert sorted(old["reference"]["lora"]) == ["k_a", "k_b", "out_a", "out_b", "q_a", "q_b", "v_a", "v_b"]
    assert sorted(old["characters"]["loras"][1]) == sorted(old["reference"]["lora"])
    assert jax.tree.structure(nested_factor_keys(old["reference"])) == jax.tree.structure(new["reference"])
    for layout, stored in (("old", old), ("new", new)):
        d = checkpoint.save_system(str(tmp_path / layout), stored, config)
        loaded = checkpoint.load_system(d, builders={"characters": build_chars})
        for n in made:
            got = checkpoint.pure_dict(loaded[n])
            assert jax.tree.structure(got) == jax.tree.structure(new[n])
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(new[n])):
                assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    bad = dict(old["reference"], lora={k.upper(): v for k, v in old["reference"]["lora"].items()})
    d = checkpoint.save_system(str(tmp_path / "bad"), {"reference": bad}, config)
    with pytest.raises(checkpoint.SystemCheckpointError, match=r"missing keys \['lora/k/lora_a'"):
        checkpoint.load_system(d)
