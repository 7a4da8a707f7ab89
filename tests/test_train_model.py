"""The training phases a1, a2, b, c and d at the tiny config: loss goes down, kill + resume == uninterrupted,
trainable sets, batch building, and phase (b) across two jax.distributed processes."""

import os

import jax
import numpy as np
import pytest

from animegamer_jax import parallel
from animegamer_jax.data import batches
from animegamer_jax.models.mistral.mllm import num_queries
from animegamer_jax.train import loop, model, optim, phases
from tests.subproc import WORKER_JOIN, WORKER_REPORT, agreed_losses, run_processes
from tests.train_helpers import SETUP, loader_example, phase_batch, phase_config

FAST = {"xla_backend_optimization_level": 0}  # CPU compiles ~4x faster; these steps are tiny anyway


def _paths(state):
    return {"/".join(str(getattr(k, "key", k)) for k in p): np.asarray(v) for p, v in
            jax.tree_util.tree_flatten_with_path(state.to_pure_dict())[0]}


@pytest.mark.parametrize("phase", ["a1", "a2", "b", "c", "d"])
@pytest.mark.slow
def test_phase_trains_and_resumes(phase, tmp_path):
    cfg = phase_config(phase)
    cfg.train.dit_trainable = "paper"  # the paper's a2 set (tiny's "all": test_a2_dit_trainable_all_vs_paper)
    tx, sched = optim.make_optimizer(cfg.train)
    # A fixed key per step (same noise, timesteps, dropout every step) makes "loss goes down" exact.
    loss = phases.phase(phase).step_loss(cfg)
    loss_fn = lambda m, b, rng: loss(m, b, jax.random.key(1))  # noqa: E731
    mesh = parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1])
    tr = loop.Trainer(model.phase_model(cfg), loss_fn, tx, model.phase_filter(cfg), mesh, schedule=sched,
                      compiler_options=FAST)
    batch = phase_batch(cfg, phase)
    kw = dict(num_steps=6, global_batch_size=2, checkpoint_every=100, log_every=100, progress=False)
    full = loop.fit(tr, iter(lambda: batch, None), workdir=str(tmp_path / "full"), **kw)
    losses = list(full.losses.values())
    assert losses[-1] < losses[0] - 1e-3, losses
    killed = loop.fit(tr, iter(lambda: batch, None), workdir=str(tmp_path / "run"), stop_after=2, **kw)
    resumed = loop.fit(tr, iter(lambda: batch, None), workdir=str(tmp_path / "run"), **kw)
    assert resumed.start_step == 2 and {**killed.losses, **resumed.losses} == full.losses
    final, init = _paths(full.state[0]), _paths(tr.init()[0])
    for k, v in _paths(resumed.state[0]).items():
        np.testing.assert_array_equal(v, final[k], err_msg=k)
    changed = {k for k in final if not np.array_equal(final[k], init[k])}
    trained_prefixes = {"a1": ("shot_encoder/", "dit/flow_embed/"), "a2": ("shot_encoder/", "dit/"),
                        "b": ("mllm/",), "c": ("dit/",), "d": ("student/",)}[phase]
    assert changed and all(k.startswith(trained_prefixes) for k in changed), sorted(changed)[:5]
    if phase == "a1":
        assert not any("lora" in k for k in changed)
    if phase in ("a2", "c"):
        assert any("lora" in k for k in changed) and any("adaln" in k for k in changed)
        frozen = ("/ff/proj_in/", "/ff/proj_out/", "/to_q/kernel", "/to_k/kernel", "/to_v/kernel", "/to_out/kernel")
        assert not any(f in k for k in changed for f in frozen)
        assert any(k.endswith("/to_q/lora_b") for k in changed)
    if phase == "d":  # the whole student (distill_trainable "full"), its guidance embedding included
        assert any(k.startswith("student/guidance_embed/") for k in changed)
        assert any(k.endswith("/to_q/kernel") for k in changed)
    if phase == "b":
        assert any("lora" in k for k in changed) and any("output_resampler" in k for k in changed)
        assert not any(k.endswith("q_proj/kernel") for k in changed)


def test_trainable_sets_and_errors():
    cfg = phase_config("b")
    with pytest.raises(ValueError, match="unknown training phase 'x'"):
        model.phase_model(cfg, "x")
    assert phases.phase("a1").components_for(cfg) == ("shot_encoder", "dit")
    cfg.train.precomputed_features, cfg.train.encode_latents = False, True
    assert phases.phase("c").components_for(cfg) == ("mllm", "shot_encoder", "dit", "t5", "clip", "vae")
    assert phases.phase("r").components_for(cfg) == ("shot_encoder", "dit", "t5", "clip", "vae", "reference")
    levels = np.array([1, 2, 3, 4, 5, 9, 0, -1])
    np.testing.assert_array_equal(batches.flow_values(levels, cfg.dit.flow_table),
                                  [0.5, 2.5, 10.0, 15.0, 40.0, 40.0, 40.0, 40.0])
    from animegamer_jax.models.cogvideox.dit import flow_value  # play uses the same rule
    np.testing.assert_array_equal(batches.flow_values(levels, cfg.dit.flow_table),
                                  np.asarray(flow_value(levels, tuple(cfg.dit.flow_table))))


def test_phase_table_is_the_one_list():
    """train.phases' table: the names config.validate accepts, the compile tool's train programs, one
    module per phase, batch kinds data.batches builds, and a one-line error naming the phases."""
    import importlib

    from animegamer_jax import config as config_lib
    from animegamer_jax.aot import programs

    assert tuple(phases.PHASES) == config_lib.TRAIN_PHASES == programs.TRAIN_PROGRAMS
    for name, rec in phases.PHASES.items():
        assert rec.name == name and importlib.import_module(f"animegamer_jax.train.phases.{name}").PHASE is rec
        assert batches.KINDS[rec.batch.name] is rec.batch
        assert rec.batch.loader == ("turns" if rec.batch.name.startswith("turns") else "clips")
        assert set(rec.outputs) <= set(rec.components) and rec.outputs == tuple(rec.trainable)
    assert [p for p, r in phases.PHASES.items() if r.batch.clip_target] == ["a1", "a2", "c", "d", "r"]
    assert [p for p, r in phases.PHASES.items() if r.batch.loader == "turns"] == ["b", "c"]
    assert phases.phase("c").schedule == (5e-5, 10_000) and phases.phase("vae").batch.dataset_key == "vae_dataset_dir"
    assert phases.phase("a2").batch is phases.phase("a1").batch and phases.phase("a2").loss is phases.phase("a1").loss
    with pytest.raises(ValueError, match=r"^unknown training phase 'x'; use one of vae, a1, a2, b, c, d, r, preview$"):
        phases.phase("x")
    with pytest.raises(ValueError, match="unknown batch kind 'a1'"):
        batches.BatchBuilder(phase_config("a1"), "a1")

def test_a2_dit_trainable_all_vs_paper():
    """configs/tiny.py trains the whole DiT in a2 (no pretrained CogVideoX at toy size); "paper" keeps
    the release's LoRA + flow + block adaLN subset; a1 and c do not change."""
    from flax import nnx

    cfg = phase_config("a2")
    assert cfg.train.dit_trainable == "all"
    net = model.phase_model(cfg, "a2")()

    def count(f):
        return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(net, f)))

    enc, dit = count(model._under("shot_encoder")), count(model._under("dit"))
    assert count(model.phase_filter(cfg)) == enc + dit
    paper = count(model.trainable_filter("a2", "paper"))
    assert enc < paper < enc + dit
    for ph in ("a1", "c"):
        assert count(model.trainable_filter(ph, "all")) == count(model.trainable_filter(ph, "paper"))
    with pytest.raises(ValueError, match="dit_trainable='lora'"):
        model.trainable_filter("a2", "lora")


def test_mllm_batch_builder_layout():
    cfg = phase_config("c")
    b = batches.BatchBuilder(cfg, "turns_clip")(loader_example(cfg, "c"))
    q = num_queries(cfg)
    assert b["input_ids"].shape == (2, 160)
    np.testing.assert_array_equal(b["target_turn"], [2, 1])
    np.testing.assert_array_equal(b["history_turns"], [[0, 1], [0, 0]])
    np.testing.assert_array_equal(b["gen_mask"].sum(1), [q, q])
    np.testing.assert_array_equal(b["cmp_mask"].sum(1), [2 * q, q])
    assert (b["labels"] != -100).sum() == 2 * 11  # the 11 state-grammar tokens of the target turn
    np.testing.assert_allclose(b["flow"], [40.0, 10.0])  # ML of the target turns: 5 and 3
    assert b["latents"].shape == (2, 2, cfg.dit.in_channels, cfg.dit.sample_height, cfg.dit.sample_width)


def test_sample_motion_levels():
    """The sample hook's motion levels (play's dit_sampler takes levels) give back exactly the
    batch's flow values."""
    from animegamer_jax.models.cogvideox.dit import flow_value
    from animegamer_jax.train import samples

    for table in (phase_config("a1").dit.flow_table, (0.5, 1.0, 5.0, 20.0, 40.0), (1.0, 1.0, 2.0)):
        levels = np.array([1, 2, 3, 4, 5, 0, -1, 9])
        flow = batches.flow_values(levels, table)
        back = samples.motion_levels(flow, table)
        np.testing.assert_array_equal(np.asarray(flow_value(back, tuple(table))), flow)


_WORKER = SETUP + WORKER_JOIN + r'''
from tests.train_helpers import phase_batch
from animegamer_jax.train import loop, model
cfg = phase_config("b")
mesh = parallel.make_mesh((-1, 1, 1, 1))
tr = model.phase_trainer(cfg, mesh, compiler_options={"xla_backend_optimization_level": 0})
full = phase_batch(cfg, "b")  # the global batch of 2; each process feeds its own row
local = {k: v[pid:pid + 1] for k, v in full.items()}
r = loop.fit(tr, iter(lambda: local, None), num_steps=3, workdir=workdir, global_batch_size=2,
             checkpoint_every=3, progress=False)
''' + WORKER_REPORT


# make test-paper, for CI's time budget (35 s on 2 cores): two processes training one step function are
# checked in make test by test_train.py::test_two_process_training_agrees and test_train_preemption.py.
@pytest.mark.paper
@pytest.mark.multiprocess
@pytest.mark.slow
def test_phase_b_two_processes_agree(tmp_path):
    losses = agreed_losses(run_processes(_WORKER, tmp_path, devices=1, timeout=600), devices=2, steps=3)
    assert losses[-1] < losses[0]
    assert os.path.isdir(tmp_path / "checkpoints" / "3" / "state")
