"""Phase "vae" (the tiny 3D causal VAE as an autoencoder): loss falls, kill + resume == uninterrupted
with per-step random windows, curriculum and window rules, the conv path, and the PSNR eval helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from animegamer_jax import parallel
from animegamer_jax.eval import vae as vae_eval
from animegamer_jax.models.cogvideox import vae as cogvideox_vae
from animegamer_jax.data import batches
from animegamer_jax.train import loop, losses, model, phases
from configs import tiny
from tests.dataset_helpers import index_only_dataset

FAST = {"xla_backend_optimization_level": 0}


def _config():
    cfg = tiny.get_config()
    cfg.train.phase = "vae"
    # one level (no down / up sampling: those are covered by test_vae.py's parity tests) keeps the
    # compiles small; the loss, curriculum, windows and checkpointing are the real ones
    cfg.vae.block_out_channels, cfg.vae.temporal_compression_ratio = (4,), 1
    cfg.vae.latent_channels = 4
    cfg.train.learning_rate, cfg.train.warmup_steps = 3e-3, 1
    cfg.train.vae_curriculum = ((0, 1, 16, 24),)
    cfg.train.vae_windows_per_clip = 2
    return cfg


def _clips(n=2, t=17, h=24, w=32, seed=0):
    rs = np.random.RandomState(seed)
    # smooth-ish frames: a gradient plus noise, so a few steps make real progress
    base = np.linspace(0, 255, w)[None, None, None, :, None] * np.ones((n, t, h, w, 3))
    return {"frames": np.clip(base + rs.randint(0, 40, (n, t, h, w, 3)), 0, 255).astype(np.uint8)}


class _Data:
    """Endless iterator of the same loader batch (the builder's per-step windows vary it)."""

    def __init__(self):
        self.ex = _clips()

    def __iter__(self):
        return self

    def __next__(self):
        return self.ex


def _paths(state):
    return {"/".join(str(getattr(k, "key", k)) for k in p): np.asarray(v) for p, v in
            jax.tree_util.tree_flatten_with_path(state.to_pure_dict())[0]}


@pytest.mark.slow
def test_vae_phase_trains_and_resumes(tmp_path):
    cfg = _config()
    rec = phases.phase("vae")
    assert rec.components_for(cfg) == ("vae",) and rec.outputs == ("vae",)
    mesh = parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1])
    tr = model.phase_trainer(cfg, mesh, compiler_options=FAST)
    builder = batches.BatchBuilder(cfg, "vae")
    kw = dict(num_steps=8, global_batch_size=2, checkpoint_every=100, log_every=100, progress=False,
              batch_fn=builder)
    full = loop.fit(tr, _Data(), workdir=str(tmp_path / "full"), **kw)
    losses = list(full.losses.values())
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.02, losses
    killed = loop.fit(tr, _Data(), workdir=str(tmp_path / "run"), stop_after=3, **kw)
    resumed = loop.fit(tr, _Data(), workdir=str(tmp_path / "run"), **kw)
    assert resumed.start_step == 3 and {**killed.losses, **resumed.losses} == full.losses
    final = _paths(full.state[0])
    for k, v in _paths(resumed.state[0]).items():
        np.testing.assert_array_equal(v, final[k], err_msg=k)
    init = _paths(tr.init()[0])
    changed = {k for k in final if not np.array_equal(final[k], init[k])}
    assert any(k.startswith("vae/encoder/") for k in changed) and any(k.startswith("vae/decoder/") for k in changed)
    # eval.vae --train_workdir reads the newest checkpoint; under another config it says so in one line
    vae, step = vae_eval.vae_from_train_workdir(str(tmp_path / "full"), cfg)
    assert step == 8
    from flax import nnx
    got = {"vae/" + k: v for k, v in _paths(nnx.state(vae, nnx.Param)).items()}
    assert got.keys() == {k for k in final if k.startswith("vae/")}
    for k, v in got.items():
        np.testing.assert_array_equal(v, final[k], err_msg=k)
    other = _config()
    other.vae.block_out_channels = (8,)
    with pytest.raises(ValueError, match=r"step 8 does not match this --config \((Requested shape|.*not compatible)") as e:
        vae_eval.vae_from_train_workdir(str(tmp_path / "full"), other)
    assert len(str(e.value)) < 500


def test_vae_curriculum_and_windows():
    cur = ((0, 1, 64, 96), (3000, 9, 32, 48), (6000, 9, 64, 96))
    assert batches.vae_stage(cur, 0) == (1, 64, 96) and batches.vae_stage(cur, 2999) == (1, 64, 96)
    assert batches.vae_stage(cur, 3000) == (9, 32, 48) and batches.vae_stage(cur, 10 ** 6) == (9, 64, 96)
    for bad in ((), ((5, 1, 8, 8),), ((0, 1, 8, 8), (0, 9, 8, 8))):
        with pytest.raises(ValueError, match="vae_curriculum"):
            batches.vae_stage(bad, 0)
    ex = _clips(n=2, t=17, h=24, w=32)["frames"]
    w1 = batches.vae_windows(ex, 1, 16, 24, np.random.default_rng(0), max_windows=4)
    assert w1.shape == (8, 1, 16, 24, 3) and w1.dtype == np.uint8
    w9 = batches.vae_windows(ex, 9, 24, 32, np.random.default_rng(0), max_windows=4)
    assert w9.shape == (2, 9, 24, 32, 3)  # 17 // 9 = 1 window per clip
    # every window is a (possibly mirrored) crop of its clip
    clip0 = ex[0]
    win = w9[0]
    found = [(t0, f) for t0 in range(0, 9) for f in (False, True)
             if np.array_equal(win, clip0[t0:t0 + 9, :, ::-1] if f else clip0[t0:t0 + 9])]
    assert found, "window is not a crop of the clip"
    with pytest.raises(ValueError, match="larger than the clips"):
        batches.vae_windows(ex, 1, 48, 32, np.random.default_rng(0))
    # the builder's windows depend only on (seed, step): a resumed run rebuilds the same batches
    cfg = _config()
    b = batches.BatchBuilder(cfg, "vae")
    np.testing.assert_array_equal(b({"frames": ex}, step=7)["frames"], b({"frames": ex}, step=7)["frames"])
    assert not np.array_equal(b({"frames": ex}, step=7)["frames"], b({"frames": ex}, step=8)["frames"])
    assert losses.vae_decode_plan(1) == (1,) and losses.vae_decode_plan(3) == (3,) and losses.vae_decode_plan(5) == (3, 2)
    with pytest.raises(ValueError, match="2 latent frames"):
        losses.vae_decode_plan(2)


def test_vae_windows_multi_scale_crops():
    """train.vae_max_crop_scale: crops of 1x..2x the window, area-resized to it; 1 = plain crops."""
    from animegamer_jax.data import video

    rs = np.random.RandomState(1)
    ex = rs.randint(0, 256, (2, 2, 32, 48, 3)).astype(np.uint8)
    def before(frames, num_frames, height, width, rng, n):  # vae_windows before max_scale (commit 542e374)
        out = []
        for i in range(frames.shape[0]):
            for _ in range(n):
                t0, y0, x0 = (int(rng.integers(0, d + 1)) for d in
                              (frames.shape[1] - num_frames, frames.shape[2] - height, frames.shape[3] - width))
                win = frames[i, t0:t0 + num_frames, y0:y0 + height, x0:x0 + width]
                out.append(win[:, :, ::-1] if rng.random() < 0.5 else win)
        return np.stack(out)

    plain = batches.vae_windows(ex, 1, 16, 24, np.random.default_rng(3), max_windows=4, max_scale=1.0)
    np.testing.assert_array_equal(plain, before(ex, 1, 16, 24, np.random.default_rng(3), 2))  # a resume stays exact
    # clips exactly 2x the window: max_scale 2 reaches whole frames; every window is some crop of its
    # clip frame (a scale in [1, 2]), area-resized to 16x24 and maybe mirrored
    win = batches.vae_windows(ex, 1, 16, 24, np.random.default_rng(5), max_windows=4, max_scale=2.0)
    assert win.shape == (4, 1, 16, 24, 3) and win.dtype == np.uint8
    scales = []
    for k in range(4):  # 2 windows per 2-frame clip
        clip = ex[k // 2]
        best = None
        for ch, cw in [(ch, cw) for ch in range(16, 33) for cw in range(24, 49) if abs(cw - 1.5 * ch) <= 1.0]:
            for t0 in range(2):
                for y0 in range(0, 32 - ch + 1):
                    for x0 in range(0, 48 - cw + 1):
                        crop = video.resize_to(np.ascontiguousarray(clip[t0, y0:y0 + ch, x0:x0 + cw]), 24, 16)
                        for f in (crop, crop[:, ::-1]):
                            if np.array_equal(f, win[k, 0]):
                                best = ch / 16
                                break
                        if best:
                            break
                    if best:
                        break
                if best:
                    break
            if best:
                break
        assert best is not None, f"window {k} is no resized crop of its clip"
        scales.append(best)
    assert len(set(scales)) > 1 and max(scales) > 1.0, scales  # several scales, not only plain crops
    with pytest.raises(ValueError, match="vae_max_crop_scale"):
        batches.vae_windows(ex, 1, 16, 24, np.random.default_rng(0), max_scale=0.5)


def test_conv3d_as_2d_matches_native_3d_conv():
    rs = np.random.RandomState(0)
    x = jnp.asarray(rs.randn(2, 5, 6, 7, 3).astype(np.float32))
    for kt, pad in ((3, 1), (1, 0)):
        k = jnp.asarray(rs.randn(kt, 2 * pad + 1, 2 * pad + 1, 3, 4).astype(np.float32))
        ref = jax.lax.conv_general_dilated(x, k, (1, 1, 1), ((0, 0), (pad, pad), (pad, pad)),
                                           dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
        np.testing.assert_allclose(np.asarray(cogvideox_vae.conv3d_as_2d(x, k, pad)), np.asarray(ref),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_causal_conv_single_frame_shortcut_matches_padded_path():
    from flax import nnx

    conv = cogvideox_vae.CausalConv3d(3, 4, 3, dtype=jnp.float32, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.RandomState(1).randn(2, 1, 5, 6, 3).astype(np.float32))
    y, cache = conv(x)
    xp = jnp.concatenate([x, x, x], axis=1)  # the general path's replicated front padding
    np.testing.assert_allclose(np.asarray(y), np.asarray(conv.conv(xp)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(cache), np.asarray(xp[:, -2:]))


def test_psnr_eval_helpers():
    idx = np.array([0, 1, 2, 3, 4, 10, 11, 12, 20])
    assert vae_eval.runs(idx, 2) == [slice(0, 2), slice(2, 4), slice(5, 7)]
    assert vae_eval.runs(idx, 1) == [slice(i, i + 1) for i in range(9)]
    a = np.zeros((4, 4))
    assert vae_eval.psnr(a, a + 0.1) == pytest.approx(20.0)


def test_eval_dataset_must_cut_the_training_segments(tmp_path):
    """configs/tiny.py trains the VAE on 128x192 clips and scores on the same clips at 64x96: eval.vae
    refuses a scoring set whose clip segments differ (its "held-out" frames could be training frames)."""
    def dataset(name, clips, h):
        return index_only_dataset(tmp_path / name, [{"film_id": "f", "start_time": a, "end_time": b} for a, b in clips],
                                  config={"height": h, "width": h * 3 // 2})

    big = dataset("big", [(0.0, 2.0), (2.0, 4.0)], 128)
    vae_eval.check_same_segments(big, dataset("same", [(2.0, 4.0), (0.0, 2.0)], 64))
    with pytest.raises(ValueError, match=r"cut different clip segments .*\('f', 3.0, 5.0\)"):
        vae_eval.check_same_segments(big, dataset("other", [(0.0, 2.0), (3.0, 5.0)], 64))


def test_pipeline_config_errors(tmp_path):
    from animegamer_jax.train import pipeline

    cfg = tiny.get_config()
    assert cfg.train.pipeline[0] == "vae" and len(cfg.train.pipeline_steps) == len(cfg.train.pipeline)
    cfg.train.pipeline = ("vae", "z")
    with pytest.raises(ValueError, match="unknown phases"):
        pipeline.run_all(cfg, str(tmp_path))
    cfg.train.pipeline, cfg.train.pipeline_steps = ("vae", "a1"), (1, 2, 3)
    with pytest.raises(ValueError, match="pipeline_steps"):
        pipeline.run_all(cfg, str(tmp_path))
    cfg.train.pipeline_steps, cfg.train.pipeline_learning_rates = (), (1e-3,)
    with pytest.raises(ValueError, match="pipeline_learning_rates"):
        pipeline.run_all(cfg, str(tmp_path))


@pytest.mark.slow
def test_run_phase_writes_vae_system_with_fitted_latent_scale(tmp_path):
    from animegamer_jax import checkpoint
    from animegamer_jax.train import pipeline

    cfg = _config()
    cfg.train.num_steps, cfg.train.checkpoint_every, cfg.train.progress = 1, 100, False
    seen = []
    fit = losses.latent_scaling_factor

    def spy(vae, batches):
        seen.append(fit(vae, batches))
        return seen[-1]

    losses.latent_scaling_factor = spy
    try:
        out = pipeline.run_phase(cfg, str(tmp_path / "run"), system_out=str(tmp_path / "system"), data=_Data(),
                                 compiler_options=FAST)
    finally:
        losses.latent_scaling_factor = fit
    assert checkpoint.read_manifest(out)["components"] == ["vae"]
    assert len(seen) == 1 and np.isfinite(seen[0]) and seen[0] > 0
    assert checkpoint.load_config(out).vae.scaling_factor == pytest.approx(seen[0])


def test_latent_scaling_factor_is_inverse_latent_std():
    from flax import nnx

    class Doubler(nnx.Module):
        def encode(self, x):
            return cogvideox_vae.DiagonalGaussian(2.0 * x, jnp.zeros_like(x))

    rs = np.random.RandomState(0)
    batches = [{"frames": rs.randn(2, 1, 4, 4, 3).astype(np.float32)} for _ in range(3)]
    expect = 1.0 / np.std(np.concatenate([2.0 * b["frames"].ravel() for b in batches]))
    assert losses.latent_scaling_factor(Doubler(), batches) == pytest.approx(expect, rel=1e-5)
    with pytest.raises(ValueError, match="latent std"):
        losses.latent_scaling_factor(Doubler(), [{"frames": np.zeros((1, 1, 2, 2, 3), np.float32)}])
