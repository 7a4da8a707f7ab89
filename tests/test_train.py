"""Generic training machinery on a toy NNX model: optimizer, loop, checkpoints, sharding, failures."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from animegamer_jax import checkpoint
from animegamer_jax.train import loop, metrics, optim
from configs import tiny
from tests.dataset_helpers import index_only_dataset
from tests.subproc import WORKER_JOIN, WORKER_REPORT, agreed_losses, run_processes, run_python
from tests.train_helpers import (TOY, TOY_X, TOY_Y, Toy, one_device_mesh, toy_data, toy_loss, toy_trainable,
                                 train_cfg)


def test_schedule_and_paper_defaults():
    c = train_cfg(learning_rate=0.0, num_steps=0, warmup_steps=100, end_lr_factor=0.1, phase="b")
    assert optim.phase_lr_and_steps(c) == (5e-5, 15_000)
    s = optim.make_schedule(c)
    assert float(s(0)) == 0.0
    np.testing.assert_allclose(float(s(50)), 2.5e-5, rtol=1e-6)
    np.testing.assert_allclose(float(s(100)), 5e-5, rtol=1e-6)
    np.testing.assert_allclose(float(s(15_000)), 5e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown training phase 'z'"):
        optim.phase_lr_and_steps(train_cfg(phase="z"))


@pytest.mark.slow
def test_grad_accumulation_matches_full_batch():
    """Two micro-batches of 2 with MultiSteps == one batch of 4 (mean losses, equal sizes)."""
    model = Toy(nnx.Rngs(0))
    x, y = jnp.asarray(TOY_X[:4]), jnp.asarray(TOY_Y[:4])

    def run(accum):
        tx, _ = optim.make_optimizer(train_cfg(grad_accum_steps=accum, grad_clip=0.0))
        m = nnx.clone(model)
        opt = nnx.Optimizer(m, tx, wrt=toy_trainable)
        loss = lambda mm, xb, yb: jnp.mean((mm(xb) - yb) ** 2)
        for i in range(accum * 3):
            sl = slice(None) if accum == 1 else slice(2 * (i % 2), 2 * (i % 2) + 2)
            grads = nnx.grad(loss, argnums=nnx.DiffState(0, toy_trainable))(m, x[sl], y[sl])
            opt.update(m, grads)
        return m

    a, b = run(1), run(2)
    np.testing.assert_allclose(np.asarray(a.w1[...]), np.asarray(b.w1[...]), atol=1e-5)
    assert not np.allclose(np.asarray(a.w1[...]), np.asarray(model.w1[...]))


@pytest.mark.slow
def test_loss_decreases_frozen_untouched_and_no_frozen_optimizer_state(tmp_path):
    cfg = train_cfg(learning_rate=3e-2)
    tx, sched = optim.make_optimizer(cfg)
    tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, one_device_mesh(), schedule=sched)
    assert tr.num_trainable() == (8 * 16 + 16 * 4, 8 * 8 + 8 * 16 + 16 * 4)
    fixed = {"x": TOY_X[:8], "y": TOY_Y[:8]}
    r = loop.fit(tr, iter(lambda: fixed, None), num_steps=30, workdir=str(tmp_path), global_batch_size=8,
                 checkpoint_every=1000, log_every=10, progress=False)
    assert r.losses[30] < 0.5 * r.losses[1], r.losses
    model, opt = tr.split(r.state)
    np.testing.assert_array_equal(np.asarray(model.frozen[...]), np.asarray(Toy(nnx.Rngs(0)).frozen[...]))
    opt_paths = {"/".join(map(str, p)) for p, _ in jax.tree_util.tree_flatten_with_path(nnx.state(opt).to_pure_dict())[0]}
    assert any("w1" in p for p in opt_paths) and not any("frozen" in p for p in opt_paths)
    tb = metrics.read_scalars(os.path.join(str(tmp_path), "tensorboard"))
    for tag in ("loss", "lr", "grad_norm", "mse", "steps_per_second", "examples_per_second"):
        assert [s for s, _ in tb[tag]] == [10, 20, 30], tag
    np.testing.assert_allclose(tb["loss"][-1][1], np.mean([r.losses[s] for s in range(21, 31)]), rtol=1e-5)
    np.testing.assert_allclose(tb["lr"][0][1], np.mean([float(sched(s)) for s in range(10)]), rtol=1e-5)


def test_log_shares_the_window_between_data_and_step(tmp_path):
    # a clock that moves only when the loader hands a batch (2 s) and after each step (1 s, a hook):
    # data is 2 / 3 of every window's wall time, a synchronous save's blocking lands in the next window
    now = [0.0]

    def loader():
        for b in toy_data(4):
            now[0] += 2.0
            yield b

    def compute(step, state, batch):
        now[0] += 1.0

    tx, sched = optim.make_optimizer(train_cfg())
    tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, one_device_mesh(), schedule=sched)
    loop.fit(tr, loader(), num_steps=12, workdir=str(tmp_path), global_batch_size=4, checkpoint_every=100,
             log_every=4, progress=False, async_checkpoint=False, hooks=(compute,), clock=lambda: now[0])
    tb = metrics.read_scalars(os.path.join(str(tmp_path), "tensorboard"))
    assert [s for s, _ in tb["data_wait_share"]] == [4, 8, 12]
    np.testing.assert_allclose([v for _, v in tb["data_wait_share"]], [2 / 3] * 3, rtol=1e-6)
    np.testing.assert_allclose([v for _, v in tb["checkpoint_wait_share"]], [0.0] * 3)
    np.testing.assert_allclose([v for _, v in tb["steps_per_second"]], [1 / 3] * 3, rtol=1e-6)


@pytest.mark.slow
def test_killed_and_resumed_equals_uninterrupted(tmp_path):
    tx, sched = optim.make_optimizer(train_cfg(grad_accum_steps=2))
    tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, one_device_mesh(), schedule=sched,
                      grad_accum_steps=2)
    kw = dict(num_steps=12, global_batch_size=4, checkpoint_every=3, keep_checkpoints=2, log_every=4, progress=False)
    killed = loop.fit(tr, toy_data(4), workdir=str(tmp_path / "a"), stop_after=7, **kw)
    assert (killed.start_step, killed.end_step) == (0, 7)
    steps = sorted(int(d) for d in os.listdir(tmp_path / "a" / "checkpoints") if d.isdigit())
    assert steps == [6, 7]  # keep 2; the stop step is saved
    resumed = loop.fit(tr, toy_data(4), workdir=str(tmp_path / "a"), **kw)
    assert resumed.start_step == 7
    full = loop.fit(tr, toy_data(4), workdir=str(tmp_path / "b"), **kw)
    assert {**killed.losses, **resumed.losses} == full.losses
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(full.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_resume_with_another_run_is_one_line_or_explicitly_allowed(tmp_path):
    tx, sched = optim.make_optimizer(train_cfg())
    tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, one_device_mesh(), schedule=sched)
    kw = dict(workdir=str(tmp_path), global_batch_size=4, checkpoint_every=2, progress=False, async_checkpoint=False)
    meta = {"phase": "a1", "config": "tiny", "learning_rate": 1e-2, "warmup_steps": 2}
    loop.fit(tr, toy_data(4), num_steps=6, stop_after=2, meta=meta, **kw)
    ckpts = str(tmp_path / "checkpoints")
    with pytest.raises(loop.ResumeMismatchError) as e:
        loop.fit(tr, toy_data(4), num_steps=9, meta=dict(meta, phase="a2"), **kw)
    assert str(e.value) == (f"{ckpts} (step 2) was written by another run: phase 'a1' -> 'a2'; num_steps 6 -> 9 "
                            f"(saved -> now). Fix: use a new --workdir for a new run, or resume it anyway with "
                            f"--config.train.allow_resume_mismatch=True")
    saved = dict(meta, num_steps=6, global_batch_size=4, grad_accum_steps=1)
    assert loop.check_resume(saved, dict(saved, global_batch_size=8, learning_rate=3e-3, warmup_steps=2), "") == [
        "global_batch_size 4 -> 8", "learning_rate 0.01 -> 0.003"]
    assert loop.check_resume({"phase": "a1"}, saved, "") == []  # older checkpoints: only fields on both sides
    r = loop.fit(tr, toy_data(4), num_steps=3, meta=meta, allow_resume_mismatch=True, **kw)
    assert (r.start_step, r.end_step) == (2, 3)


def _index_dataset(path, instruction="Motion: sit."):
    """A prepared-dataset folder as far as its index goes (tests/dataset_helpers.py)."""
    return index_only_dataset(path, [{"film_id": "f", "instruction": instruction, "states": [1, 0, 0, 0]}],
                              films=[{"film_id": "f", "path": os.path.join(str(path), "f.mp4")}])


@pytest.mark.slow
def test_resume_checks_seed_dataset_and_batch_settings(tmp_path):
    """What shapes the batches is part of the run (train.pipeline.run_meta, what run_phase records):
    another seed, dataset content, loader order or phase batch setting (VAE curriculum, turns per
    example) refuses the resume, one line naming it; the padding length, a moved copy of the dataset
    and fields an older checkpoint did not record do not; tuples compare equal to the lists the JSON
    meta stored."""
    import shutil

    from animegamer_jax.train import pipeline

    ds = _index_dataset(tmp_path / "ds")

    def config(**data):
        c = tiny.get_config()
        c.data.dataset_dir, c.train.vae_dataset_dir = ds, ""
        c.data.update(data)
        return c

    tx, sched = optim.make_optimizer(train_cfg())
    tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, one_device_mesh(), schedule=sched)
    shutil.copytree(ds, tmp_path / "moved")
    other_clips = _index_dataset(tmp_path / "other", instruction="Motion: run.")
    vae_ds = config()
    vae_ds.train.vae_dataset_dir = other_clips
    cases = [  # (phase, the resumed run's config, the difference it names, or None: it resumes)
        ("vae", lambda c: setattr(c.train, "vae_curriculum", ((0, 1, 32, 48),)), "batch_settings.vae_curriculum"),
        ("vae", lambda c: setattr(c.train, "vae_dataset_dir", other_clips), "dataset.content"),
        ("b", lambda c: setattr(c.data, "max_turns", 3), "batch_settings.max_turns"),
        ("c", lambda c: setattr(c.mllm, "history_window", 2), "batch_settings.history_window"),
        ("b", lambda c: setattr(c, "seed", 7), "seed"),
        ("a1", lambda c: setattr(c.data, "shuffle_seed", 3), "dataset.shuffle_seed"),
        ("a1", lambda c: setattr(c.data, "dataset_dir", other_clips), "dataset.content"),
        ("a2", lambda c: setattr(c.data, "dataset_dir", str(tmp_path / "moved")), None),
        ("b", lambda c: setattr(c.train, "max_seq_len", 512), None),
    ]
    for n, (phase, change, field) in enumerate(cases):
        kw = dict(workdir=str(tmp_path / f"run{n}"), global_batch_size=4, checkpoint_every=2, num_steps=6,
                  progress=False, async_checkpoint=False)
        meta = pipeline.run_meta(config(), phase)
        meta["batch_settings"]["pair"] = (1, 2)  # a tuple: stored as a JSON list
        assert meta["dataset"]["content"].startswith("sha256:") and meta["seed"] == 0
        loop.fit(tr, toy_data(4), stop_after=2, meta=meta, **kw)
        cfg = config()
        change(cfg)
        again = dict(pipeline.run_meta(cfg, phase), batch_settings=dict(pipeline.run_meta(cfg, phase)["batch_settings"],
                                                                         pair=(1, 2)))
        if field is None:
            r = loop.fit(tr, toy_data(4), stop_after=3, meta=again, **kw)
            assert (r.start_step, r.end_step) == (2, 3)
            continue
        with pytest.raises(loop.ResumeMismatchError) as e:
            loop.fit(tr, toy_data(4), meta=again, **kw)
        msg = str(e.value)
        assert f"written by another run: {field} " in msg and msg.count(" -> ") == 2, msg  # it alone; "(saved -> now)"
    assert pipeline.run_meta(vae_ds, "vae")["dataset"]["content"] != pipeline.run_meta(vae_ds, "a1")["dataset"]["content"]
    assert "dataset" not in pipeline.run_meta(config(), "b", dataset=False)  # the caller's data: no dataset to name
    # a checkpoint from before a field (or a key of batch_settings) was recorded: not checked on it
    now = {"phase": "b", "seed": 0, "batch_settings": {"max_turns": 5, "history_window": 3}}
    assert loop.check_resume({"phase": "b", "batch_settings": {"max_turns": 5}}, now, "") == []
    assert loop.check_resume({"phase": "b", "batch_settings": {"max_turns": 4}}, now, "") == [
        "batch_settings.max_turns 4 -> 5"]


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    tx, _ = optim.make_optimizer(train_cfg())
    tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, one_device_mesh())
    good = {"x": TOY_X[:4], "y": TOY_Y[:4]}
    bad = {"x": TOY_X[:4], "y": np.full_like(TOY_Y[:4], np.nan)}
    data = iter([good] * 4 + [bad] * 4)
    with pytest.raises(loop.NonFiniteLossError, match=r"loss is nan at step 5; .*last good checkpoint is step 4"):
        loop.fit(tr, data, num_steps=8, workdir=str(tmp_path), global_batch_size=4, checkpoint_every=2,
                 progress=False)
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())[-1] == 4


def test_system_checkpoint_roundtrip_and_mismatch(tmp_path):
    cfg = tiny.get_config()
    builders = {"dit": lambda c, r: Toy(r), "vae": lambda c, r: Toy(r)}
    comps = {"dit": Toy(nnx.Rngs(1)), "vae": Toy(nnx.Rngs(2))}
    d = checkpoint.save_system(str(tmp_path / "sys"), comps, cfg)
    with pytest.raises(checkpoint.SystemCheckpointError, match="exists"):
        checkpoint.save_system(d, comps, cfg)
    man = checkpoint.read_manifest(d)
    assert man["components"] == ["dit", "vae"] and man["param_counts"]["dit"] == 64 + 128 + 64
    assert checkpoint.load_config(d).dit.hidden_size == cfg.dit.hidden_size
    assert checkpoint.load_config(d).sharding_rules == cfg.sharding_rules
    out = checkpoint.load_system(d, builders=builders)
    for name in comps:
        np.testing.assert_array_equal(np.asarray(out[name].w1[...]), np.asarray(comps[name].w1[...]))

    class Wider(Toy):
        def __init__(self, rngs):
            super().__init__(rngs)
            self.w2 = nnx.Param(jnp.zeros((16, 5)))
            self.extra = nnx.Param(jnp.zeros(3))

    with pytest.raises(checkpoint.SystemCheckpointError,
                       match=r"missing keys \['extra'\].*mis-shaped \['w2: stored \(16, 4\) vs config \(16, 5\)'\]"):
        checkpoint.load_system(d, names=["dit"], builders={"dit": lambda c, r: Wider(r)})
    with pytest.raises(checkpoint.SystemCheckpointError, match=r"has no component\(s\) \['mllm'\]"):
        checkpoint.load_system(d, names=["mllm"], builders=builders)


_SHARDED = TOY + r'''
import json
from animegamer_jax import parallel
from animegamer_jax.train import loop, optim
from configs import tiny
c = tiny.get_config().train
c.learning_rate, c.warmup_steps, c.num_steps = 1e-2, 2, 40
tx, sched = optim.make_optimizer(c)
fixed = {"x": TOY_X[:8], "y": TOY_Y[:8]}
out = {}
for name, shape, devs in (("one", (1, 1, 1, 1), jax.devices()[:1]), ("eight", (2, 2, 2, 1), jax.devices())):
    mesh = parallel.make_mesh(shape, devices=devs)
    tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, mesh, schedule=sched)
    r = loop.fit(tr, iter(lambda: fixed, None), num_steps=3, workdir=f"/tmp/_agj_sharded_{name}_{os.getpid()}",
                 global_batch_size=8, checkpoint_every=100, progress=False)
    out[name] = {"losses": list(r.losses.values()), "w1": np.asarray(r.state[0]["w1"][...]).tolist(),
                 "spec": str(r.state[0]["w1"][...].sharding.spec),
                 "mu_spec": str(jax.tree.leaves(r.state[1]["opt_state"])[1].sharding.spec)}
    if name == "eight":
        try:
            loop.fit(tr, iter(lambda: fixed, None), num_steps=1, workdir=f"/tmp/_agj_bad_{os.getpid()}",
                     global_batch_size=6, progress=False)
        except parallel.ShardingConfigError as e:
            out["err"] = str(e)
        out["compiled"] = len(tr._compiled)
print(json.dumps(out))
'''


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sharded_step_on_8_devices_matches_single_device():
    r = json.loads(run_python("import os\n" + _SHARDED).strip().splitlines()[-1])
    assert r["eight"]["spec"] == "P('fsdp', 'tensor')" and r["one"]["spec"] in ("P('fsdp', 'tensor')", "P()")
    np.testing.assert_allclose(r["eight"]["losses"], r["one"]["losses"], rtol=1e-5)
    np.testing.assert_allclose(r["eight"]["w1"], r["one"]["w1"], atol=1e-5)
    assert "global batch size 6 does not divide the 4 data-parallel shards" in r["err"]
    assert r["compiled"] == 1  # the bad batch was rejected before a second compilation


_WORKER = TOY + WORKER_JOIN + r'''
from animegamer_jax.train import loop, optim
from configs import tiny
c = tiny.get_config().train
c.learning_rate, c.warmup_steps, c.num_steps = 1e-2, 2, 40
tx, sched = optim.make_optimizer(c)
mesh = parallel.make_mesh((-1, 1, 1, 1))
tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, mesh, schedule=sched)
r = loop.fit(tr, toy_data(2, shard=pid, num_shards=2), num_steps=4, workdir=workdir, global_batch_size=4,
             checkpoint_every=2, progress=False)
''' + WORKER_REPORT


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_process_training_agrees(tmp_path):
    agreed_losses(run_processes(_WORKER, tmp_path, devices=2, timeout=300), devices=4, steps=4)
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == [2, 4]
    data_files = sorted(f for f in os.listdir(tmp_path / "checkpoints" / "4" / "data") if f.endswith(".json"))
    assert data_files == ["process_0-of-2.json", "process_1-of-2.json"]
    # process 0 writes the integrity record after every process's files are written: both are in it
    man = checkpoint.verify_checkpoint(str(tmp_path / "checkpoints" / "4"), "full")
    assert {"data/process_0-of-2.json", "data/process_1-of-2.json"} <= set(man["files"])


_FSDP_RUN = r'''
import json, os, sys
import numpy as np
jax.config.update("jax_threefry_partitionable", True)  # init values independent of the layout
from animegamer_jax import parallel
pid = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if len(sys.argv) > 1:
    assert parallel.initialize(coordinator_address=f"127.0.0.1:{sys.argv[2]}", num_processes=2, process_id=pid)
from animegamer_jax.train import loop, optim
from configs import tiny
c = tiny.get_config().train
c.learning_rate, c.warmup_steps, c.num_steps = 1e-2, 2, 40
tx, sched = optim.make_optimizer(c)
mesh = parallel.make_mesh((2, 2, 2, 1))  # data x fsdp x tensor over all 8 devices of the job
tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, mesh, schedule=sched)
if jax.process_count() == 2:  # each process reads every second row: 2 of the global batch of 4
    data = toy_data(2, shard=pid, num_shards=2)
else:  # the same global batches, process-major as the two processes' rows make them
    data = ({k: np.concatenate([a[k], b[k]]) for k in a}
            for a, b in zip(toy_data(2, shard=0, num_shards=2), toy_data(2, shard=1, num_shards=2)))
r = loop.fit(tr, data, num_steps=6,
             workdir=sys.argv[3] if len(sys.argv) > 1 else f"/tmp/_agj_fsdp_{os.getpid()}", global_batch_size=4,
             checkpoint_every=100, progress=False)
w1 = jax.experimental.multihost_utils.process_allgather(r.state[0]["w1"][...], tiled=True)
print(json.dumps({"pid": jax.process_index(), "devices": jax.device_count(), "local": jax.local_device_count(),
                  "losses": list(r.losses.values()), "w1": np.asarray(w1).tolist()}))
'''


@pytest.mark.multiprocess
@pytest.mark.paper  # a second variant of test_two_process_training_agrees (make test-paper)
def test_two_processes_of_4_devices_train_as_one_process_of_8(tmp_path):
    """Issue 56: FSDP + data + tensor parallel over 2 local processes x 4 CPU devices gives the losses and
    weights of 1 process x 8 devices on the same global batches (rows process-major; the toy loss's
    per-row noise makes the row order count)."""
    code = TOY + "import jax.experimental.multihost_utils\n" + _FSDP_RUN
    two = run_processes(code, tmp_path, devices=4, timeout=600)
    one = json.loads(run_python(code, devices=8, timeout=600).strip().splitlines()[-1])
    assert [(r["devices"], r["local"]) for r in two] == [(8, 4), (8, 4)] and (one["devices"], one["local"]) == (8, 8)
    assert two[0]["losses"] == two[1]["losses"] and len(one["losses"]) == 6
    np.testing.assert_allclose(two[0]["losses"], one["losses"], rtol=1e-5)
    np.testing.assert_allclose(two[0]["w1"], one["w1"], rtol=1e-4, atol=1e-6)
    assert not np.allclose(one["losses"][0], one["losses"][-1])


def test_write_system_never_replaces_a_users_folder(tmp_path):
    """write_system replaces only a system checkpoint of ours; a user's folder survives untouched."""
    from animegamer_jax.train import pipeline

    users = tmp_path / "system"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not a system checkpoint.*left untouched"):
        pipeline.write_system(None, None, None, str(users))
    assert (users / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_summaries_are_on_disk_when_written(tmp_path):
    """A SIGKILL right after write_scalars loses nothing: another process reads every value back
    while the writer is still open (tensorboardX's own SummaryWriter queues events to a thread)."""
    w = metrics.SummaryWriter(str(tmp_path / "tb"))
    assert [p.name.startswith("events.out.tfevents.") for p in (tmp_path / "tb").iterdir()] == [True]
    read = ("import json; from animegamer_jax.train import metrics; "
            f"print(json.dumps(metrics.read_scalars({str(tmp_path / 'tb')!r})))")
    for step in (1, 2, 3):
        w.write_scalars(step, {"loss": 1.0 / step, "lr": 0.5})
        got = json.loads(run_python(read, devices=1).strip().splitlines()[-1])
        assert got["loss"] == [[s, float(np.float32(1.0 / s))] for s in range(1, step + 1)], got
    w.write_text(3, "config", "tiny")
    w.close()
