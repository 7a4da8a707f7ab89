"""Every console script gets a table of bad inputs; each one is refused with exactly one line on stderr
(no traceback), exit status 2, before any work, and leaves the folder it ran in as it was.

The scripts come from pyproject.toml [project.scripts], so a new one cannot be missed: each entry
point needs a row in :data:`CASES`. Entry points run in-process (``main(argv)``; one jax import for
all of them); two cases go through the installed console path in a subprocess.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

from tests.subproc import ROOT

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]

BIG = str(2**70)  # a seed beyond 64 bits
# shared by every command that reads --config: a file that is not a config, and values out of range
CONFIG_CASES = [
    ("binary --config", ["--config=inputs/binary.py"]),
    ("directory --config", ["--config=inputs/folder"]),
    ("missing --config", ["--config=inputs/missing.py"]),
    ("empty --config", ["--config=inputs/empty.py"]),
    ("unknown flag", ["--no_such_flag=1"]),
    ("fps 0", ["--config=configs/tiny.py", "--config.game.fps=0"]),
    ("batch -1", ["--config=configs/tiny.py", "--config.train.global_batch_size=-1"]),
    ("sampling steps 0", ["--config=configs/tiny.py", "--config.diffusion.num_sampling_steps=0"]),
    ("seed beyond 64 bits", ["--config=configs/tiny.py", f"--config.seed={BIG}"]),
    ("wrong type", ["--config=configs/tiny.py", "--config.game.fps=abc"]),
    ("unknown key", ["--config=configs/tiny.py", "--config.game.no_such_key=1"]),
    ("bad phase", ["--config=configs/tiny.py", "--config.train.phase=zz"]),
]
GAME = ["--standin", "--out=out"]
# --character NAME=IMAGE (play, generate): bad syntax, unreadable, not an image, too small, too large,
# a system without the reference adapter (a copy of the shipped tiny system without its ``reference``
# component, inputs/noref; and --demo's random fallback when no checkpoint is found)
CHARACTER_CASES = [
    ("character without =", ["--character=Bunny", *GAME]),
    ("character missing image", ["--character=Bunny=inputs/missing.png", *GAME]),
    ("character not an image", ["--character=Bunny=inputs/binary.py", *GAME]),
    ("character tiny image", ["--character=Bunny=inputs/tiny.png", *GAME]),
    ("character huge image", ["--character=Bunny=inputs/huge.png", *GAME]),
    # refused from the manifest, before loading
    ("character on a system without references", ["--character=Bunny=inputs/ok.png", "--checkpoint=inputs/noref",
                                                   "--out=out"]),
    ("character on the random demo system", ["--character=Bunny=inputs/ok.png", "--demo",
                                             "--config.game.checkpoint=inputs/missing", "--out=out"]),
]

#: entry point ("module:function") -> (case name, argv) rows
CASES: dict[str, list[tuple[str, list[str]]]] = {
    "animegamer_jax.commands.play:cli": [
        ("missing script", ["inputs/missing.txt", *GAME]),
        ("empty script", ["inputs/empty.txt", *GAME]),
        ("binary script", ["inputs/binary.py", *GAME]),
        ("directory script", ["inputs/folder", *GAME]),
        ("ESC in script", ["inputs/esc.txt", *GAME]),
        ("bidi override in script", ["inputs/bidi.txt", *GAME]),
        ("zero-width space in script", ["inputs/zwsp.txt", *GAME]),
        ("game id with ESC", ["inputs/ok.txt", "--game_id=a\x1bb", *GAME]),
        ("seed beyond 64 bits", ["inputs/ok.txt", f"--config.game.seed={BIG}", *GAME]),
        # config values are set only as --config.x.y: the flags of old spellings are unknown flags
        ("removed --mode", ["inputs/ok.txt", "--mode=reference", *GAME]),
        ("removed --seed", ["inputs/ok.txt", "--seed=3", *GAME]),
        ("empty --out", ["inputs/ok.txt", "--standin", "--out="]),
        # a checkpoint's saved config loses the output folder it held (configs no longer have it)
        ("out_dir of a saved config", ["inputs/ok.txt", "--checkpoint=inputs/noref", "--config.game.out_dir=x",
                                       "--out=out"]),
        ("two scripts", ["inputs/ok.txt", "inputs/ok.txt", *GAME]),
        ("fps 0", ["inputs/ok.txt", "--config.game.fps=0", *GAME]),
        ("missing checkpoint", ["inputs/ok.txt", "--checkpoint=inputs/missing", "--out=out"]),
        *[(n, ["inputs/ok.txt", *a]) for n, a in CHARACTER_CASES],
        *[(n, ["inputs/ok.txt", *a, *GAME]) for n, a in CONFIG_CASES],
    ],
    "animegamer_jax.commands.generate:cli": [
        ("no games file", GAME),
        ("missing games", ["inputs/missing.jsonl", *GAME]),
        ("empty games", ["inputs/empty.jsonl", *GAME]),
        ("directory games", ["inputs/folder", *GAME]),
        ("lone surrogate in games", ["inputs/surrogate.jsonl", *GAME]),
        ("binary games", ["inputs/binary.jsonl", *GAME]),
        ("seed beyond 64 bits in games", ["inputs/bigseed.jsonl", *GAME]),
        ("negative limit", ["inputs/ok.jsonl", "--limit=-1", *GAME]),
        *[(n, ["inputs/ok.jsonl", *a]) for n, a in CHARACTER_CASES],
        *[(n, ["inputs/ok.jsonl", *a, *GAME]) for n, a in CONFIG_CASES],
    ],
    "animegamer_jax.commands.train:cli": [
        ("no prepared dataset", ["--config=configs/tiny.py", "--workdir=wd", "--config.data.dataset_dir=inputs/folder"]),
        ("no workdir", ["--config=configs/tiny.py"]),
        ("no config", ["--workdir=wd"]),
        *[(n, ["--workdir=wd", *a]) for n, a in CONFIG_CASES],
    ],
    "animegamer_jax.commands.convert:cli": [
        ("no kind", []),
        ("unknown kind", ["zz"]),
        ("clip without paths", ["clip"]),
        ("vae from a missing file", ["vae", "inputs/missing.pt", "out"]),
        ("release from a missing folder", ["release", "inputs/missing", "out", "--config=configs/tiny.py"]),
    ],
    "animegamer_jax.commands.eval:cli": [
        ("missing benchmark", ["--standin", "--config.eval.benchmark=inputs/missing.json", "--out=out"]),
        ("directory benchmark", ["--standin", "--config.eval.benchmark=inputs/folder", "--out=out"]),
        ("binary benchmark", ["--standin", "--config.eval.benchmark=inputs/binary.py", "--out=out"]),
        ("missing CLIP folder", ["--standin", "--config.eval.clip=inputs/missing", "--out=out"]),
        ("removed --clip", ["--standin", "--clip=inputs/folder", "--out=out"]),
        ("removed --benchmark", ["--standin", "--benchmark=inputs/ok.json", "--out=out"]),
        ("removed --mode", ["--standin", "--mode=reference", "--out=out"]),
        ("removed eval.out_dir", ["--standin", "--config.eval.out_dir=out"]),
        *[(n, ["--standin", "--out=out", *a]) for n, a in CONFIG_CASES],
        ("missing checkpoint", ["vae", "--checkpoint=inputs/missing", "--dataset=inputs/folder"]),
        ("binary dataset", ["vae", "--checkpoint=inputs/folder", "--dataset=inputs/binary.py"]),
        *[(n, ["vae", "--checkpoint=inputs/missing", *a]) for n, a in CONFIG_CASES],
        ("missing checkpoint", ["decoder", "--checkpoint=inputs/missing", "--dataset=inputs/folder"]),
        ("clips 0", ["decoder", "--checkpoint=inputs/folder", "--clips=0"]),
        ("unknown sampler", ["decoder", "--checkpoint=inputs/folder", "--config.diffusion.sampler=zz"]),
        ("unknown flag", ["decoder", "--no_such_flag=1"]),
        ("missing game", ["representation", "--game=inputs/missing", "--checkpoint=inputs/folder"]),
        ("binary game", ["representation", "--game=inputs/binary.py", "--checkpoint=inputs/folder"]),
        ("unknown flag", ["representation", "--no_such_flag=1"]),
    ],
    "animegamer_jax.commands.aot:cli": [
        ("unknown topology", ["--config=configs/tiny.py", "--topology=zz-99"]),
        ("unknown program", ["--config=configs/tiny.py", "--program=zz"]),
        ("slices 0", ["--config=configs/tiny.py", "--num_slices=0"]),
        *CONFIG_CASES,
    ],
    "animegamer_jax.commands.web:cli": [
        ("port -1", ["--standin", "--port=-1"]),
        ("max queue 0", ["--standin", "--max_queue=0"]),
        ("seed beyond 64 bits", ["--standin", f"--config.game.seed={BIG}"]),
        ("removed --seed", ["--standin", "--seed=3"]),
        ("removed --mode", ["--standin", "--mode=reference"]),
        ("positional", ["--standin", "inputs/ok.txt"]),
        ("missing checkpoint", ["--checkpoint=inputs/missing"]),
        *[(n, ["--standin", *a]) for n, a in CONFIG_CASES],
    ],
    "animegamer_jax.commands.checkpoint:cli": [
        ("no subcommand", []),
        ("unknown subcommand", ["zz"]),
        ("verify a missing folder", ["verify", "inputs/missing"]),
        ("verify a file", ["verify", "inputs/binary.py"]),
        ("verify a folder without integrity.json", ["verify", "inputs/folder"]),
        ("manifest without a folder", ["manifest"]),
        ("cast without components", ["cast", "inputs/folder", "out"]),
    ],
    "animegamer_jax.commands.character:cli": [
        ("no subcommand", []),
        ("unknown subcommand", ["zz"]),
        ("fit without pictures", ["fit", "--name=Zed", "--checkpoint=inputs/folder", "--out=out/sys"]),
        ("fit an empty folder", ["fit", "--images=inputs/folder", "--name=Zed", "--checkpoint=inputs/folder",
                                 "--out=out/sys"]),
        ("fit a folder of non-images", ["fit", "--images=inputs", "--name=Zed", "--checkpoint=inputs/folder",
                                        "--out=out/sys"]),
        ("fit a bad name", ["fit", "--film=inputs/ok.txt", "--name=a/b", "--checkpoint=inputs/folder",
                            "--out=out/sys"]),
        ("fit a missing checkpoint", ["fit", "--film=inputs/missing.mp4", "--name=Zed",
                                      "--checkpoint=inputs/missing", "--out=out/sys"]),
    ],
    "animegamer_jax.commands.data:cli": [
        ("no command", []),
        ("unknown command", ["zz"]),
        ("missing film", ["prepare", "--film=inputs/missing.mp4", "--out=out"]),
        ("binary film", ["prepare", "--film=inputs/binary.py", "--out=out"]),
        ("directory labels", ["prepare", "--film_dir=inputs/folder", "--labels=inputs/folder", "--out=out"]),
        *[(n, ["prepare", "--film_dir=inputs/folder", "--out=out", *a]) for n, a in CONFIG_CASES],
        ("missing dataset", ["extract-features", "--dataset=inputs/missing", "--out=out"]),
        ("batch size 0", ["extract-features", "--dataset=inputs/folder", "--batch_size=0", "--out=out"]),
        *[(n, ["extract-features", "--dataset=inputs/folder", "--out=out", *a]) for n, a in CONFIG_CASES],
        ("width 0", ["sample", "--width=0", "--out=out/x.mp4"]),
        ("unknown flag", ["sample", "--no_such_flag=1"]),
        ("positional", ["sample", "inputs/ok.txt"]),
        ("no captioner", ["caption", "--film_dir=inputs/folder", "--out=out"]),
        ("missing film", ["caption", "--film=inputs/missing.mp4", "--captioner=standin", "--out=out"]),
        *[(n, ["caption", "--film_dir=inputs/folder", "--captioner=standin", "--out=out", *a]) for n, a in CONFIG_CASES],
        ("vocab size 0", ["tiny-t5-spiece", "--vocab_size=0", "--out=out/x.model"]),
        ("out is a folder", ["tiny-t5-spiece", "--out=inputs/folder"]),
        ("positional", ["tiny-t5-spiece", "inputs/ok.txt"]),
    ],
}

OK_LINE = "Character: Bunny; Motion: hop; Background: meadow.\n"


def _inputs(root: Path) -> None:
    d = root / "inputs"
    (d / "folder").mkdir(parents=True)
    (d / "binary.py").write_bytes(bytes(range(256)) * 4)
    (d / "binary.jsonl").write_bytes(b"\xff\xfe\x00" * 50)
    for name in ("empty.py", "empty.txt", "empty.jsonl"):
        (d / name).write_bytes(b"")
    (d / "ok.txt").write_text(OK_LINE)
    from PIL import Image

    Image.new("RGB", (64, 64), (200, 100, 50)).save(d / "ok.png")
    Image.new("RGB", (16, 16)).save(d / "tiny.png")
    Image.new("1", (9000, 40)).save(d / "huge.png")
    from tests.checkpoint_helpers import system_without

    system_without(str(REPO / "checkpoints" / "tiny_system"), str(d / "noref"), ("reference",))
    (d / "esc.txt").write_text(OK_LINE.replace("hop", "hop\x1b[2J"))
    (d / "bidi.txt").write_text(OK_LINE.replace("hop", "hop\u202e"))
    (d / "zwsp.txt").write_text(OK_LINE.replace("hop", "h\u200bop"))
    (d / "ok.jsonl").write_text('{"game_id": "g1", "turns": ["%s"]}\n' % OK_LINE.strip())
    (d / "surrogate.jsonl").write_text('{"game_id": "g1", "turns": ["%s"]}\n' % OK_LINE.strip().replace("hop", "h\\ud800op"))
    (d / "bigseed.jsonl").write_text('{"game_id": "g1", "seed": %s, "turns": ["%s"]}\n' % (BIG, OK_LINE.strip()))


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*"))


def _entry(target: str):
    """The ``main(argv)`` a console script runs: a module's ``cli()`` runs the module's ``main``; any other
    target is a command's ``main(argv=None) -> int`` itself (the console wrapper exits with its value)."""
    module, func = target.split(":")
    # a console script is a command module's [KIND_]cli() (its [KIND_]main(argv) is what this test runs) or
    # the [KIND_]main itself
    return getattr(importlib.import_module(module), func.removesuffix("cli") + "main" if func.endswith("cli") else func)


def test_every_console_script_has_a_row():
    targets = set(SCRIPTS.values())
    assert targets == set(CASES), f"entry points without cases: {sorted(targets - set(CASES))}"
    assert len(SCRIPTS) == len(CASES)  # one console name per entry point (no old aliases)


ROWS = [(t, n, a) for t, rows in CASES.items() for n, a in rows]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    _inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    # configs/tiny.py resolves from the checkout (paths.resource), whatever the working directory
    return tmp_path


@pytest.mark.slow
def test_bad_inputs_get_one_line_and_write_nothing(workdir, capsys, monkeypatch):
    """Every row of :data:`CASES`: exit status 2, one ``error:`` line on stderr, the folder unchanged."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    from animegamer_jax.commands import web as web_main

    def no_server(*args, **kwargs):  # a row that passes every check must not start serving
        raise AssertionError("the bad input reached build_server")

    monkeypatch.setattr(web_main, "build_server", no_server)
    failures = []
    for target, name, argv in ROWS:
        before = _listing(workdir)
        try:
            rc = _entry(target)(list(argv))
        except SystemExit as e:
            rc = e.code
        except BaseException as e:  # noqa: BLE001 - a traceback is the failure this test reports
            rc = f"raised {type(e).__name__}: {e}"
        out, err = capsys.readouterr()
        lines = err.strip("\n").splitlines()
        after = _listing(workdir)
        problems = []
        if rc != 2:
            problems.append(f"exit status {rc!r}")
        if len(lines) != 1 or not lines[0].startswith("error: ") or "Traceback" in err:
            problems.append(f"stderr {err[-600:]!r}")
        if after != before:
            problems.append(f"wrote {sorted(set(after) ^ set(before))}")
        if problems:
            failures.append(f"{SCRIPTS_BY_TARGET[target]} {' '.join(argv)!r} ({name}): {'; '.join(problems)}")
    assert not failures, "\n".join(failures)


SCRIPTS_BY_TARGET = {t: min(n for n, v in SCRIPTS.items() if v == t) for t in set(SCRIPTS.values())}


@pytest.mark.parametrize("argv", [["animegamer-play", "inputs/folder", "--standin"],
                                  ["animegamer-train", "--config=configs/tiny.py", "--workdir=wd",
                                   "--config.train.phase=zz"]])
@pytest.mark.slow
def test_the_console_path_prints_one_line(workdir, argv):
    """The real console script (``sys.exit(main())``) in a subprocess: one line, exit status 2."""
    import subprocess

    target = SCRIPTS[argv[0]]
    module, func = target.split(":")
    code = f"import sys; from {module} import {func}; sys.argv = {argv!r}; sys.exit({func}())"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr
    assert sorted(os.listdir(workdir)) == ["inputs"]


@pytest.mark.slow
def test_interactive_play_refuses_a_bad_line_and_plays_the_next(workdir, capsys, monkeypatch):
    """``play -``: a line with a byte that is not UTF-8, or with ESC, gets one ``error:`` line naming the
    line; the lines after it are played."""
    from animegamer_jax.commands import play

    typed = (b"Character: Bunny; Motion: h\xffop; Background: meadow.\n"
             b"Character: Bunny; Motion: hop\x1b[2J; Background: meadow.\n" + OK_LINE.encode())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(typed), encoding="utf-8"))
    rc = play.main(["-", "--standin", "--out=out", "--game_id=typed"])
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 0, err
    assert len(errors) == 2 and "Traceback" not in err, err
    assert errors[0].startswith("error: <stdin>:1: ") and "U+DCFF (the byte 0xff, which is not UTF-8)" in errors[0]
    assert errors[1].startswith("error: <stdin>:2: ") and "control character U+001B" in errors[1]
    record = json.loads((workdir / "out" / "typed" / "game.json").read_text())
    assert [t["instruction"] for t in record["turns"]] == [OK_LINE.strip()]


def test_web_on_a_taken_port_is_refused_before_loading(workdir, capsys, monkeypatch):
    """``web`` on a port another program listens on: one ``error:`` line, exit 2, before the system loads
    and compiles (no "serving on"); with a compilation cache path that is a file, its one line comes once."""
    import socket

    from animegamer_jax.commands import web as web_main

    monkeypatch.setattr(web_main, "build_server", lambda *a, **k: pytest.fail("loaded before the port check"))
    (workdir / "cachefile").write_text("not a folder")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc = web_main.main(["--standin", "--out=out", f"--port={port}",
                            f"--compilation_cache_dir={workdir / 'cachefile'}"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        f"compilation cache off: cannot create the folder {workdir / 'cachefile'} (File exists). Fix: pass "
        "--compilation_cache_dir with a folder (empty turns the cache off)",
        f"error: cannot serve on 127.0.0.1:{port}: address already in use. Fix: pass --port with a free port (or stop "
        f"the program serving on {port})"]
    assert sorted(os.listdir(workdir)) == ["cachefile", "inputs"]
