"""Soak of one writer per game folder (issue 53's acceptance): ``--writers`` concurrent
``play --continue`` of one game, ``--tries`` times, on the stand-in system.

    python -m benchmarks.continue_soak [--tries 20] [--writers 3] [--turns 2] [--busy 0]
                                       [--workdir DIR] [--out benchmarks/reports/continue_soak.json]

Each try starts the writers at once (each with its own ``--turns``-turn script) and checks, after
they end:

* every writer either played all its turns (exit 0, its ``turn N`` lines numbered on from the game's
  turns) or was refused before playing (exit 2, one stderr line naming the holder's pid and host, no
  ``turn`` line);
* game.json lists exactly the turns on disk (``turn_NNN.mp4`` 0..n-1, no ``.part`` file left), every
  listed file intact (``layout.verify_game``), the lock file gone;

and, after the last try, that the game continues (one more ``play --continue``). ``--busy N`` starts N
CPU-bound processes beside the writers for the whole soak (the host's own load counts too). Prints
one line per try and a summary; writes the figures as JSON. Exit status 1 when any check failed.
Not a test: timing decides who wins each try, and the checks hold whoever does.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

from animegamer_jax.game.folder import layout
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
         "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.",
         "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest.",
         "Character: Bunny; Motion: jump over a log; Background: night forest."]


def _env() -> dict:
    return dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR="",
                PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _play(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "animegamer_jax.commands.play", *args, "--standin"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)


def _burn() -> None:
    while True:
        pass


def _check_folder(game: str, want: int) -> list[str]:
    rec = json.load(open(os.path.join(game, layout.GAME_JSON)))
    names = os.listdir(game)
    problems = []
    if len(rec["turns"]) != want:
        problems.append(f"game.json lists {len(rec['turns'])} turns, the writers played {want}")
    videos = sorted(n for n in names if n.startswith("turn_") and n.endswith(".mp4"))
    if videos != [f"turn_{k:03d}.mp4" for k in range(len(rec["turns"]))]:
        problems.append(f"turn videos on disk {videos} differ from game.json's {len(rec['turns'])} turns")
    if any(n.endswith(".part") for n in names):
        problems.append("a .part file was left")
    why = layout.verify_game(game)
    if why is not None:
        problems.append(f"verify_game: {why}")
    if os.path.exists(layout.lock_path(game)):
        problems.append("the lock file was left")
    return problems


def soak(workdir: str, tries: int, writers_n: int, turns: int) -> dict:
    """Runs the soak in ``workdir``; returns the figures (``failures`` lists every failed check)."""
    first = os.path.join(workdir, "start.txt")
    open(first, "w").write(TEXTS[0] + "\n")
    out = os.path.join(workdir, "out")
    p = _play(first, "--out", out, "--game-id", "soak")
    _, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"the starting game failed: {err}")
    game = os.path.join(out, "soak")
    scripts = []
    for i in range(writers_n):
        path = os.path.join(workdir, f"w{i}.txt")
        open(path, "w").write("\n".join(TEXTS[1 + (i + k) % 3] for k in range(turns)) + "\n")
        scripts.append(path)
    want = 1
    rows, failures = [], []
    for t in range(tries):
        t0 = time.perf_counter()
        procs = [_play("--continue", game, s) for s in scripts]
        results = [(p.returncode, o, e) for p, (o, e) in zip(procs, [p.communicate(timeout=600) for p in procs])]
        wall = time.perf_counter() - t0
        played = refused = 0
        problems = []
        for rc, o, e in results:
            numbers = [ln.split(":")[0] for ln in o.splitlines() if ln.startswith("turn ")]
            if rc == 0:
                if numbers != [f"turn {want + k + 1}" for k in range(turns)]:
                    problems.append(f"a writer exited 0 with turns {numbers}, expected {want + 1}..{want + turns}")
                want += len(numbers)
                played += 1
            elif rc == 2 and len(e.splitlines()) == 1 and "is being written by another process (pid " in e \
                    and not numbers:
                refused += 1
            else:
                problems.append(f"a writer exited {rc} after turns {numbers}: {e.strip()[-300:]!r}")
        problems += _check_folder(game, want)
        rows.append({"try": t + 1, "played": played, "refused": refused, "wall_s": round(wall, 2),
                     "turns_after": want, "problems": problems})
        failures += [f"try {t + 1}: {p}" for p in problems]
        print(f"try {t + 1:2d}: {played} played all {turns} turns, {refused} refused before playing, game at "
              f"{want} turns, {wall:.1f} s{'; ' + '; '.join(problems) if problems else ''}", flush=True)
    last = os.path.join(workdir, "last.txt")
    open(last, "w").write(TEXTS[3] + "\n")
    p = _play("--continue", game, last)
    o, e = p.communicate(timeout=600)
    continued = p.returncode == 0 and f"turn {want + 1}: " in o
    if continued:
        want += 1
        failures += [f"after the soak: {x}" for x in _check_folder(game, want)]
    else:
        failures.append(f"the game did not continue after the soak (exit {p.returncode}): {e.strip()[-300:]!r}")
    return {"tries": tries, "writers": writers_n, "turns_per_writer": turns,
            "writers_played": sum(r["played"] for r in rows), "writers_refused": sum(r["refused"] for r in rows),
            "tries_with_one_winner": sum(r["played"] == 1 for r in rows),
            "turns_in_game": want, "continued_after": continued,
            "median_try_s": round(statistics.median(r["wall_s"] for r in rows), 2) if rows else None,
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
            "rows": rows, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--turns", type=int, default=2, help="turns each writer plays")
    ap.add_argument("--busy", type=int, default=0, help="CPU-bound processes started beside the writers")
    ap.add_argument("--workdir", default="", help="where the game is played (default: a temp folder, removed)")
    ap.add_argument("--out", default="", help="JSON file of the figures (default: none)")
    a = ap.parse_args(argv)
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(a.busy)]
    for b in burners:
        b.start()
    try:
        if a.workdir:
            os.makedirs(a.workdir, exist_ok=False)
            fig = soak(a.workdir, a.tries, a.writers, a.turns)
        else:
            with tempfile.TemporaryDirectory() as d:
                fig = soak(d, a.tries, a.writers, a.turns)
    finally:
        for b in burners:
            b.terminate()
    fig["busy_processes"] = a.busy
    print(f"{fig['tries']} tries x {fig['writers']} writers: {fig['writers_played']} played all their turns, "
          f"{fig['writers_refused']} refused before playing, {len(fig['failures'])} failed checks; the game has "
          f"{fig['turns_in_game']} turns and {'continued' if fig['continued_after'] else 'did NOT continue'} "
          f"after; median try {fig['median_try_s']} s (load {fig['load_avg_1m_at_end']} on {fig['cpus']} CPUs)")
    for f in fig["failures"]:
        print("FAILED:", f)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(fig, fh, indent=2)
            fh.write("\n")
    return 1 if fig["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
