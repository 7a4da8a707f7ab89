"""The preview decoder (models/cogvideox/preview.py) and its training phase."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from animegamer_jax.models.cogvideox import preview


def _tiny_config():
    from configs import tiny
    cfg = tiny.get_config()
    cfg.train.phase = "preview"
    cfg.train.global_batch_size = 2
    return cfg


def test_shapes_frame_mapping_and_causality():
    cfg = preview.PreviewConfig.from_config(_tiny_config())
    assert cfg.channels == (8, 8, 8, 8) and cfg.spatial_factor == 8 and cfg.temporal_factor == 4
    assert 5_000 < preview.count_params(cfg) < 20_000
    m = preview.PreviewDecoder(cfg, rngs=nnx.Rngs(0))
    run = nnx.jit(lambda m, z: m(z))
    z = jax.random.normal(jax.random.key(1), (1, 3, 16, 4, 6))
    y = np.asarray(run(m, z))
    assert y.shape == (1, 9, 32, 48, 3) and preview.num_frames(3) == 9 and preview.num_frames(5) == 17
    assert y.min() >= -1.0 and y.max() <= 1.0 and y.std() > 0
    # latent 2 decodes to frames 5..8: the frames before stay as they were
    y2 = np.asarray(run(m, z.at[:, 2].add(1.0)))
    np.testing.assert_array_equal(y2[:, :5], y[:, :5])
    assert not np.array_equal(y2[:, 5:], y[:, 5:])


def test_config_errors():
    c = _tiny_config()
    c.preview.channels = (8, 8)
    with pytest.raises(ValueError, match="preview.channels"):
        preview.PreviewConfig.from_config(c)
    del c["preview"]
    with pytest.raises(ValueError, match="no 'preview' section"):
        preview.PreviewConfig.from_config(c)


@pytest.mark.slow  # ~25 s on a loaded 2-core host (the step's compile)
def test_phase_preview_steps_train_only_the_preview(tmp_path):
    """Two phase-preview steps on 1-frame 16x24 clips: finite losses, only ``preview`` changes."""
    from animegamer_jax.data import batches
    from animegamer_jax.train import phases
    from tests.train_helpers import train_phase

    cfg = _tiny_config()
    rec = phases.phase("preview")
    assert rec.components_for(cfg) == ("vae", "preview") and rec.outputs == ("preview",)
    frames = np.random.default_rng(0).integers(0, 256, (2, 1, 16, 24, 3), dtype=np.uint8)
    batch = batches.BatchBuilder(cfg, "frames")({"frames": frames})
    assert set(batch) == {"frames"} and batch["frames"].dtype == np.float32
    res, changed = train_phase(cfg, batch, tmp_path)
    assert all(np.isfinite(v) for v in res.losses.values()) and len(res.losses) == 2
    assert changed and all(k.startswith("preview/") for k in changed), sorted(changed)[:5]
    assert any(k.startswith("preview/conv_out") for k in changed)


@pytest.mark.slow  # ~17 s: the tiny VAE run eagerly
def test_loss_is_zero_for_the_teacher_itself():
    """The distillation target is the frozen VAE's decode of its own posterior-mean latents: a preview
    that returned exactly that would score loss 0 (checked by swapping in the teacher)."""
    from animegamer_jax.train import losses, model

    cfg = _tiny_config()
    tm = model.TrainModel(model.training_config(cfg), ("vae", "preview"), rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (1, 1, 16, 24, 3)), jnp.float32)
    scale = float(cfg.vae.scaling_factor)

    class Teacher:
        def __call__(self, z):
            return jnp.clip(tm.vae.decode(z / scale, losses.vae_decode_plan(z.shape[1])), -1, 1)

    loss, m = losses.preview_loss(tm, {"frames": x}, jax.random.key(0), cfg)
    assert float(loss) > 0 and np.isfinite(float(m["psnr"]))
    tm.preview = Teacher()
    loss0, m0 = losses.preview_loss(tm, {"frames": x}, jax.random.key(0), cfg)
    assert float(loss0) == 0.0 and float(m0["psnr"]) == pytest.approx(106.02, abs=0.01)  # the 1e-10 floor


def _engines():
    """Stand-in engines with a preview decoder (half the stand-in's frames) in each game.decoder mode."""
    from animegamer_jax.config import load_config
    from animegamer_jax.game.engine import GameEngine
    from animegamer_jax.inference.standin_model import StandinTurnModel

    cfg = load_config("configs/tiny.py")
    base = StandinTurnModel(cfg)
    sysm = StandinTurnModel(cfg)
    sysm.preview = lambda p, z: base.decode(p, z) * 0.5
    out = {}
    for mode in ("full", "preview", "preview_then_full"):
        c = load_config("configs/tiny.py")
        c.game.decoder = mode
        out[mode] = GameEngine(c, sysm)
    return base, out


@pytest.mark.slow
def test_engine_decoder_modes():
    from animegamer_jax.config import load_config
    from animegamer_jax.game.engine import GameEngine

    base, engines = _engines()
    results = {}
    for mode, eng in engines.items():
        calls = []
        run = eng.new_run()
        ids = [[1, 2, 3]]
        out = eng.step([run], [7], ids, [0], on_frames=lambda s, f: calls.append((s, np.asarray(f).copy())))
        results[mode] = (out, calls)
    full, pre, both = (results[m] for m in ("full", "preview", "preview_then_full"))
    assert "preview_s" not in full[0][3] and "preview_s" in both[0][3] and "preview_s" in pre[0][3]
    np.testing.assert_array_equal(both[0][2], full[0][2])  # the clip is the VAE's
    np.testing.assert_allclose(pre[0][2], full[0][2] * 0.5)
    # preview_then_full: the preview's whole clip first, then the VAE's from frame 0
    assert both[1][0][0] == 0 and both[1][0][1].shape == full[0][2].shape
    np.testing.assert_allclose(both[1][0][1], full[0][2] * 0.5)
    assert len(both[1]) == len(full[1]) + 1 and both[1][1][0] == 0
    assert len(pre[1]) == 1
    cfg = load_config("configs/tiny.py")
    cfg.game.decoder = "preview"
    with pytest.raises(ValueError, match="no preview|preview decoder"):
        GameEngine(cfg, base)


def test_no_preview_component_is_one_line(tmp_path):
    from animegamer_jax.config import ConfigError, load_config, validate
    from animegamer_jax.game.loading import CheckpointError, resolve_system
    from tests.checkpoint_helpers import system_without

    noprev = system_without("checkpoints/tiny_system", str(tmp_path / "noprev"), ("preview",))
    cfg = load_config("configs/tiny.py")
    cfg.game.decoder = "preview"
    with pytest.raises(CheckpointError, match="no preview decoder.*phase preview.*decoder=full"):
        resolve_system(cfg, noprev)
    with pytest.raises(CheckpointError, match="stand-in has no preview decoder"):
        resolve_system(cfg, standin=True)
    cfg.game.decoder = "fast"
    with pytest.raises(ConfigError, match="game.decoder='fast'"):
        validate(cfg)


def test_fingerprint_leaves_out_the_preview_keys_only_while_unused():
    from animegamer_jax.config import load_config
    from animegamer_jax.game.folder.fingerprint import game_fingerprint

    cfg = load_config("configs/tiny.py")
    old = load_config("configs/tiny.py")  # a config from before the preview decoder
    del old["preview"], old.game["decoder"], old.train["preview_real_weight"]
    fp = lambda c: game_fingerprint(c, ["a"], 1, "sys")["sha256"]  # noqa: E731
    assert fp(cfg) == fp(old)
    cfg.game.decoder = "preview"
    assert fp(cfg) != fp(old) and game_fingerprint(cfg, ["a"], 1, "sys")["parts"]["config"]["preview"]
