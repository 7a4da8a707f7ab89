"""One writer per game folder (game/folder/layout.py ``game_lock``): a second writer of a game folder
gets one line naming the holder's pid and host and exit status 2 before it plays anything; the
lock of a killed process does not block the next run; temp names differ per process; three
concurrent ``play --continue`` of one game leave it whole and continuable.

The lock is held deterministically by a helper process that takes it, says so on stdout and holds
it until its stdin closes (or it is killed): no test here depends on timing."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from animegamer_jax.commands import generate, play
from animegamer_jax.game.folder import atomic, layout
from animegamer_jax.io import locks
from tests.subproc import ROOT, child_env, hold_lock, probe_lock

TEXTS = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
         "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.",
         "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest."]

def _holder(game_dir: str) -> subprocess.Popen:
    """A process holding ``game_dir``'s lock (returns once it holds it)."""
    return hold_lock(layout.lock_path(game_dir))


def _snapshot(folder) -> dict:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


@pytest.fixture
def game(tmp_path):
    """A saved one-turn game ``out/g`` (stand-in system) and a one-turn script to continue it with."""
    (tmp_path / "g.txt").write_text(TEXTS[0] + "\n")
    (tmp_path / "more.txt").write_text(TEXTS[1] + "\n")
    out = tmp_path / "out"
    assert play.main([str(tmp_path / "g.txt"), "--standin", "--out", str(out)]) == 0
    return tmp_path, out / "g"


def _turns(folder) -> int:
    return len(json.load(open(os.path.join(folder, "game.json")))["turns"])


def test_a_second_writer_is_refused_with_one_line_before_playing(game, capsys):
    d, g = game
    before = _snapshot(g)
    capsys.readouterr()
    holder = _holder(str(g))
    try:
        rc = play.main(["--continue", str(g), str(d / "more.txt"), "--standin"])
        out, err = capsys.readouterr()
        assert rc == 2
        assert err.splitlines() == [f"error: {g} is being written by another process (pid {holder.pid} on host "
                                    f"{socket.gethostname()}); a game folder has one writer at a time. Fix: wait for "
                                    f"that process to end (or stop it), or write to another --out or --game-id"]
        assert "turn 1" not in out and "system:" not in out  # refused before the system loaded
        # a new game into the held folder (play SCRIPT --overwrite) and generate are refused alike
        assert play.main([str(d / "g.txt"), "--standin", "--out", str(g.parent), "--overwrite"]) == 2
        assert f"(pid {holder.pid} on host" in capsys.readouterr().err
        (d / "g.jsonl").write_text(json.dumps({"game_id": "g", "turns": [TEXTS[0]]}) + "\n")
        assert generate.main([str(d / "g.jsonl"), "--standin", "--out", str(g.parent), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and f"(pid {holder.pid} on host" in err
        assert _snapshot(g) == before  # nothing written
    finally:
        holder.communicate("")
    assert holder.returncode == 0
    assert not os.path.exists(layout.lock_path(str(g)))  # the holder removed its lock file as it let go
    # released: the same command plays
    assert play.main(["--continue", str(g), str(d / "more.txt"), "--standin"]) == 0
    assert _turns(g) == 2 and layout.verify_game(str(g)) is None
    assert not os.path.exists(layout.lock_path(str(g)))


def test_the_lock_of_a_killed_process_does_not_block(game, capsys):
    d, g = game
    holder = _holder(str(g))
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert holder.returncode == -signal.SIGKILL
    lock = layout.lock_path(str(g))
    assert open(lock).read().split()[:2] == [socket.gethostname(), str(holder.pid)]  # its stale stamp is left
    # a .part file a killed writer left in the folder is removed by the next writer
    stale = g / f"turn_001.mp4.{holder.pid}-0123abcd.part"
    stale.write_bytes(b"half a video")
    assert play.main(["--continue", str(g), str(d / "more.txt"), "--standin"]) == 0
    assert _turns(g) == 2 and layout.verify_game(str(g)) is None
    assert not stale.exists() and not os.path.exists(lock)


def test_the_lock_is_reentrant_in_a_process_and_exclusive_between_processes(tmp_path):
    lock = str(tmp_path / ".lock-x")
    with locks.exclusive_lock(lock) as first:
        with locks.exclusive_lock(lock) as second:
            assert (first, second) == (1, 2)
            assert open(lock).read().split()[:2] == [socket.gethostname(), str(os.getpid())]
        assert probe_lock(lock) == (3, f"refused: pid {os.getpid()} on host {socket.gethostname()}\n")
    assert not os.path.exists(lock)
    assert probe_lock(lock) == (0, "held\n")
    with locks.exclusive_lock("memory://games/.lock-x") as depth:
        assert depth == 0  # no lock on stores without conditional writes (documented; gs:// leases: test_cloud_paths)


def test_temp_names_differ_per_process(tmp_path):
    here = atomic.part_path(str(tmp_path / "turn_000.mp4"))
    code = "import sys\nfrom animegamer_jax.game.folder import atomic\nprint(atomic.part_path(sys.argv[1]))\n"
    there = subprocess.run([sys.executable, "-c", code, str(tmp_path / "turn_000.mp4")], capture_output=True,
                           text=True, env=child_env(), cwd=ROOT, check=True).stdout.strip()
    child_pid = int(there.rsplit(".", 2)[1].split("-")[0])
    assert here.startswith(str(tmp_path / "turn_000.mp4.")) and here.endswith(".part")
    assert here.rsplit(".", 2)[1].split("-")[0] == str(os.getpid())
    assert child_pid != os.getpid() and there != here
    assert atomic.part_path(str(tmp_path / "turn_000.mp4")) != here  # and per write


@pytest.mark.slow
def test_three_concurrent_continues_leave_the_game_whole(game):
    """Acceptance of issue 53: three ``play --continue`` of one game at once, twice: each plays all its
    turns or is refused with one line before playing; game.json lists exactly the turns on disk; the
    game continues afterwards."""
    d, g = game
    for i in range(3):
        (d / f"c{i}.txt").write_text("\n".join([TEXTS[1 + i % 2], TEXTS[2 - i % 2]]) + "\n")  # two turns each
    want = _turns(g)
    for _ in range(2):
        procs = [subprocess.Popen([sys.executable, "-m", "animegamer_jax.commands.play", "--continue", str(g),
                                   str(d / f"c{i}.txt"), "--standin"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=child_env(), cwd=str(d)) for i in range(3)]
        outs = [p.communicate(timeout=120) for p in procs]
        results = [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]
        for rc, out, err in results:
            if rc == 0:
                assert [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("turn ")] == \
                    [f"turn {want + 1}", f"turn {want + 2}"], out
                want += 2
            else:
                assert rc == 2, err
                assert len(err.splitlines()) == 1 and "is being written by another process (pid " in err, err
                assert "turn " not in out
        assert any(rc == 0 for rc, _, _ in results)
        rec = json.load(open(g / "game.json"))
        assert len(rec["turns"]) == want
        assert sorted(n for n in os.listdir(g) if n.startswith("turn_") and n.endswith(".mp4")) == \
            [f"turn_{k:03d}.mp4" for k in range(want)]
        assert not [n for n in os.listdir(g) if n.endswith(".part")]
        assert layout.verify_game(str(g)) is None and not os.path.exists(layout.lock_path(str(g)))
    assert play.main(["--continue", str(g), str(d / "more.txt"), "--standin"]) == 0
    assert _turns(g) == want + 1 and layout.verify_game(str(g)) is None
