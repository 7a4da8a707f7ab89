"""Kill-anywhere checks in CI (issue 31): the harness itself on toy writers, then one seeded kill and rerun
of three cheap commands (prepare, label, play of a script on the stand-in system). Every command at
N >= 10, train and serve included, is ``make faults`` (tests/faults.py); what each fault leaves:
docs/faults.md. Cost: about 35 s on 2 CPU cores."""

import re
import signal
import sys

import pytest

from tests import faults

# A command writing OUT (argv[1]) in 20 pieces: straight into its final path (TORN), or into a temp file
# of its own (``.tmp-<pid>``) renamed into place at the end (ATOMIC). Whole: 20 lines "line i". With
# argv[3] == "hold" it stops after 10 lines until it is signalled (at most 300 s), so a kill lands
# mid-write whatever the host's load: the harness waits for the 10 lines (``armed``) before the signal.
_WRITER = r"""
import os, sys, time
out, atomic, hold = sys.argv[1], sys.argv[2] == "atomic", sys.argv[3] == "hold"
path = f"{out}.tmp-{os.getpid()}" if atomic else out
with open(path, "w") as f:
    for i in range(20):
        f.write(f"line {i}\n"); f.flush()
        if i == 9 and hold:
            time.sleep(300)
if atomic:
    os.replace(path, out)
"""
_EXPECTED = "".join(f"line {i}\n" for i in range(20))
_HALF = "".join(f"line {i}\n" for i in range(10))


class _WriterCase(faults.Case):
    """The toy writer as a case: its file appears whole or not at all; a rerun writes it. Killed runs
    hold mid-write, so every kill is delivered while the file is half written (no dependence on where
    a kill lands on a loaded host)."""

    signals = (signal.SIGKILL, signal.SIGINT)

    def __init__(self, mode):
        super().__init__(None, faults.child_env())
        self.mode = mode
        self.name = f"writer ({mode})"

    def command(self, out):
        hold = "hold" if out.name.startswith("kill") else "run"
        return [sys.executable, "-c", _WRITER, str(out / "result.txt"), self.mode, hold]

    def rerun_command(self, out):
        return [sys.executable, "-c", _WRITER, str(out / "result.txt"), self.mode, "run"]

    def armed(self, out):
        return any(p.read_text() == _HALF for p in out.glob("result.txt*"))

    def finished(self, out):
        return (out / "result.txt").exists() and (out / "result.txt").read_text() == _EXPECTED

    def partial(self, out):
        f = out / "result.txt"
        return [f"result.txt is torn ({len(f.read_text())} bytes)"] if f.exists() and f.read_text() != _EXPECTED else []

    def compare(self, ref, out):
        return [] if (out / "result.txt").read_text() == (ref / "result.txt").read_text() == _EXPECTED else [
            "result.txt differs"]


def test_harness_catches_a_torn_write_and_a_leftover_temp_file(tmp_path):
    torn = faults.run_case(_WriterCase("torn"), 3, 0, tmp_path / "torn", log=lambda s: None)
    # every kill lands while the file is half written (the writer holds there): torn at its final path
    # and rerun, each time
    assert sum(torn.kills.values()) == 3 and torn.missed == 0 and torn.reruns == 3, faults.table([torn])
    assert [f.split(": ", 1)[1] for f in torn.failures] == ["result.txt is torn (70 bytes)"] * 3, torn.failures
    atomic = faults.run_case(_WriterCase("atomic"), 3, 0, tmp_path / "atomic", log=lambda s: None)
    # nothing torn, but each killed run's temp file stays (the toy writer never cleans it up)
    assert atomic.missed == 0 and atomic.reruns == 3, faults.table([atomic])
    assert not any("torn" in f for f in atomic.failures)
    left = [f for f in atomic.failures if re.search(r"temp left after the final run: result\.txt\.tmp-\d+$", f)]
    assert len(left) == len(atomic.failures) == 3, atomic.failures
    assert all(re.match(r"#\d SIG(INT|KILL)@", f) for f in atomic.failures)  # its kill, signal and moment
    kept = {f"kill{int(f[1]):02d}" for f in torn.failures}  # failing kills keep their folder, the rest go
    assert kept == {"kill00", "kill01", "kill02"}
    assert {p.name for p in (tmp_path / "torn").iterdir() if p.name.startswith("kill")} == kept
    lines = faults.table([torn]).splitlines()
    assert lines[0] == "| command | kills | reruns | invariant failures |"
    assert lines[2].startswith("| writer (torn) | ") and "| 3 | 3: #" in lines[2]


def test_temp_names(tmp_path):
    for name in (".tmp-g-1234abcd/x", ".game.json.tmp-0a1b2c3d", "system.tmp/a", "3.orbax-checkpoint-tmp-17/b",
                 "ds/n/c/incomplete.ABC_2.0.0/s", "ds/.building-x1/y", ".labels.jsonl.parts/p.jsonl",
                 ".system.partial-zz/q", "game/turn_000.mp4", "run/checkpoints/3/state"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert sorted(faults.temp_files(tmp_path)) == [
        ".game.json.tmp-0a1b2c3d", ".labels.jsonl.parts", ".system.partial-zz",
        ".tmp-g-1234abcd", "3.orbax-checkpoint-tmp-17", "ds/.building-x1", "ds/n/c/incomplete.ABC_2.0.0",
        "system.tmp"]


@pytest.mark.parametrize("case", ["prepare", "label", "play-script"])
@pytest.mark.slow
def test_one_kill_and_rerun(case, tmp_path_factory):
    """One seeded kill (signal and moment drawn from seed 0) of a real command, then the rerun: no
    invariant failure (nothing partial at a final path, the result equals the uninterrupted run's,
    what was done before the kill intact, no temp file left)."""
    root = tmp_path_factory.getbasetemp() / "faults"
    (row,) = faults.run([case], 1, 0, root, system="standin", log=lambda s: None)
    # the kill is delivered, or the run had exited before its moment (a loaded host can make the reference
    # slower than the killed run); either way at most one rerun and no invariant failure
    assert sum(row.kills.values()) + row.missed == 1 and row.reruns <= 1, faults.table([row])
    assert row.failures == [] and row.reference_s > 0, faults.table([row])
