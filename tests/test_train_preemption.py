"""Preemption-safe training: SIGTERM / SIGINT stop ``loop.fit`` at a step every process agrees on, with a
normal checkpoint saved there, and the resumed run's losses equal an uninterrupted run's; the train
command prints where to resume and exits 0; a stopped pipeline resumes in the stopped phase."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest
from flax import nnx

from animegamer_jax import parallel
from animegamer_jax.parallel import distributed
from animegamer_jax.commands import train as train_main
from animegamer_jax.train import loop, optim, pipeline
from configs import tiny
from tests.subproc import ROOT, run_processes
from tests.train_helpers import TOY, Toy, toy_data, toy_loss, toy_trainable

pytestmark = pytest.mark.slow  # its tests (or the fixtures they share) take over ~10 s each on a loaded 2-core host

NUM_STEPS = 160  # each paced (100 ms / step) run stops within ~10-25 steps; unpaced, 160 steps take ~3 s

# argv: process id, port, workdir [, "paced"]. Paced: 100 ms per step, WORKDIR/ready.<pid> written after this
# run's 3rd step. Unpaced: trains WORKDIR to the end, then (same processes, same compiled step) an
# uninterrupted reference run in WORKDIR/reference.
_WORKER = TOY + r"""
import json, os, sys, time
from animegamer_jax import parallel
pid, port, workdir, pace = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:] == ["paced"]
assert parallel.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
from animegamer_jax.parallel import distributed
from animegamer_jax.train import loop, optim
from configs import tiny
c = tiny.get_config().train
c.learning_rate, c.warmup_steps, c.num_steps = 1e-2, 2, 40
tx, sched = optim.make_optimizer(c)
tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, parallel.make_mesh((-1, 1, 1, 1)),
                  schedule=sched)
done = []

def paced(step, state, batch):
    done.append(step)
    if len(done) == 3:
        open(os.path.join(workdir, f"ready.{pid}"), "w").close()
    time.sleep(0.1)

kw = dict(num_steps=NUM_STEPS, global_batch_size=4, checkpoint_every=1000, keep_checkpoints=2, progress=False)
r = loop.fit(tr, toy_data(2, shard=pid, num_shards=2), workdir=workdir, hooks=(paced,) if pace else (), **kw)
ref = {} if pace else loop.fit(tr, toy_data(2, shard=pid, num_shards=2), workdir=workdir + "/reference", **kw).losses
print(json.dumps({"pid": jax.process_index(), "mode": distributed.preemption_mode(), "preempted": r.preempted,
                  "start": r.start_step, "end": r.end_step, "losses": r.losses, "reference": ref}))
jax.distributed.shutdown()
""".replace("NUM_STEPS", str(NUM_STEPS))


def _preempted_run(workdir, signal_pids, env, timeout=120):
    """Runs the paced 2-process worker in ``workdir``, sends SIGTERM to the processes ``signal_pids`` once
    both have run 3 steps, and returns each process's ``(returncode, stderr, result JSON)``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, XLA_FLAGS="--xla_force_host_platform_device_count=1",
               **env)
    for i in range(2):
        if os.path.exists(workdir / f"ready.{i}"):
            os.remove(workdir / f"ready.{i}")  # the previous run's
    logs = [(open(workdir / f"out.{i}", "w+"), open(workdir / f"err.{i}", "w+")) for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(i), str(port), str(workdir), "paced"],
                              stdout=o, stderr=e, text=True, env=env, cwd=ROOT) for i, (o, e) in enumerate(logs)]
    try:
        deadline = time.monotonic() + timeout
        while not all(os.path.exists(workdir / f"ready.{i}") for i in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "workers did not start"
            time.sleep(0.05)
        for i in signal_pids:
            procs[i].send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out = []
    for p, (o, e) in zip(procs, logs):
        o.seek(0), e.seek(0)
        stdout, stderr = o.read(), e.read()
        o.close(), e.close()
        lines = stdout.strip().splitlines()
        out.append((p.returncode, stderr, json.loads(lines[-1]) if lines else None))
    return out


@pytest.mark.multiprocess
def test_two_processes_stop_at_agreed_steps_and_resume_to_the_uninterrupted_losses(tmp_path):
    """One run preempted three times (jax's service: SIGTERM to one process, then to both; the all-gather
    fallback: SIGTERM to one process), then resumed to the end: every stop is at the same step on both
    processes with a normal checkpoint, and the losses are the uninterrupted run's."""
    run, losses, start = tmp_path, {}, 0
    for service, signalled in (("jax", (1,)), ("jax", (0, 1)), ("allgather", (1,))):
        res = _preempted_run(run, signalled, {"JAX_ENABLE_PREEMPTION_SERVICE": str(service == "jax").lower()})
        for rc, err, _ in res:
            assert rc == 0, err[-3000:]
        r0, r1 = res[0][2], res[1][2]
        assert r0["mode"] == r1["mode"] == service and r0["start"] == r1["start"] == start
        assert r0["end"] == r1["end"] and r0["losses"] == r1["losses"]  # the same step on both processes
        stop = r0["end"]
        assert start + 3 < stop < NUM_STEPS, (service, start, stop)
        if service == "jax":  # the service's own SIGTERM handler caught it: no local signal name
            assert r0["preempted"] == r1["preempted"] == "SIGTERM or a preemption notice"
        else:
            assert (r0["preempted"], r1["preempted"]) == ("a signal on another process", "SIGTERM")
        ckpt = run / "checkpoints" / str(stop)
        assert json.loads((ckpt / "meta" / "metadata").read_text())["step"] == stop
        data = sorted(f for f in os.listdir(ckpt / "data") if f.endswith(".json"))
        assert data == ["process_0-of-2.json", "process_1-of-2.json"]  # each process's iterator position
        losses.update(r0["losses"])
        start = stop
    rest = run_processes(_WORKER, run, devices=1, timeout=300)
    assert [r["start"] for r in rest] == [start, start] and [r["preempted"] for r in rest] == ["", ""]
    full = rest[0]["reference"]
    assert full == rest[1]["reference"] and len(full) == NUM_STEPS
    assert {**losses, **rest[0]["losses"]} == full


def _toy_trainer():
    c = tiny.get_config().train
    c.learning_rate, c.warmup_steps = 1e-2, 2
    tx, sched = optim.make_optimizer(c)
    return loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable,
                        parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1]), schedule=sched)


def test_one_process_stops_on_sigterm_and_sigint_restores_handlers_and_resumes_exactly(tmp_path):
    tr = _toy_trainer()
    kw = dict(num_steps=12, global_batch_size=4, checkpoint_every=4, progress=False)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def send(sig, at):
        return lambda step, state, batch: os.kill(os.getpid(), sig) if step == at else None

    term = loop.fit(tr, toy_data(4), workdir=str(tmp_path / "run"), hooks=(send(signal.SIGTERM, 5),), **kw)
    # the hook runs after step 5's stop question, so the stop is agreed after step 6
    assert (term.preempted, term.end_step, sorted(term.losses)) == ("SIGTERM", 6, list(range(1, 7)))
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["4", "6"]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    intr = loop.fit(tr, toy_data(4), workdir=str(tmp_path / "run"), hooks=(send(signal.SIGINT, 8),), **kw)
    assert (intr.preempted, intr.start_step, intr.end_step) == ("SIGINT", 6, 9)
    rest = loop.fit(tr, toy_data(4), workdir=str(tmp_path / "run"), **kw)
    full = loop.fit(tr, toy_data(4), workdir=str(tmp_path / "full"), **kw)
    assert (rest.start_step, rest.preempted) == (9, "")
    assert {**term.losses, **intr.losses, **rest.losses} == full.losses


def test_second_sigint_stops_at_once_and_a_repeated_sigterm_is_ignored():
    with distributed.preemption_guard() as guard:
        assert guard.mode == "local" and not guard.stop_agreed()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: the save must not be cut short
        assert guard.requested == "SIGTERM" and guard.stop_agreed() and guard.take_notice() == "SIGTERM"
        assert guard.take_notice() == ""
        with distributed.preemption_guard() as inner:  # fit inside a command reuses the command's guard
            assert inner is guard
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here
    with pytest.raises(RuntimeError, match="outside its with-block"):
        guard.stop_agreed()


def test_train_command_prints_the_resume_line_and_exits_0(monkeypatch, capsys, tmp_path):
    def preempted(config, workdir, **kw):
        raise loop.Preempted("SIGTERM", "a2", 7, f"{workdir}/checkpoints")

    monkeypatch.setattr(pipeline, "run_phase", preempted)
    monkeypatch.setattr(train_main.datasets, "find", lambda data_dir: None)  # no prepared dataset needed
    argv = ["--config=configs/tiny.py", "--config.train.phase=a2", f"--workdir={tmp_path}/my run"]
    assert train_main.main(argv) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"preempted: stopped by SIGTERM: phase a2 saved at step 7 in {tmp_path}/my run/checkpoints; "
                       f"resume with the same command: python -m animegamer_jax.commands.train --config=configs/tiny.py "
                       f"--config.train.phase=a2 '--workdir={tmp_path}/my run'")


def test_stopped_pipeline_resumes_in_the_stopped_phase(monkeypatch, tmp_path):
    """run_all: a phase stopped by a signal, then a stop agreed between phases, then the rerun."""
    done, calls = set(), []

    def run_phase(c, workdir, *, system_out, compiler_options=None):
        phase = str(c.train.phase)
        calls.append(phase)
        if phase == "a2" and calls.count("a2") == 1:
            raise loop.Preempted("SIGTERM", "a2", 4, f"{workdir}/checkpoints")
        if phase == "b" and calls.count("b") == 1:
            os.kill(os.getpid(), signal.SIGINT)  # arrives while b finishes: the pipeline stops before c
        done.add(system_out)
        return system_out

    monkeypatch.setattr(pipeline, "run_phase", run_phase)
    monkeypatch.setattr(pipeline.checkpoint, "is_complete", lambda d: d in done)
    cfg = tiny.get_config()
    cfg.train.pipeline, cfg.train.pipeline_steps, cfg.train.pipeline_learning_rates = ("a1", "a2", "b", "c"), (), ()
    with pytest.raises(loop.Preempted, match="stopped by SIGTERM: phase a2 saved at step 4"):
        pipeline.run_all(cfg, str(tmp_path))
    assert calls == ["a1", "a2"]
    with pytest.raises(loop.Preempted, match="stopped by SIGINT: phase c stopped before its first step") as e:
        pipeline.run_all(cfg, str(tmp_path))
    assert calls == ["a1", "a2", "a2", "b"] and e.value.checkpoint_dir == str(tmp_path / "c" / "checkpoints")
    assert pipeline.run_all(cfg, str(tmp_path)) == str(tmp_path / "system")
    assert calls == ["a1", "a2", "a2", "b", "c"]
