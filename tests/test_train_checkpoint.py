"""Training checkpoints carry an integrity record; a damaged newest step is named in one line, kept aside
and the newest intact step resumed; ``resume_step`` picks a step (checkpoint/training.py, loop.fit).

One toy run (steps 2 and 4, async saves) is made once and copied for each case."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from animegamer_jax import checkpoint
from animegamer_jax.commands import train as train_main
from animegamer_jax.checkpoint import training as ckpt_lib
from animegamer_jax.train import loop, optim, pipeline
from configs import tiny
from tests.train_helpers import Toy, one_device_mesh, toy_data, toy_loss, toy_trainable, train_cfg

pytestmark = pytest.mark.slow  # its tests (or the fixtures they share) take over ~10 s each on a loaded 2-core host

KW = dict(num_steps=4, global_batch_size=4, checkpoint_every=2, keep_checkpoints=3, progress=False)


@pytest.fixture(scope="module")
def trainer():
    tx, sched = optim.make_optimizer(train_cfg())
    return loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, one_device_mesh(), schedule=sched)


@pytest.fixture(scope="module")
def full_run(trainer, tmp_path_factory):
    """(workdir with checkpoints 2 and 4 of an uninterrupted 4-step run, its FitResult)."""
    work = tmp_path_factory.mktemp("full")
    r = loop.fit(trainer, toy_data(4), workdir=str(work), **KW)
    assert sorted(os.listdir(work / "checkpoints")) == ["2", "4"]
    return work, r


@pytest.fixture
def run(full_run, tmp_path):
    """A fresh copy of the full run's workdir."""
    shutil.copytree(full_run[0], tmp_path / "run")
    return tmp_path / "run"


def _largest_state_file(step_dir):
    """The largest array data file (OCDBT's ``d/`` folders) of a step's ``state`` item."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir / "state") for f in fs
             if os.path.basename(d) == "d"]
    return max(files, key=os.path.getsize)


def _truncate_largest_state_file(step_dir):
    path = _largest_state_file(step_dir)
    n = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(n // 2)
    return os.path.relpath(path, step_dir), n


def _zero_data_json(step_dir):
    open(step_dir / "data" / "process_0-of-1.json", "w").close()


def _same_state(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_every_step_has_a_record_of_every_file_inside_the_commit(full_run):
    work, _ = full_run
    for step in (2, 4):
        d = work / "checkpoints" / str(step)
        man = json.loads((d / checkpoint.INTEGRITY_FILE).read_text())
        on_disk = {os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs}
        # orbax writes its step metadata and commit marker after the record; everything else is in it
        assert set(man["files"]) == on_disk - {checkpoint.INTEGRITY_FILE, *ckpt_lib.ORBAX_LATE_FILES}
        assert "data/process_0-of-1.json" in man["files"] and "meta/metadata" in man["files"]
        assert any(f.startswith("state/") for f in man["files"])
        for rel, want in man["files"].items():
            assert os.path.getsize(d / rel) == want["size"], rel
        checkpoint.verify_checkpoint(str(d), "full")  # the system checkpoint's check reads it too


def test_zero_byte_data_json_resumes_from_the_older_step_and_keeps_it_aside(trainer, full_run, run, capsys):
    _zero_data_json(run / "checkpoints" / "4")
    r = loop.fit(trainer, toy_data(4), workdir=str(run), **KW)
    err = capsys.readouterr().err.strip().splitlines()
    ckpts = run / "checkpoints"
    assert err == [f"checkpoint {ckpts}/4 is damaged: file data/process_0-of-1.json is truncated (0 bytes, "
                   f"{os.path.getsize(full_run[0] / 'checkpoints' / '4' / 'data' / 'process_0-of-1.json')} "
                   f"when saved); kept aside as {ckpts}/4.damaged-1; resuming from step 2"]
    assert (r.start_step, r.end_step) == (2, 4)
    assert {s: full_run[1].losses[s] for s in (3, 4)} == r.losses  # the same batches as the uninterrupted run
    _same_state(r.state, full_run[1].state)
    # the damaged folder stays as it was; step 4 was saved again next to it, and orbax does not list it
    assert sorted(os.listdir(ckpts)) == ["2", "4", "4.damaged-1"]
    assert os.path.getsize(ckpts / "4.damaged-1" / "data" / "process_0-of-1.json") == 0
    mngr = ckpt_lib.CheckpointManager(str(ckpts), max_to_keep=1, async_save=False)
    assert mngr.all_steps() == [2, 4] and mngr.resume_step() == 4
    mngr.save(6, r.state, meta={})  # max_to_keep garbage collection removes steps, never the kept-aside one
    mngr.close()
    assert sorted(os.listdir(ckpts)) == ["4.damaged-1", "6"]


def test_truncated_largest_state_file_is_named_and_kept_aside(run):
    ckpts = run / "checkpoints"
    shutil.copytree(ckpts / "4", ckpts / "4.damaged-1")  # one kept aside earlier: the next number is used
    rel, n = _truncate_largest_state_file(ckpts / "4")
    lines = []
    mngr = ckpt_lib.CheckpointManager(str(ckpts), async_save=False)
    assert mngr.resume_step(log=lines.append) == 2
    assert lines == [f"checkpoint {ckpts}/4 is damaged: file {rel} is truncated ({n // 2} bytes, {n} when saved); "
                     f"kept aside as {ckpts}/4.damaged-2; resuming from step 2"]
    assert sorted(os.listdir(ckpts)) == ["2", "4.damaged-1", "4.damaged-2"]
    assert (mngr.latest_step(), mngr.all_steps()) == (2, [2])
    mngr.close()


def test_every_step_damaged_is_one_line_and_moves_nothing(trainer, run, monkeypatch, capsys):
    ckpts = run / "checkpoints"
    rel, n = _truncate_largest_state_file(ckpts / "4")
    _zero_data_json(ckpts / "2")
    before = sorted(os.listdir(ckpts))
    want = (f"no intact checkpoint in {ckpts}: step 4: file {rel} is truncated ({n // 2} bytes, {n} when saved); "
            f"step 2: file data/process_0-of-1.json is truncated (0 bytes, ")
    with pytest.raises(ckpt_lib.CheckpointResumeError) as e:
        loop.fit(trainer, toy_data(4), workdir=str(run), **KW)
    assert str(e.value).startswith(want) and "\n" not in str(e.value)
    assert str(e.value).endswith("Nothing was moved or deleted. Fix: start fresh with a new --workdir, or pass "
                                 "--config.train.resume_step=N to name a step (after putting its files back)")
    assert sorted(os.listdir(ckpts)) == before
    # the train command: one line, exit 2, still nothing moved
    monkeypatch.setattr(pipeline, "run_phase", lambda config, workdir, **kw: loop.fit(
        trainer, toy_data(4), workdir=workdir, resume_step=int(config.train.resume_step), **KW))
    monkeypatch.setattr(train_main.datasets, "find", lambda data_dir: None)  # toy data: no prepared dataset
    capsys.readouterr()
    argv = ["--config=configs/tiny.py", "--config.train.phase=a1", f"--workdir={run}"]
    assert train_main.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {e.value}"
    assert train_main.main(argv + ["--config.train.resume_step=3"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"error: resume_step 3: no checkpoint 3 in {ckpts} (steps there: 2, 4)")
    assert sorted(os.listdir(ckpts)) == before


def test_resume_step_picks_a_step_and_keeps_newer_ones_aside(trainer, full_run, run, capsys):
    assert tiny.get_config().train.resume_step == -1  # the default: the newest intact step
    r = loop.fit(trainer, toy_data(4), workdir=str(run), resume_step=2, **KW)
    ckpts = run / "checkpoints"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"resume_step 2: newer checkpoint(s) 4 kept aside as {ckpts}/4.skipped-1 (restore one by renaming it back)"]
    assert (r.start_step, r.end_step) == (2, 4)
    _same_state(r.state, full_run[1].state)
    assert sorted(os.listdir(ckpts)) == ["2", "4", "4.skipped-1"]


def test_resume_step_missing_or_damaged_lists_the_steps(trainer, run):
    ckpts = run / "checkpoints"
    with pytest.raises(ckpt_lib.CheckpointResumeError) as e:
        loop.fit(trainer, toy_data(4), workdir=str(run), resume_step=3, **KW)
    assert str(e.value) == (f"resume_step 3: no checkpoint 3 in {ckpts} (steps there: 2, 4). Fix: pass one of "
                            f"them as --config.train.resume_step, or -1 for the newest intact one")
    _zero_data_json(ckpts / "2")
    mngr = ckpt_lib.CheckpointManager(str(ckpts), async_save=False)
    with pytest.raises(ckpt_lib.CheckpointResumeError) as e:
        mngr.resume_step(2)
    assert str(e.value).startswith(f"resume_step 2: checkpoint {ckpts}/2 is damaged: file data/process_0-of-1.json "
                                   f"is truncated (0 bytes, ")
    assert str(e.value).endswith("(steps there: 2, 4). Fix: pass another step as --config.train.resume_step, "
                                 "or -1 for the newest intact one")
    assert mngr.resume_step(4) == 4
    assert sorted(os.listdir(ckpts)) == ["2", "4"]
    mngr.close()
    empty = ckpt_lib.CheckpointManager(str(run / "empty"), async_save=False)
    assert empty.resume_step() is None  # nothing saved yet: a fresh start
    with pytest.raises(ckpt_lib.CheckpointResumeError, match=r"no checkpoint 2 in .* \(steps there: none\)"):
        empty.resume_step(2)
    empty.close()


def test_a_step_without_a_record_is_restored_unverified(trainer, full_run, run, capsys):
    """Checkpoints written before the record existed resume as before, with a note."""
    ckpts = run / "checkpoints"
    os.remove(ckpts / "4" / checkpoint.INTEGRITY_FILE)
    r = loop.fit(trainer, toy_data(4), num_steps=4, workdir=str(run), global_batch_size=4, checkpoint_every=2,
                 progress=False)
    assert capsys.readouterr().err.strip().splitlines() == [
        f"note: checkpoint {ckpts}/4 has no integrity.json (saved before training checkpoints carried one): "
        f"restoring it unverified"]
    assert (r.start_step, r.end_step) == (4, 4)
    _same_state(r.state, full_run[1].state)


def test_a_damaged_step_without_a_record_fails_in_one_line_naming_an_older_step(trainer, run, capsys):
    """An unverified step whose restore fails (here every array data file of its state emptied) is one line
    naming it, the error and the older step to resume from; nothing is moved."""
    ckpts = run / "checkpoints"
    os.remove(ckpts / "4" / checkpoint.INTEGRITY_FILE)
    for d, _, fs in os.walk(ckpts / "4" / "state"):
        for f in fs:
            if os.path.basename(d) == "d":
                os.truncate(os.path.join(d, f), 0)
    with pytest.raises(ckpt_lib.CheckpointResumeError) as e:
        loop.fit(trainer, toy_data(4), num_steps=4, workdir=str(run), global_batch_size=4, checkpoint_every=2,
                 progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"checkpoint {ckpts}/4 (saved without integrity.json, so unverified) "
                                              f"could not be restored, it may be damaged: "), msg
    assert msg.endswith("Fix: resume from an older step with --config.train.resume_step=2 (steps here: 2, 4)"), msg
    assert sorted(os.listdir(ckpts)) == ["2", "4"]


def test_pipeline_passes_resume_step_to_the_first_phase_that_runs(monkeypatch, tmp_path):
    seen = []
    cfg = tiny.get_config()
    cfg.train.resume_step = 7
    monkeypatch.setattr(pipeline, "run_phase", lambda c, workdir, **kw: seen.append(int(c.train.resume_step)))
    cfg.train.pipeline, cfg.train.pipeline_steps, cfg.train.pipeline_learning_rates = ("a1", "a2"), (), ()
    pipeline.run_all(cfg, str(tmp_path))
    assert seen == [7, -1]
