"""Kill-anywhere harness (issue 31 item 3): kill a long command at seeded random moments, rerun it, check.

For each case (one user command at tiny size) :func:`run_case`

1. runs the command to completion once, the reference, and records its wall time (with
   ``warm_reference`` it first runs it once more, uncounted, to fill the compilation cache, and the
   two results must already agree);
2. then ``n`` times: starts it in a fresh folder, sends a signal (SIGKILL, or SIGINT / SIGTERM where
   the case handles them; chosen by the seeded generator) to its process group at a moment drawn
   uniformly from [5 %, 95 %] of the reference wall time, and checks that nothing half-written sits
   at a final path (the case's ``partial``); records what the killed run had reported done (printed
   turns, finished games, committed checkpoints, part files); reruns it the command's documented way
   (usually the same command line) unless it had already finished; then checks that the finished
   result equals the reference (``compare``: byte-identical game files except ``timings.json``, equal
   dataset records, the same labels file, the same losses in TensorBoard), that every piece reported
   done before the kill is intact (``intact``) and that no temp file is left (:func:`temp_files`);
3. returns a :class:`Row`: command, kills, reruns, invariant failures (one line each, prefixed with
   the kill's number, signal and moment).

:class:`TrainDamagedCase` (``train-damaged``) adds a fault after the kill: the newest committed
training checkpoint is damaged as a machine loss can leave it, and the rerun must resume from the
step before it.

``python -m tests.faults --n 10`` (``make faults``) runs every case and prints the table; ``--cases``
picks some, ``--keep`` keeps every run's folder (failing runs' folders are always kept).
tests/test_faults.py runs a few cheap cases with ``n=1`` in CI. What each fault leaves and how to
resume: docs/faults.md.

Children run with ``cwd`` = the checkout, ``JAX_PLATFORMS=cpu``, one device and
``PYTHONUNBUFFERED=1`` (a line a command printed before the kill is a line its user saw, as on a
terminal). Each child is the leader of its own process group, and signals go to the group, as a
terminal's Ctrl-C or a job scheduler's kill does.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from animegamer_jax import checkpoint

from animegamer_jax.io import fileio
from animegamer_jax.data import datasets, sample
from animegamer_jax.game.folder import layout
from animegamer_jax.train import metrics

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
LABELS = ROOT / "data" / "sample_labels.jsonl"
RELEASE = ROOT.parent / "shared" / "fixtures" / "release_tiny" / "release"
TINY_SYSTEM = ROOT / "checkpoints" / "tiny_system"

#: names of what the commands write while working and rename or remove when done: fileio's
#: ``.<name>.tmp-<hex>``, game folders' ``.tmp-<id>-<hex>`` and ``.animegamer-tmp``, train's
#: ``system.tmp``, orbax's ``<step>.orbax-checkpoint-tmp-<n>``, tfds' ``incomplete.*``, datasets.build's
#: ``.building-*``, caption's ``.<out>.parts``, convert release's ``.<dst>.partial-*``, Beam's temp folders
TEMP_NAME = re.compile(r"tmp|temp|^incomplete\.|^\.building-|\.parts$|\.partial-", re.IGNORECASE)
#: the moments of the kills: this fraction range of the reference run's wall time
SPREAD = (0.05, 0.95)
SIGNAL_NAMES = {signal.SIGKILL: "KILL", signal.SIGINT: "INT", signal.SIGTERM: "TERM"}
#: three instructions of the sample film's cast (the tiny system's words)
TURNS = ("Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
         "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest.",
         "Character: Bunny; Motion: gently sit under a tree; Background: evening meadow.")


class HarnessError(RuntimeError):
    """The harness cannot run a case (a reference run failed, an input is missing)."""


# -- files ---------------------------------------------------------------------------------------


def temp_files(root: Path) -> list[str]:
    """Paths (relative to ``root``) of every file or folder under ``root`` whose name is a temp name
    (:data:`TEMP_NAME`); a matching folder is listed once, not its contents."""
    found = []
    if not root.exists():
        return found
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root)
        for name in sorted(dirs):
            if TEMP_NAME.search(name):
                found.append(str(rel / name))
        dirs[:] = sorted(d for d in dirs if not TEMP_NAME.search(d))
        found += [str(rel / f) for f in sorted(files) if TEMP_NAME.search(f)]
    return found


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_hashes(folder: Path, skip: Sequence[str] = ()) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` whose name is not in ``skip``."""
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in skip}


def diff_hashes(ref: dict[str, str], got: dict[str, str], what: str) -> list[str]:
    """One line per file missing, extra or different in ``got`` against ``ref`` (at most 4 named)."""
    missing = sorted(set(ref) - set(got))
    extra = sorted(set(got) - set(ref))
    differ = sorted(k for k in set(ref) & set(got) if ref[k] != got[k])
    out = []
    for label, names in (("missing", missing), ("extra", extra), ("differ from the reference", differ)):
        if names:
            more = f" and {len(names) - 4} more" if len(names) > 4 else ""
            out.append(f"{what}: {len(names)} file(s) {label}: {', '.join(names[:4])}{more}")
    return out


def game_folders(out: Path) -> list[Path]:
    """The non-hidden folders directly under ``out`` (game folders, finished or not)."""
    return sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")) if out.is_dir() else []


def game_hashes(folder: Path) -> dict[str, str]:
    """:func:`file_hashes` of a game folder without ``timings.json`` (wall times differ run to run)."""
    return file_hashes(folder, skip=(layout.TIMINGS_JSON,))


def game_turns(folder: Path) -> int:
    """Turns in a game folder's game.json (0 when it has none or cannot be read)."""
    try:
        return len(json.loads((folder / layout.GAME_JSON).read_text())["turns"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def check_game_folders(out: Path, where: str) -> list[str]:
    """Every game folder in ``out`` verifies (layout.verify_game: marker, game.json, sizes, sha256)."""
    fails = []
    for g in game_folders(out):
        why = layout.verify_game(str(g))
        if why is not None:
            fails.append(f"{where}: {g.name}/ at its final path is not a whole game: {why}")
    return fails


def game_prefix_matches(folder: Path, ref: Path, turns: int) -> list[str]:
    """The first ``turns`` turns saved in ``folder`` equal the reference game's: their clip files
    byte for byte and their game.json turn records (instruction, states, meters, seeds)."""
    fails = []
    for k in range(turns):
        for name in (f"turn_{k:03d}.mp4", f"turn_{k:03d}.gif"):
            whole = (folder / name).is_file() and sha256(folder / name) == sha256(ref / name)
            if (ref / name).is_file() and not whole:
                fails.append(f"saved turn {k + 1} ({name}) differs from the uninterrupted game's")
    try:
        got = json.loads((folder / layout.GAME_JSON).read_text())["turns"][:turns]
        want = json.loads((ref / layout.GAME_JSON).read_text())["turns"][:turns]
        if got != want:
            fails.append(f"game.json's first {turns} turn record(s) differ from the uninterrupted game's")
    except (OSError, ValueError, KeyError) as e:
        fails.append(f"{folder.name}/game.json unreadable: {e}")
    return fails


def dataset_records(data_dir: Path) -> tuple[dict, list[dict]]:
    """(metadata.json, every train record as ``{field: np.ndarray}``) of the tfds dataset in ``data_dir``.

    Raises:
      datasets.DatasetError: no complete dataset there.
    """
    version = datasets.find(str(data_dir))
    meta = json.loads((Path(str(version)) / "metadata.json").read_text())
    source = datasets.open_split(str(data_dir))
    return meta, [{k: np.asarray(v) for k, v in source[i].items()} for i in range(len(source))]


def diff_records(ref: tuple[dict, list[dict]], got: tuple[dict, list[dict]], what: str) -> list[str]:
    """One line when metadata or any record (field by field, exact) differs."""
    if ref[0] != got[0]:
        return [f"{what}: metadata.json differs from the reference"]
    if len(ref[1]) != len(got[1]):
        return [f"{what}: {len(got[1])} records, {len(ref[1])} in the reference"]
    for i, (a, b) in enumerate(zip(ref[1], got[1])):
        if sorted(a) != sorted(b) or any(a[k].shape != b[k].shape or not np.array_equal(a[k], b[k]) for k in a):
            return [f"{what}: record {i} differs from the reference"]
    return []


def process_losses(logdir: Path) -> list[list[tuple[int, float]]]:
    """The ``loss`` scalars of each event file under ``logdir`` (one per training process that wrote
    there, oldest first by the timestamp in the file name) as ``[(step, value), ...]``."""
    runs = []
    files = sorted((p for p in logdir.iterdir() if "tfevents" in p.name),
                   key=lambda p: int(re.search(r"tfevents\.(\d+)", p.name).group(1))) if logdir.is_dir() else []
    for f in files:
        with tempfile.TemporaryDirectory() as one:  # train.metrics.read_scalars reads a folder
            os.symlink(f, os.path.join(one, f.name))
            runs.append(metrics.read_scalars(one).get("loss", []))
    return runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- processes -----------------------------------------------------------------------------------


def child_env(extra: dict | None = None) -> dict:
    """The environment of every child: this checkout on PYTHONPATH, CPU, one device, unbuffered output."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", JAX_THREEFRY_PARTITIONABLE="0",
               XLA_FLAGS="--xla_force_host_platform_device_count=1", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def _default_signals() -> None:
    """In the forked child before exec: SIGINT and SIGTERM at their defaults. A process started from a
    background job of a shell (``cmd &``, nohup, CI runners) inherits an ignored SIGINT, and Python
    then never raises KeyboardInterrupt: its Ctrl-C would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Child:
    """One command in its own process group; stdout / stderr go to ``<log>.out`` / ``<log>.err``.

    ``stdin`` text is written at once and the pipe closed (a user piping a file into the command).
    """

    def __init__(self, argv: Sequence[str], log: Path, env: dict, stdin: str | None = None):
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.argv = list(argv)
        self._out = open(f"{log}.out", "w")
        self._err = open(f"{log}.err", "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdout=self._out, stderr=self._err,
                                     stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=_default_signals)
        if stdin is not None:
            try:
                self.proc.stdin.write(stdin.encode("utf-8"))
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the child's process group (nothing when it is gone)."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait_until(self, at: float) -> bool:
        """Sleeps until ``at`` seconds after the start; False when the child exited before."""
        while self.elapsed < at:
            if self.proc.poll() is not None:
                return False
            time.sleep(min(0.01, max(0.0, at - self.elapsed)))
        return self.proc.poll() is None

    def wait_for(self, ready, timeout: float = 120.0) -> bool:
        """Polls ``ready()`` until it is true; False when the child exited first or ``timeout``
        seconds passed."""
        end = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > end:
                return False
            time.sleep(0.01)
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int | None:
        """The exit status (negative: killed by that signal), or None after ``timeout`` seconds, when
        the group is killed. Leftover processes of the group are killed either way."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        self.signal(signal.SIGKILL)
        if rc is None:
            self.proc.wait(30)
        self._out.close()
        self._err.close()
        return rc

    @property
    def stdout(self) -> str:
        return Path(f"{self.log}.out").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return Path(f"{self.log}.err").read_text(errors="replace")

    def tail(self, lines: int = 3) -> str:
        text = (self.stdout + self.stderr).strip().splitlines()
        return " | ".join(text[-lines:])[-400:]


# -- cases ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Attempt:
    """One kill: whether the signal was delivered, the reruns it took, the invariant failures."""
    delivered: bool
    reruns: int
    failures: list[str]


class Case:
    """One command under test. Subclasses define ``name``, ``signals``, :meth:`command` and the checks.

    The default flow (:meth:`attempt`) is: start, signal, :meth:`partial`, :meth:`reported_done`,
    :meth:`after_signal`, rerun unless :meth:`finished`, :meth:`compare`, :meth:`intact`, temp files.
    """

    name = ""
    signals: tuple[int, ...] = (signal.SIGKILL, signal.SIGINT)
    #: seconds a child may run: ``timeout_factor`` x the reference wall time + 120
    timeout_factor = 4.0

    def __init__(self, inputs: "Inputs", env: dict):
        self.inputs = inputs
        self.env = env

    # what to run
    def setup(self) -> None:
        """Makes the case's shared inputs (once per harness work folder)."""

    def command(self, out: Path) -> list[str]:
        raise NotImplementedError

    def rerun_command(self, out: Path) -> list[str]:
        return self.command(out)

    def stdin(self) -> str | None:
        return None

    def armed(self, out: Path) -> bool:
        """Whether a signal sent now lands in the part of the run under test; :meth:`attempt` sends it
        at the drawn moment or, when later, once this holds (a real command: always, any moment is
        a moment a user may pick)."""
        return True

    # checks
    def finished(self, out: Path) -> bool:
        """True when the killed run had already finished its work (no rerun needed)."""
        return False

    def partial(self, out: Path) -> list[str]:
        """Right after the kill: what sits half-written at a final path."""
        return []

    def reported_done(self, out: Path, child: Child, ref: Path) -> object:
        """Right after the kill: what the killed run reported done (the case's own record)."""
        return None

    def after_signal(self, sig: int, rc: int | None, child: Child, out: Path, done: object) -> list[str]:
        """Right after a SIGINT / SIGTERM that was delivered: the exit status and messages."""
        return []

    def compare(self, ref: Path, out: Path) -> list[str]:
        """After the rerun: the finished result against the reference."""
        raise NotImplementedError

    def intact(self, done: object, ref: Path, out: Path, rerun: Child | None) -> list[str]:
        """After the rerun (``rerun``: None when none was needed): every piece reported done before
        the kill is still whole."""
        return []

    # flow
    def timeout(self, ref_s: float) -> float:
        return self.timeout_factor * ref_s + 120.0

    def reference(self, out: Path, logs: Path) -> float:
        """Runs the command to completion; returns its wall time in seconds.

        Raises:
          HarnessError: it failed.
        """
        child = Child(self.command(out), logs, self.env, self.stdin())
        rc = child.wait(3600)
        if rc != 0:
            raise HarnessError(f"{self.name}: the uninterrupted run exited {rc}: {child.tail()} (logs {logs}.*)")
        return child.elapsed

    def attempt(self, out: Path, logs: Path, ref: Path, ref_s: float, sig: int, at: float) -> Attempt:
        child = Child(self.command(out), logs.with_name(logs.name + "-killed"), self.env, self.stdin())
        delivered = child.wait_until(at) and child.wait_for(lambda: self.armed(out))
        if delivered:
            child.signal(sig)
        rc = child.wait(self.timeout(ref_s))
        fails = []
        if rc is None:
            fails.append(f"still running {self.timeout(ref_s):.0f} s after SIG{SIGNAL_NAMES[sig]}; killed")
        fails += self.partial(out)
        done = self.reported_done(out, child, ref)
        if delivered and sig != signal.SIGKILL:
            fails += self.after_signal(sig, rc, child, out, done)
        again = None
        if not self.finished(out):
            again = Child(self.rerun_command(out), logs.with_name(logs.name + "-rerun"), self.env, self.stdin())
            rc2 = again.wait(self.timeout(ref_s))
            if rc2 != 0:
                fails.append(f"the rerun exited {rc2}: {again.tail()}")
        fails += self.compare(ref, out)
        fails += self.intact(done, ref, out, again)
        fails += [f"temp left after the final run: {p}" for p in temp_files(out)]
        return Attempt(delivered, int(again is not None), fails)


@dataclasses.dataclass
class Inputs:
    """Inputs shared by the cases, made on first use under ``root``: the sample film (160x90) and
    its tiny dataset (configs/tiny.py, the 7 clips of data/sample_labels.jsonl)."""
    root: Path
    env: dict

    @property
    def film(self) -> Path:
        path = self.root / "sample_film.mp4"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            part = path.with_name("part-" + path.name)  # renamed once whole: a failed run leaves no film
            sample.make_sample_film(str(part), size=(160, 90))
            os.replace(part, path)
        return path

    @property
    def dataset(self) -> Path:
        path = self.root / "tiny"
        if not path.exists():
            child = Child(PrepareCase(self, self.env).command(path.parent, path.name), self.root / "logs" / "prepare",
                          self.env)
            if child.wait(600) != 0:
                raise HarnessError(f"preparing the shared dataset failed: {child.tail()}")
        return path


def system_flags(system: str) -> list[str]:
    """play / generate / web flags of ``system``: "standin" (random tiny system, seconds) or
    "checkpoint" (checkpoints/tiny_system, compiles for ~15 s)."""
    return ["--standin"] if system == "standin" else ["--checkpoint", str(TINY_SYSTEM)]


def written_once(path: Path, text: str) -> Path:
    """``path``, written with ``text`` (atomically) when it does not exist yet: a shared input of the runs."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fileio.write_text_atomic(str(path), text)
    return path


class GameCase(Case):
    """A command that plays games with ``system`` (:func:`system_flags`), killed by any of the three signals."""

    signals = (signal.SIGKILL, signal.SIGINT, signal.SIGTERM)

    def __init__(self, inputs, env, system="standin"):
        super().__init__(inputs, env)
        self.system = system


class PlayScriptCase(GameCase):
    """``play SCRIPT``: the game is written once, when it ends; reruns add ``--overwrite``."""

    name = "play (script)"

    def script(self) -> Path:
        return written_once(self.inputs.root / "game.txt", "\n".join(TURNS) + "\n")

    def setup(self) -> None:
        self.script()

    def command(self, out: Path) -> list[str]:
        return [PY, "-m", "animegamer_jax.commands.play", str(self.script()), "--game-id", "g", "--out", str(out / "games"),
                *system_flags(self.system)]

    def rerun_command(self, out: Path) -> list[str]:
        return self.command(out) + ["--overwrite"]

    def partial(self, out: Path) -> list[str]:
        return check_game_folders(out / "games", "after the kill")

    def reported_done(self, out: Path, child: Child, ref: Path) -> object:
        g = out / "games" / "g"
        return game_hashes(g) if "outputs:" in child.stdout and g.is_dir() else None

    def compare(self, ref: Path, out: Path) -> list[str]:
        got = out / "games" / "g"
        if not got.is_dir():
            return ["no game folder after the rerun"]
        return diff_hashes(game_hashes(ref / "games" / "g"), game_hashes(got), "game g")

    def intact(self, done, ref: Path, out: Path, rerun: Child | None) -> list[str]:
        if done is None:
            return []
        return diff_hashes(done, game_hashes(out / "games" / "g"), "the game reported written before the kill")


class _SavedEachTurnCase(PlayScriptCase):
    """A ``play`` that saves the game after every turn: :meth:`reported_done` returns (fails, turns
    saved); a SIGINT / SIGTERM must say how many turns are saved (or that no new turn was played, when
    none was), end with exit status 128 + signal and never print an ``error:`` line."""

    #: turns the game held before the run; ``program``: the command as the messages name it
    BASE = 0
    program = "play"

    def after_signal(self, sig, rc, child, out, done) -> list[str]:
        fails = []
        saved = done[1]
        said = re.search(r"interrupted: (\d+) turn\(s\) saved", child.stderr)
        if said and int(said.group(1)) != saved:
            fails.append(f"SIG{SIGNAL_NAMES[sig]} said {said.group(1)} turn(s) saved; the saved game holds {saved}")
        if "interrupted: no turn was played" in child.stderr and saved > self.BASE:
            fails.append(f"SIG{SIGNAL_NAMES[sig]} said no turn was played; the saved game holds {saved}")
        # -sig: the signal came before play installed its handler (startup), when no new turn is saved yet
        if rc not in (0, 128 + sig) and not (rc == -sig and saved == self.BASE):
            fails.append(f"SIG{SIGNAL_NAMES[sig]} ended {self.program} with exit status {rc} (expected {128 + sig})")
        for line in child.stderr.splitlines():
            if line.startswith("error:"):
                fails.append(f"Ctrl-C reported as an error: {line[:160]}")
        return fails

    def intact(self, done, ref: Path, out: Path, rerun: Child | None) -> list[str]:
        return done[0]


class PlayInteractiveCase(_SavedEachTurnCase):
    """``play -`` with the instructions piped on stdin: the game is saved after every turn; every
    turn printed (``turn k: ...``) must already be saved; a Ctrl-C says how many turns are saved and is
    never a usage error. Reruns replay the whole input with ``--overwrite``."""

    name = "play (interactive)"

    def stdin(self) -> str | None:
        return "\n".join(TURNS) + "\n"

    def command(self, out: Path) -> list[str]:
        return [PY, "-m", "animegamer_jax.commands.play", "-", "--game-id", "g", "--out", str(out / "games"),
                *system_flags(self.system)]

    def reported_done(self, out: Path, child: Child, ref: Path) -> object:
        printed = len(re.findall(r"^turn \d+: ", child.stdout, re.MULTILINE))
        g = out / "games" / "g"
        saved = game_turns(g) if g.is_dir() else 0
        fails = []
        if saved < printed:
            fails.append(f"turn {printed} was printed as played but the saved game holds {saved} turn(s)")
        if saved:
            fails += game_prefix_matches(g, ref / "games" / "g", saved)
        return fails, saved


class PlayContinueCase(_SavedEachTurnCase):
    """``play --continue GAME MORE.txt``: a saved one-turn game (made once by ``play``, copied into each
    run's folder) gets two more turns, each saved before it is printed. After a kill every turn printed
    (``turn k:``, k counted from the game's start) is saved, the saved turns equal the reference's and
    the folder verifies (a continued game stays loadable); the rerun continues the same folder with the
    instructions not yet saved (none left: ``play --continue GAME -`` with empty stdin, which remakes
    the derived game video and contact sheet) and must give the reference game byte for byte."""

    name = "play (continue)"
    program = "play --continue"
    #: turns of the saved game the continue starts from; the rest of TURNS are continued
    BASE = 1

    def base_game(self) -> Path:
        folder = self.inputs.root / "continue-base" / "games" / "g"
        if not folder.is_dir():
            script = self.inputs.root / "continue-base.txt"
            script.parent.mkdir(parents=True, exist_ok=True)
            fileio.write_text_atomic(str(script), "\n".join(TURNS[: self.BASE]) + "\n")
            child = Child([PY, "-m", "animegamer_jax.commands.play", str(script), "--game-id", "g", "--out",
                           str(folder.parent), *system_flags(self.system)], self.inputs.root / "logs" / "continue-base",
                          self.env)
            if child.wait(600) != 0:
                raise HarnessError(f"{self.name}: making the saved game failed: {child.tail()}")
        return folder

    def more(self, first: int) -> Path:
        """A script of TURNS[first:] (the instructions a continue still has to play)."""
        return written_once(self.inputs.root / f"continue-from{first}.txt", "\n".join(TURNS[first:]) + "\n")

    def setup(self) -> None:
        self.base_game()
        self.more(self.BASE)

    def command(self, out: Path) -> list[str]:
        g = out / "games" / "g"
        if not g.exists():  # each run starts from its own copy of the saved game
            shutil.copytree(self.base_game(), g)
        return [PY, "-m", "animegamer_jax.commands.play", "--continue", str(g), str(self.more(self.BASE)),
                *system_flags(self.system)]

    def rerun_command(self, out: Path) -> list[str]:
        g = out / "games" / "g"
        saved = game_turns(g)
        rest = [str(self.more(saved))] if saved < len(TURNS) else ["-"]
        return [PY, "-m", "animegamer_jax.commands.play", "--continue", str(g), *rest, *system_flags(self.system)]

    def reported_done(self, out: Path, child: Child, ref: Path) -> object:
        printed = max((int(k) for k in re.findall(r"^turn (\d+): ", child.stdout, re.MULTILINE)), default=0)
        g = out / "games" / "g"
        saved = game_turns(g) if g.is_dir() else 0
        fails = []
        if saved < max(printed, self.BASE):
            fails.append(f"turn {printed} was printed as played (the game had {self.BASE} before) but the saved "
                         f"game holds {saved} turn(s)")
        if saved:
            fails += game_prefix_matches(g, ref / "games" / "g", saved)
        return fails, saved


class GenerateCase(GameCase):
    """``generate GAMES.jsonl``: games are saved one by one as they finish; the same command resumes,
    skipping the finished games (which must stay untouched) and replaying the rest."""

    name = "generate"
    GAMES = 4

    def jsonl(self) -> Path:
        games = [{"game_id": f"g{i}", "seed": i, "turns": [TURNS[i % 3], TURNS[(i + 1) % 3]]}
                 for i in range(self.GAMES)]
        return written_once(self.inputs.root / "games.jsonl", "".join(json.dumps(g) + "\n" for g in games))

    def setup(self) -> None:
        self.jsonl()

    def command(self, out: Path) -> list[str]:
        return [PY, "-m", "animegamer_jax.commands.generate", str(self.jsonl()), "--out", str(out / "games"),
                *system_flags(self.system)]

    def partial(self, out: Path) -> list[str]:
        return check_game_folders(out / "games", "after the kill")

    def reported_done(self, out: Path, child: Child, ref: Path) -> object:
        return {g.name: (game_hashes(g), (g / layout.GAME_JSON).stat().st_mtime_ns)
                for g in game_folders(out / "games") if layout.verify_game(str(g)) is None}

    def compare(self, ref: Path, out: Path) -> list[str]:
        fails = []
        want, got = [g.name for g in game_folders(ref / "games")], [g.name for g in game_folders(out / "games")]
        if want != got:
            return [f"games {got} after the rerun, {want} in the reference"]
        for name in want:
            fails += diff_hashes(game_hashes(ref / "games" / name), game_hashes(out / "games" / name), f"game {name}")
        return fails

    def intact(self, done, ref: Path, out: Path, rerun: Child | None) -> list[str]:
        fails = []
        for name, (hashes, mtime) in done.items():
            g = out / "games" / name
            fails += diff_hashes(hashes, game_hashes(g), f"game {name} finished before the kill")
            if g.is_dir() and (g / layout.GAME_JSON).stat().st_mtime_ns != mtime:
                fails.append(f"game {name} was finished before the kill but the rerun replayed it")
        return fails


class WebPlayer:
    """A player of the web app over HTTP (a session cookie, ``POST /api/turn`` streams read to the end)."""

    def __init__(self, port: int, timeout: float = 300.0):
        self.port = port
        self.timeout = timeout
        self.cookie = ""
        self.done = 0
        self.accepted = 0  # turn requests answered 200 (their stream started)
        self.game_id = ""
        self.error = ""

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, list[str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            headers = {"Content-Type": "application/json"}
            if self.cookie:
                headers["Cookie"] = self.cookie
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
            resp = conn.getresponse()
            if method == "POST" and resp.status == 200:
                self.accepted += 1
            cookie = resp.getheader("set-cookie")
            if cookie:
                self.cookie = cookie.split(";")[0]
            lines = []
            while True:
                line = resp.readline()
                if not line:
                    break
                lines.append(line.decode("utf-8"))
                if method == "POST" and json.loads(line).get("event") in ("done", "error"):
                    break
            return resp.status, lines
        finally:
            conn.close()

    def ready(self) -> bool:
        """True once the page (``GET /``) answers 200 (and the session cookie is set)."""
        try:
            status, _ = self._request("GET", "/")
            return status == 200
        except OSError:
            return False

    def play(self, turns: Sequence[str]) -> None:
        """Plays ``turns`` one after the other; ``done`` counts the turns whose ``done`` event arrived.
        Stops at the first failure (``error`` says which)."""
        try:
            for line in turns:
                status, lines = self._request("POST", "/api/turn", {"line": line})
                events = [json.loads(x) for x in lines]
                if status != 200 or not events or events[-1].get("event") != "done":
                    self.error = f"turn {self.done + 1}: HTTP {status} {lines[-1:] if lines else ''}"
                    return
                self.done += 1
                self.game_id = events[-1]["state"]["game_id"]
        except (OSError, ValueError, http.client.HTTPException) as e:
            self.error = f"turn {self.done + 1}: {type(e).__name__}: {e}"


class ServeCase(GameCase):
    """``python -m animegamer_jax.commands.web``: a player plays the three turns over HTTP; the server is killed
    at a moment spread over the turns (the reference's time from the first request to the last
    ``done``). Every turn whose ``done`` arrived must be saved and equal the uninterrupted game's.
    Then the server is started again on the same ``--out`` and the game played again from its start
    in a new session (the old game stays on disk); the new game must equal the reference (clip files
    byte for byte, game.json but for its game id) and no temp folder may be left."""

    name = "serve (mid-turn)"

    def command(self, out: Path, port: int = 0) -> list[str]:
        return [PY, "-m", "animegamer_jax.commands.web", "--port", str(port), "--out", str(out / "games"),
                *system_flags(self.system)]

    def _start(self, out: Path, log: Path) -> tuple[Child, WebPlayer]:
        port = free_port()
        child = Child(self.command(out, port), log, self.env)
        player = WebPlayer(port)
        deadline = time.monotonic() + 600
        while not player.ready():
            if child.proc.poll() is not None or time.monotonic() > deadline:
                child.wait(1)
                raise HarnessError(f"{self.name}: the server did not start: {child.tail()} (logs {log}.*)")
            time.sleep(0.2)
        return child, player

    def _stop(self, child: Child) -> list[str]:
        child.signal(signal.SIGINT)
        rc = child.wait(60)
        return [] if rc == 0 else [f"the server exited {rc} on Ctrl-C after the game: {child.tail()}"]

    def reference(self, out: Path, logs: Path) -> float:
        child, player = self._start(out, logs)
        t0 = time.monotonic()
        player.play(TURNS)
        play_s = time.monotonic() - t0
        stop = self._stop(child)
        if player.error or stop:
            raise HarnessError(f"{self.name}: the uninterrupted game failed: {player.error or stop[0]}")
        fileio.write_text_atomic(str(out / "game_id"), player.game_id)
        return play_s

    def compare(self, ref: Path, out: Path) -> list[str]:
        return []  # in attempt(): the replayed game

    @staticmethod
    def _same_game(ref: Path, got: Path) -> list[str]:
        skip = (layout.TIMINGS_JSON, layout.GAME_JSON, "index.html", layout.MARKER)
        fails = diff_hashes(file_hashes(ref, skip), file_hashes(got, skip), "the replayed game")
        a, b = (json.loads((d / layout.GAME_JSON).read_text()) for d in (ref, got))
        for rec in (a, b):
            rec.pop("game_id", None)
            rec.pop("files", None)
            rec.get("save", {}).get("derived", {}).get("files", {}).pop("index.html", None)  # names the game id
        if a != b:
            fails.append("the replayed game's game.json differs from the reference (game id aside)")
        return fails

    def attempt(self, out: Path, logs: Path, ref: Path, ref_s: float, sig: int, at: float) -> Attempt:
        ref_game = ref / "games" / (ref / "game_id").read_text()
        child, player = self._start(out, logs.with_name(logs.name + "-killed"))
        driver = threading.Thread(target=player.play, args=(TURNS,), daemon=True)
        driver.start()
        delivered = child.wait_until(child.elapsed + at)
        if delivered:
            child.signal(sig)
        rc = child.wait(self.timeout(ref_s))
        driver.join(60)
        done_before = player.done  # every turn whose "done" event reached the player
        fails = [] if delivered else [f"the server exited by itself before the signal: {child.tail()}"]
        if rc is None:
            fails.append(f"still running {self.timeout(ref_s):.0f} s after SIG{SIGNAL_NAMES[sig]}; killed")
        elif delivered and sig != signal.SIGKILL and player.accepted > player.done:
            fails.append(f"SIG{SIGNAL_NAMES[sig]}: turn {player.accepted} was accepted but never finished (the "
                         f"server did not finish the turn in progress before exiting {rc})")
        games = out / "games"
        fails += check_game_folders(games, "after the kill")
        if done_before:
            g = games / player.game_id
            saved = game_turns(g) if g.is_dir() else 0
            if saved < done_before:
                fails.append(f"{done_before} turn(s) were reported done but the saved game holds {saved}")
            fails += game_prefix_matches(g, ref_game, min(saved, done_before)) if saved else []
        killed_game = player.game_id
        # restart on the same folder, play the game again from its start in a new session
        child, again = self._start(out, logs.with_name(logs.name + "-restarted"))
        again.play(TURNS)
        fails += self._stop(child)
        if again.error:
            fails.append(f"after the restart: {again.error}")
        else:
            fails += self._same_game(ref_game, games / again.game_id)
        if killed_game and killed_game != again.game_id and (games / killed_game).is_dir():
            why = layout.verify_game(str(games / killed_game))
            if why is not None:
                fails.append(f"the killed game's folder is damaged after the restart: {why}")
        fails += [f"temp left after the final run: {p}" for p in temp_files(out)]
        return Attempt(delivered, 1, fails)


class TrainCase(Case):
    """``python -m animegamer_jax.commands.train`` of one phase at tiny size on the shared 7-clip dataset,
    ``num_steps`` steps, a checkpoint every step, every loss logged. SIGTERM / SIGINT (preemption,
    Ctrl-C) must save at a step boundary and exit 0 saying how to resume; the rerun (same command)
    resumes from the newest committed checkpoint, and every loss in TensorBoard equals the
    uninterrupted run's at the same step."""

    signals = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)

    def __init__(self, inputs, env, phase: str, num_steps: int = 8):
        super().__init__(inputs, env)
        self.phase = phase
        self.num_steps = num_steps
        self.name = f"train {phase}"

    def setup(self) -> None:
        self.inputs.dataset

    def command(self, out: Path) -> list[str]:
        ds = str(self.inputs.dataset)
        return [PY, "-m", "animegamer_jax.commands.train", "--config=configs/tiny.py", f"--config.data.dataset_dir={ds}",
                f"--config.train.vae_dataset_dir={ds}", "--config.train.vae_eval_dataset_dir=",
                f"--config.train.phase={self.phase}", f"--config.train.num_steps={self.num_steps}",
                "--config.train.checkpoint_every=1", "--config.train.log_every=1", f"--workdir={out / 'run'}",
                "--fast_compile"]

    @staticmethod
    def _whole(out: Path, step: int) -> bool:
        d = out / "run" / "checkpoints" / str(step)
        return (d / "commit_success.txt").is_file() or (d / "_CHECKPOINT_METADATA").is_file()

    @staticmethod
    def committed(out: Path) -> list[int]:
        ckpts = out / "run" / "checkpoints"
        return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.is_dir() else []

    def finished(self, out: Path) -> bool:
        return checkpoint.is_complete(str(out / "run" / "system"))

    def partial(self, out: Path) -> list[str]:
        fails = []
        steps = self.committed(out)
        # the newest step folder is the one a resume picks; an older one without orbax's files is one
        # being deleted (train.keep_checkpoints), harmless when the rerun finishes removing it
        if steps and not self._whole(out, steps[-1]):
            fails.append(f"checkpoints/{steps[-1]}, the newest, is at its final path but not committed")
        system = out / "run" / "system"
        if system.exists():
            try:
                checkpoint.verify_checkpoint(str(system), "full")
            except (checkpoint.CheckpointIntegrityError, checkpoint.SystemCheckpointError) as e:
                fails.append(f"run/system at its final path is not a whole checkpoint: {str(e)[:160]}")
        return fails

    def reported_done(self, out: Path, child: Child, ref: Path) -> object:
        return [s for s in self.committed(out) if self._whole(out, s)]

    def after_signal(self, sig, rc, child, out, done) -> list[str]:
        text = child.stdout + child.stderr
        if "compiled and ran step" not in text or self.finished(out):
            return []  # before the training loop (imports, compile) or after it: nothing to save
        fails = []
        if rc != 0:
            fails.append(f"SIG{SIGNAL_NAMES[sig]} in the training loop: exit {rc}, 0 expected (save and exit)")
        if "resume" not in child.stderr:
            fails.append(f"SIG{SIGNAL_NAMES[sig]} in the training loop: no line saying how to resume")
        if not done:
            fails.append(f"SIG{SIGNAL_NAMES[sig]} in the training loop: no checkpoint saved")
        return fails

    def compare(self, ref: Path, out: Path) -> list[str]:
        want = dict(metrics.read_scalars(str(ref / "run" / "tensorboard"))["loss"])
        fails = []
        for k, got in enumerate(process_losses(out / "run" / "tensorboard")):
            wrong = sorted({s for s, v in got if want.get(s) != v})
            if not wrong:
                continue
            first = min(s for s, _ in got)
            who = ("the signalled run" if k == 0 else
                   "the rerun, which started from step 1" if first == 1 else
                   f"the rerun, which resumed at step {first}")
            worst = max(abs(v - want[s]) / max(abs(want[s]), 1e-30) for s, v in got if s in wrong and s in want)
            fails.append(f"loss differs from the uninterrupted run's at step(s) {wrong} logged by {who} "
                         f"(largest relative difference {worst:.1e})")
        if not checkpoint.is_complete(str(out / "run" / "system")):
            fails.append("no complete run/system after the rerun")
        torn = [s for s in self.committed(out) if not self._whole(out, s)]
        if torn:
            fails.append(f"step folder(s) {torn} without orbax's commit files left after the rerun")
        return fails

    def intact(self, done, ref: Path, out: Path, rerun: Child | None) -> list[str]:
        fails = []
        logged = {s for s, _ in metrics.read_scalars(str(out / "run" / "tensorboard")).get("loss", [])}
        lost = sorted(set(range(1, max(done, default=0) + 1)) - logged)
        if lost:
            fails.append(f"loss of step(s) {lost} missing from TensorBoard: logged before the kill, not flushed "
                         f"although checkpoint {max(done)} was committed (the rerun resumes after them)")
        missing = sorted(set(range(max(done, default=0) + 1, self.num_steps + 1)) - logged)
        if missing:
            fails.append(f"loss of step(s) {missing} missing from TensorBoard after the rerun")
        if not done or rerun is None:
            return fails
        m = re.search(r"resumed from \S+ at step (\d+)", rerun.stdout + rerun.stderr)
        if m is None:
            fails.append(f"checkpoint step {max(done)} was committed before the kill but the rerun did not resume")
        elif int(m.group(1)) != max(done):
            fails.append(f"the rerun resumed at step {m.group(1)}, the newest committed checkpoint was {max(done)}")
        return fails


class TrainDamagedCase(TrainCase):
    """``train`` after a machine loss that damaged its newest checkpoint (a file renamed into place just
    before a power cut can come back empty or short): the run is SIGKILLed once step k is committed in
    ``checkpoints/`` (k from the drawn moment: 2 .. num_steps - 1), then the newest committed step is
    damaged, its data JSON emptied (k even) or its largest array file cut in half (k odd). The rerun
    (the same command) must name the damaged step in one line on stderr, keep it aside, unchanged, as
    ``<step>.damaged-1``, resume from the step before it, and finish with the uninterrupted run's
    losses (:meth:`TrainCase.compare`, :meth:`TrainCase.intact`)."""

    signals = (signal.SIGKILL,)

    def __init__(self, inputs, env, phase: str, num_steps: int = 8):
        super().__init__(inputs, env, phase, num_steps)
        self.name = f"train {phase}, newest checkpoint damaged"

    @staticmethod
    def damage(step_dir: Path, k: int) -> tuple[str, int]:
        """Damages a committed step folder; returns (the file, relative to it; its size now)."""
        if k % 2 == 0:
            path = step_dir / "data" / "process_0-of-1.json"
        else:  # the array data files are in OCDBT's d/ folders
            path = max((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
                       key=lambda p: p.stat().st_size)
        with open(path, "r+b") as f:
            f.truncate(0 if k % 2 == 0 else path.stat().st_size // 2)
        return str(path.relative_to(step_dir)), path.stat().st_size

    def attempt(self, out: Path, logs: Path, ref: Path, ref_s: float, sig: int, at: float) -> Attempt:
        frac = (at / ref_s - SPREAD[0]) / (SPREAD[1] - SPREAD[0])
        k = min(self.num_steps - 1, 2 + int(frac * (self.num_steps - 2)))
        child = Child(self.command(out), logs.with_name(logs.name + "-killed"), self.env)
        while child.proc.poll() is None and child.elapsed < self.timeout(ref_s):
            if max((s for s in self.committed(out) if self._whole(out, s)), default=0) >= k:
                break
            time.sleep(0.01)
        delivered = child.proc.poll() is None
        child.signal(signal.SIGKILL)
        child.wait(30)
        steps = [s for s in self.committed(out) if self._whole(out, s)]
        if not delivered or len(steps) < 2 or self.finished(out):
            return Attempt(False, 0, [] if not delivered else [f"killed with {len(steps)} committed step(s), "
                                                               f"2 needed (k={k})"])
        fails = self.partial(out)
        newest, prev = steps[-1], steps[-2]
        ckpts = out / "run" / "checkpoints"
        what, size = self.damage(ckpts / str(newest), k)
        again = Child(self.rerun_command(out), logs.with_name(logs.name + "-rerun"), self.env)
        rc = again.wait(self.timeout(ref_s))
        if rc != 0:
            fails.append(f"the rerun after damaging checkpoints/{newest}/{what} exited {rc}: {again.tail()}")
        named = [ln for ln in again.stderr.splitlines() if f"checkpoints/{newest} is damaged" in ln]
        want = (f"checkpoint {ckpts}/{newest} is damaged: file {what} is truncated ({size} bytes, ",
                f"when saved); kept aside as {ckpts}/{newest}.damaged-1; resuming from step {prev}")
        if len(named) != 1 or not (named[0].startswith(want[0]) and named[0].endswith(want[1])):
            fails.append(f"the rerun did not name damaged checkpoints/{newest}/{what} in one line: {named[:2]}")
        aside = ckpts / f"{newest}.damaged-1" / what
        if not aside.is_file() or aside.stat().st_size != size:
            fails.append(f"checkpoints/{newest}.damaged-1/{what} is not kept aside as it was")
        fails += self.compare(ref, out)
        fails += self.intact(steps[:-1], ref, out, again)
        fails += [f"temp left after the final run: {p}" for p in temp_files(out)]
        return Attempt(True, 1, fails)


class DatasetCase(Case):
    """A tfds dataset build (prepare, extract_features): all-or-nothing; after a kill the same command
    starts over (a complete dataset at ``--out`` means it had finished)."""

    def data_dir(self, out: Path) -> Path:
        return out / "ds"

    def finished(self, out: Path) -> bool:
        try:
            datasets.find(str(self.data_dir(out)))
            return True
        except datasets.DatasetError:
            return False

    def partial(self, out: Path) -> list[str]:
        if not self.finished(out):
            return []
        try:
            records = dataset_records(self.data_dir(out))
        except Exception as e:  # noqa: BLE001 - any failure to read it is the finding
            return [f"a dataset at the final path cannot be read: {type(e).__name__}: {str(e)[:160]}"]
        return [] if records[1] else ["a dataset at the final path holds no records"]

    def compare(self, ref: Path, out: Path) -> list[str]:
        try:
            got = dataset_records(self.data_dir(out))
        except Exception as e:  # noqa: BLE001
            return [f"no readable dataset after the rerun: {type(e).__name__}: {str(e)[:160]}"]
        return diff_records(dataset_records(self.data_dir(ref)), got, "dataset")


class PrepareCase(DatasetCase):
    """``python -m animegamer_jax.commands.data prepare`` of the sample film and data/sample_labels.jsonl."""

    name = "prepare"

    def setup(self) -> None:
        self.inputs.film

    def command(self, out: Path, name: str = "ds") -> list[str]:
        return [PY, "-m", "animegamer_jax.commands.data", "prepare", "--config=configs/tiny.py",
                f"--film=sample_film={self.inputs.film}", f"--labels={LABELS}", f"--out={out / name}"]


class ExtractFeaturesCase(DatasetCase):
    """``python -m animegamer_jax.commands.data extract-features --random_init`` of the shared dataset."""

    name = "extract_features"

    def setup(self) -> None:
        self.inputs.dataset

    def command(self, out: Path) -> list[str]:
        return [PY, "-m", "animegamer_jax.commands.data", "extract-features", "--config=configs/tiny.py",
                f"--dataset={self.inputs.dataset}", f"--out={out / 'ds'}", "--random_init"]


class LabelCase(Case):
    """``python -m animegamer_jax.commands.data caption --captioner=rule`` in batches of 2 clips: each batch is
    a part file as soon as it is captioned, the labels file is written once at the end; the same
    command resumes from the parts."""

    name = "label"

    def setup(self) -> None:
        self.inputs.film

    def command(self, out: Path) -> list[str]:
        return [PY, "-m", "animegamer_jax.commands.data", "caption", "--config=configs/tiny.py",
                f"--film=sample_film={self.inputs.film}", f"--characters={ROOT / 'data' / 'characters'}",
                "--captioner=rule", "--config.label.batch_size=2", "--noprogress", f"--out={out / 'labels.jsonl'}"]

    def partial(self, out: Path) -> list[str]:
        return []  # in reported_done: needs the reference

    def reported_done(self, out: Path, child: Child, ref: Path) -> object:
        want = (ref / "labels.jsonl").read_text()
        fails = []
        labels = out / "labels.jsonl"
        if labels.exists() and labels.read_text() != want:
            fails.append("labels.jsonl at its final path differs from the uninterrupted run's (partial?)")
        ref_lines = set(want.splitlines())
        parts = out / ".labels.jsonl.parts"
        for p in sorted(parts.glob("film*.jsonl")) if parts.is_dir() else []:
            for line in p.read_text().splitlines():
                try:
                    json.loads(line)
                except ValueError:
                    fails.append(f"part file {p.name} has a torn line")
                    break
                if line not in ref_lines:
                    fails.append(f"part file {p.name} holds a line the uninterrupted run did not write")
                    break
        return fails

    def intact(self, done, ref: Path, out: Path, rerun: Child | None) -> list[str]:
        return done

    def compare(self, ref: Path, out: Path) -> list[str]:
        got = out / "labels.jsonl"
        if not got.exists():
            return ["no labels.jsonl after the rerun"]
        return [] if got.read_bytes() == (ref / "labels.jsonl").read_bytes() else [
            "labels.jsonl differs from the uninterrupted run's"]


class ConvertReleaseCase(Case):
    """``python -m animegamer_jax.commands.convert release`` of the tiny release fixture: DST appears complete
    or not at all; after a kill the same command (DST absent) converts again."""

    name = "convert release"
    #: orbax bookkeeping with wall-clock times, and the integrity file that hashes it
    TIMESTAMPED = ("commit_success.txt", "_CHECKPOINT_METADATA", checkpoint.INTEGRITY_FILE)

    def setup(self) -> None:
        if not RELEASE.is_dir():
            raise HarnessError(f"{RELEASE}: the tiny release fixture is missing (../shared/fixtures/release_tiny)")

    def command(self, out: Path) -> list[str]:
        return [PY, "-m", "animegamer_jax.commands.convert", "release", str(RELEASE), str(out / "system"),
                "--config=configs/release_tiny.py"]

    def finished(self, out: Path) -> bool:
        return (out / "system").exists()

    def partial(self, out: Path) -> list[str]:
        if not (out / "system").exists():
            return []
        try:
            checkpoint.verify_checkpoint(str(out / "system"), "full")
        except (checkpoint.CheckpointIntegrityError, checkpoint.SystemCheckpointError) as e:
            return [f"system at its final path is not a whole checkpoint: {str(e)[:160]}"]
        return []

    def compare(self, ref: Path, out: Path) -> list[str]:
        if not (out / "system").exists():
            return ["no system after the rerun"]
        return diff_hashes(file_hashes(ref / "system", self.TIMESTAMPED), file_hashes(out / "system", self.TIMESTAMPED),
                           "system")


# -- the run ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    """One line of the table: a command, the kills delivered (by signal), reruns, invariant failures."""
    command: str
    kills: dict[str, int]
    reruns: int
    failures: list[str]
    missed: int = 0  # kill moments that fell after the command had already exited
    reference_s: float = 0.0

    def cells(self) -> list[str]:
        by = ", ".join(f"{k} {v}" for k, v in sorted(self.kills.items()) if v)
        kills = f"{sum(self.kills.values())} ({by})" if by else "0"
        if self.missed:
            kills += f" +{self.missed} after exit"
        fails = "; ".join(self.failures) if self.failures else "0"
        return [self.command, kills, str(self.reruns), fails if not self.failures else f"{len(self.failures)}: {fails}"]


def table(rows: Sequence[Row]) -> str:
    """The markdown table: command | kills | reruns | invariant failures."""
    lines = ["| command | kills | reruns | invariant failures |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def run_case(case: Case, n: int, seed: int, workdir: Path, *, warm_reference: bool = False, keep: bool = False,
             log=print) -> Row:
    """Runs ``case`` once uninterrupted, then ``n`` times killed at seeded moments and rerun (module doc).

    Args:
      case: the command and its checks.
      n: kills.
      seed: seeds the signals and moments (the same seed draws the same kills).
      workdir: the case's folder (``reference/``, ``kill<i>/``, ``logs/``); created.
      warm_reference: run the command once before the reference (filling the compilation cache, so
        that the reference's wall time is a warm run's); that run must give the reference's result.
      keep: keep every kill's folder (those with failures are always kept).
      log: progress lines.

    Returns:
      The :class:`Row`. A reference run that fails is one failure and no kills.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    row = Row(case.name, {}, 0, [])
    try:
        case.setup()
        ref = workdir / "reference"
        for d in (ref, workdir / "warmup"):
            shutil.rmtree(d, ignore_errors=True)
        ref.mkdir()
        if warm_reference:
            (workdir / "warmup").mkdir()
            case.reference(workdir / "warmup", logs / "warmup")
        row.reference_s = case.reference(ref, logs / "reference")
        if warm_reference:
            row.failures += [f"two uninterrupted runs differ: {f}" for f in case.compare(ref, workdir / "warmup")]
            shutil.rmtree(workdir / "warmup", ignore_errors=True)
    except HarnessError as e:
        row.failures.append(str(e))
        return row
    row.failures += [f"the uninterrupted run left a temp file: {p}" for p in temp_files(ref)]
    log(f"{case.name}: reference {row.reference_s:.1f} s")
    rng = random.Random(f"{seed}:{case.name}")
    for i in range(n):
        sig = rng.choice(case.signals)
        at = rng.uniform(*SPREAD) * row.reference_s
        out = workdir / f"kill{i:02d}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        t0 = time.monotonic()
        tried = case.attempt(out, logs / f"kill{i:02d}", ref, row.reference_s, sig, at)
        tag = f"#{i} SIG{SIGNAL_NAMES[sig]}@{at:.1f}s"
        if tried.delivered:
            row.kills[SIGNAL_NAMES[sig]] = row.kills.get(SIGNAL_NAMES[sig], 0) + 1
        else:
            row.missed += 1
        row.reruns += tried.reruns
        row.failures += [f"{tag}: {f}" for f in tried.failures]
        log(f"  {tag}: {'signalled' if tried.delivered else 'had exited'}, {tried.reruns} rerun(s), "
            f"{len(tried.failures)} failure(s) ({time.monotonic() - t0:.1f} s)"
            + "".join(f"\n    {f}" for f in tried.failures))
        if not tried.failures and not keep:
            shutil.rmtree(out, ignore_errors=True)
    return row


#: case name -> constructor (``inputs``, ``env``, ``system``)
CASES = {
    "play-script": lambda i, e, s: PlayScriptCase(i, e, s),
    "play-interactive": lambda i, e, s: PlayInteractiveCase(i, e, s),
    "play-continue": lambda i, e, s: PlayContinueCase(i, e, s),
    "generate": lambda i, e, s: GenerateCase(i, e, s),
    "serve": lambda i, e, s: ServeCase(i, e, s),
    **{f"train-{p}": (lambda p: lambda i, e, s: TrainCase(i, e, p))(p) for p in ("vae", "a1", "a2", "b", "c")},
    "train-damaged": lambda i, e, s: TrainDamagedCase(i, e, "a1"),
    "prepare": lambda i, e, s: PrepareCase(i, e),
    "label": lambda i, e, s: LabelCase(i, e),
    "extract_features": lambda i, e, s: ExtractFeaturesCase(i, e),
    "convert-release": lambda i, e, s: ConvertReleaseCase(i, e),
}


def run(names: Sequence[str], n: int, seed: int, workdir: Path, *, system: str = "standin",
        compile_cache: bool = False, warm_reference: bool = False, keep: bool = False, log=print) -> list[Row]:
    """Runs the cases ``names`` (keys of :data:`CASES`) in ``workdir``; returns their rows.

    Args:
      system: the system of play / generate / serve: "standin" or "checkpoint" (checkpoints/tiny_system).
      compile_cache: give the children a persistent JAX compilation cache in ``workdir/jax_cache``
        (training's compiles then take seconds instead of tens of seconds after the first run).

    Raises:
      KeyError: an unknown case name (the message lists the known ones).
    """
    unknown = [c for c in names if c not in CASES]
    if unknown:
        raise KeyError(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    extra = {"JAX_COMPILATION_CACHE_DIR": str(workdir / "jax_cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
             "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"} if compile_cache else {"JAX_COMPILATION_CACHE_DIR": ""}
    env = child_env(extra)
    inputs = Inputs(workdir / "inputs", env)
    rows = []
    for name in names:
        rows.append(run_case(CASES[name](inputs, env, system), n, seed, workdir / name,
                             warm_reference=warm_reference, keep=keep, log=log))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.faults [--n N] [--cases a,b] [--workdir DIR] ...``: prints the table; exit 1 when
    any invariant failed."""
    p = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10, help="kills per command (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seeds the signals and moments")
    p.add_argument("--cases", default="all", help=f"comma-separated, of: {', '.join(CASES)} (default all)")
    p.add_argument("--workdir", default="", help="where the runs go (default: a new temp folder, kept)")
    p.add_argument("--system", choices=("standin", "checkpoint"), default="checkpoint",
                   help="the system of play / generate / serve (default checkpoint: checkpoints/tiny_system)")
    p.add_argument("--no-compile-cache", dest="compile_cache", action="store_false",
                   help="no persistent JAX compilation cache for the children")
    p.add_argument("--keep", action="store_true", help="keep the folders of kills without failures too")
    args = p.parse_args(argv)
    names = list(CASES) if args.cases == "all" else [c.strip() for c in args.cases.split(",") if c.strip()]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="animegamer-faults-")).resolve()
    print(f"faults: {args.n} kill(s) per command, seed {args.seed}, system {args.system}, in {workdir}", flush=True)
    t0 = time.monotonic()
    try:
        rows = run(names, args.n, args.seed, workdir, system=args.system, compile_cache=args.compile_cache,
                   warm_reference=args.compile_cache, keep=args.keep, log=lambda s: print(s, flush=True))
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    print(f"\n{table(rows)}\n\n{time.monotonic() - t0:.0f} s in all; runs and logs in {workdir}")
    return 1 if any(r.failures for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
