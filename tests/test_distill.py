"""Few-step sampling (issue 32): the student's sampler against its formula, its guidance-scale
embedding, the distillation target, and play with a checkpoint holding a student (eval.decoder with
the shipped student: tests/test_eval_decoder.py).
Phase d's train + exact resume is tests/test_train_model.py's ``test_phase_trains_and_resumes[d]``."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from animegamer_jax.diffusion import guidance, samplers
from animegamer_jax.diffusion.schedules import DiffusionSchedule
from animegamer_jax.models.registry import COMPONENT_BUILDERS, COMPONENTS
from configs import tiny


def test_student_timesteps():
    s = DiffusionSchedule()
    assert samplers.student_timesteps(4, 50, s).tolist() == [999, 759, 499, 259]
    assert samplers.student_timesteps(1, 50, s).tolist() == [999]
    assert samplers.student_timesteps(8, 50, s).tolist() == [999, 879, 759, 639, 499, 379, 259, 139]
    assert samplers.student_timesteps(50, 50, s).tolist() == s.sampling_timesteps(50).tolist()
    for bad in (0, 51):
        with pytest.raises(ValueError, match="student steps must be in 1..50"):
            samplers.student_timesteps(bad, 50, s)


def test_student_sampler_update_equals_its_formula():
    """A toy linear denoiser: every step D = a x - sqrt(1-a^2) v, x <- a' D + sqrt(1-a'^2) xi, the
    last returns D; computed here in float64 numpy from the training table."""
    sched = DiffusionSchedule()
    tau = samplers.student_timesteps(4, 50, sched)
    rs = np.random.RandomState(0)
    x0 = rs.randn(2, 3, 4).astype(np.float32)
    xi = rs.randn(4, 2, 3, 4).astype(np.float32)
    w = np.array([0.5, 2.0], np.float32)

    def denoise(x, t, c):  # depends on x, the timestep and the conditioning (guidance)
        return 0.3 * x + 1e-3 * t.astype(jnp.float32)[:, None, None] * c["guidance"][:, None, None]

    got = jax.jit(lambda x, n: samplers.sample_student(denoise, x, {"guidance": jnp.asarray(w)}, None, tau, sched,
                                                       step_noise=n))(x0, xi)
    a_tab = sched.train_a()
    x = x0.astype(np.float64)
    for j, t in enumerate(tau):
        a = a_tab[t]
        v = 0.3 * x + 1e-3 * t * w[:, None, None]
        d = a * x - np.sqrt(1 - a * a) * v
        a1 = a_tab[tau[j + 1]] if j + 1 < len(tau) else 1.0
        x = a1 * d + np.sqrt(1 - a1 * a1) * xi[j]
    np.testing.assert_allclose(np.asarray(got), x, rtol=2e-5, atol=2e-5)
    assert float(np.abs(x - x0).max()) > 0.1  # the steps did something
    with pytest.raises(ValueError, match="step_noise has shape"):
        samplers.sample_student(denoise, x0, {"guidance": w}, None, tau, sched, step_noise=xi[:3])


def test_cfg_scales_of_equals_dynamic_cfg_scales():
    tau = DiffusionSchedule().sampling_timesteps(50)
    for schedule in guidance.CFG_SCHEDULES:
        got = np.asarray(guidance.cfg_scales_of(np.array([6.0, 1.5]), 50, tau, 5.0, schedule))
        for row, w in zip(got, (6.0, 1.5)):
            np.testing.assert_allclose(row, guidance.dynamic_cfg_scales(50, tau, w, 5.0, schedule), rtol=1e-6)


def _student_from(teacher, cfg):
    student = COMPONENT_BUILDERS["student"](cfg, nnx.Rngs(5))
    state = nnx.state(student, nnx.Param)
    pure = state.to_pure_dict()
    pure.update({k: v for k, v in nnx.state(teacher, nnx.Param).to_pure_dict().items() if k in pure})
    state.replace_by_pure_dict(pure)
    nnx.update(student, state)
    return student


@pytest.mark.slow
def test_guidance_embedding_starts_at_zero_and_is_an_input():
    cfg = tiny.get_config()
    teacher = COMPONENT_BUILDERS["dit"](cfg, nnx.Rngs(1))
    student = _student_from(teacher, cfg)
    assert "student" in COMPONENT_BUILDERS and "student" not in COMPONENTS  # optional in a system
    rs = np.random.RandomState(0)
    x = jnp.asarray(rs.randn(2, cfg.dit.num_latent_frames, 16, cfg.dit.sample_height, cfg.dit.sample_width),
                    jnp.float32)
    cond = jnp.asarray(rs.randn(2, cfg.dit.text_length, cfg.dit.hidden_size), jnp.float32)
    t, flow = jnp.array([999, 259]), jnp.array([0.5, 10.0])
    want = teacher(x, cond, t, flow)
    for w in (0.0, 1.0, 7.5):  # zero-initialized: a student copied from the teacher is the teacher
        np.testing.assert_array_equal(np.asarray(student(x, cond, t, flow, jnp.full((2,), w))), np.asarray(want))
    with pytest.raises(ValueError, match="without use_guidance"):
        teacher(x, cond, t, flow, jnp.ones((2,)))
    # once trained (here: every weight of the embedding moved off zero), the scale changes the output
    leaves = nnx.state(student.guidance_embed, nnx.Param)
    nnx.update(student.guidance_embed, jax.tree.map(lambda a: a + 0.05, leaves))
    a, b = student(x, cond, t, flow, jnp.full((2,), 1.0)), student(x, cond, t, flow, jnp.full((2,), 6.0))
    assert float(jnp.abs(a - b).max()) > 1e-4


@pytest.mark.slow
def test_distill_target_at_the_grid_end_is_the_teacher():
    """One grid point (its last): the target is the teacher's guided D; with w = 0 (s = 1) that is the
    conditional D, which a student copied from the teacher predicts exactly: loss 0. With two points
    the first's target is the student after one DDIM step of the teacher: not 0."""
    from animegamer_jax.train import losses, model

    cfg = tiny.get_config()
    cfg.train.precomputed_features, cfg.train.encode_latents = True, False
    cfg.train.distill_cfg_scales = (0.0, 0.0)
    m = model.TrainModel(model.training_config(cfg), ("shot_encoder", "dit", "student"), rngs=nnx.Rngs(0))
    m.student = _student_from(m.dit, cfg)
    rs = np.random.RandomState(0)
    batch = {"flow": jnp.array([0.5, 15.0]),
             "f_md": jnp.asarray(rs.randn(2, cfg.t5.max_length, cfg.t5.d_model), jnp.float32),
             "f_v": jnp.asarray(rs.randn(2, cfg.rep.num_image_tokens, cfg.clip.vision_width), jnp.float32),
             "latents": jnp.asarray(rs.randn(2, 2, 16, cfg.dit.sample_height, cfg.dit.sample_width), jnp.float32)}
    cfg.diffusion.student_grid_steps = 1
    loss, met = losses.distill_loss(m, batch, jax.random.key(0), cfg)
    assert float(loss) < 1e-10 and float(met["teacher_gap"]) < 1e-10 and float(met["cfg_scale"]) == 0.0
    cfg.diffusion.student_grid_steps = 2
    losses_2 = [float(losses.distill_loss(m, batch, jax.random.key(k), cfg)[0]) for k in range(6)]
    assert max(losses_2) > 1e-6 and min(losses_2) < 1e-10, losses_2  # some draws hit point 0, some point 1


@pytest.fixture(scope="module")
def student_checkpoint(tmp_path_factory):
    """A random tiny system with a student (copied from its DiT), saved with save_system."""
    from animegamer_jax.checkpoint import save_system

    cfg = tiny.get_config()

    @jax.jit
    def init():
        mods = {n: COMPONENT_BUILDERS[n](cfg, nnx.Rngs(i)) for i, n in
                enumerate(("mllm", "dit", "shot_encoder", "vae", "t5", "clip"))}
        return {k: nnx.split(v) for k, v in mods.items()}

    comps = {k: nnx.merge(g, s) for k, (g, s) in init().items()}
    comps["student"] = _student_from(comps["dit"], cfg)
    root = tmp_path_factory.mktemp("student")
    without = save_system(str(root / "teacher_only"), {k: v for k, v in comps.items() if k != "student"}, cfg)
    return save_system(str(root / "sys"), comps, cfg), without


@pytest.mark.slow
def test_play_with_the_student_end_to_end(student_checkpoint, tmp_path, capsys):
    from animegamer_jax.commands import play

    ckpt, without = student_checkpoint
    script = tmp_path / "g.txt"
    script.write_text("Character: Bunny; Motion: steadily crawl; Background: grass\n"
                      "Character: Bunny; Motion: quickly run; Background: forest\n")
    out = tmp_path / "o"
    flags = ["--checkpoint", ckpt, "--out", str(out), "--config.diffusion.sampler=student"]
    assert play.main([str(script), *flags, "--config.diffusion.num_sampling_steps=2"]) == 0
    text = capsys.readouterr().out
    assert "few-step student, 2 step(s)" in text
    rec = json.load(open(out / "g" / "game.json"))
    assert len(rec["turns"]) == 2 and os.path.getsize(out / "g" / "turn_001.mp4") > 0
    # 1 step differs from 2 (another sampler run), the teacher path is untouched
    assert play.main([str(script), *flags, "--config.diffusion.num_sampling_steps=1", "--game-id", "one"]) == 0
    assert open(out / "one" / "turn_000.mp4", "rb").read() != open(out / "g" / "turn_000.mp4", "rb").read()
    capsys.readouterr()
    assert play.main([str(script), "--checkpoint", without, "--out", str(out), "--game-id", "x",
                      "--config.diffusion.sampler=student"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no few-step student" in err[0] and "--config.train.phase=d" in err[0]
