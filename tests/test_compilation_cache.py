"""The persistent compilation cache every command uses (cli.compilation_cache): a second run of play
loads every program from the cache and writes the same game files."""

import json
import os

import jax
import pytest

from animegamer_jax.commands import cli
from tests.subproc import run_python

#: a child that plays one turn with the stand-in through play's command line and prints the
#: compilation-cache events JAX recorded (argv: out folder, then play's flags)
_PLAY = """
import collections, json, sys
import jax
events = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **_: events.update([name]))
from animegamer_jax.commands import play
rc = play.main([sys.argv[1], "--standin", "--out", sys.argv[2], *sys.argv[3:]])
print(json.dumps({"rc": rc, **{k.rsplit("/", 1)[1]: v for k, v in events.items()
                               if k.startswith("/jax/compilation_cache/")}}))
"""


def _play(script, out, *flags, env=None) -> dict:
    code = f"import sys; sys.argv = ['play', {str(script)!r}, {str(out)!r}, *{list(flags)!r}]\n" + _PLAY
    return json.loads(run_python(code, devices=1, env=env).strip().splitlines()[-1])


def _files(folder) -> dict:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder)) if name != "timings.json"}


@pytest.mark.slow
def test_second_run_loads_every_program_from_the_cache_and_writes_the_same_game(tmp_path):
    script = tmp_path / "one.txt"
    script.write_text("Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.\n")
    cache = tmp_path / "cache"
    first = _play(script, tmp_path / "run1", f"--compilation_cache_dir={cache}")
    # the second run names the folder through JAX's own environment variable instead of the flag
    second = _play(script, tmp_path / "run2", env={"JAX_COMPILATION_CACHE_DIR": str(cache)})
    assert first["rc"] == 0 and second["rc"] == 0
    # run 1: every program compiled and written (the tiny ones too: no minimum compile time or size)
    assert first.get("cache_hits", 0) == 0 and first.get("cache_misses", 0) == first.get("compile_requests_use_cache", -1) >= 3
    assert len(os.listdir(cache)) >= first["cache_misses"]
    # run 2: every compile request answered from the cache, nothing compiled
    assert second.get("cache_misses", 0) == 0
    assert second.get("cache_hits", 0) == second.get("compile_requests_use_cache", -1) == first["compile_requests_use_cache"]
    one, two = _files(tmp_path / "run1" / "one"), _files(tmp_path / "run2" / "one")
    assert set(one) >= {"game.json", "game.mp4", "turn_000.mp4", "index.html"} and one == two


def test_cache_folder_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(cli.CACHE_ENV, raising=False)
    assert cli.compilation_cache_dir(None) == str(tmp_path / "xdg" / "animegamer_jax" / "jax_cache")
    monkeypatch.setenv(cli.CACHE_ENV, "gs://bucket/cache")
    assert cli.compilation_cache_dir(None) == "gs://bucket/cache"
    assert cli.compilation_cache_dir("/flag/wins") == "/flag/wins"
    assert cli.compilation_cache_dir("") == ""  # --compilation_cache_dir= : off
    monkeypatch.setenv(cli.CACHE_ENV, "")
    assert cli.compilation_cache_dir(None) == ""


def test_cache_options_are_set_inside_and_restored(tmp_path):
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    folder = tmp_path / "new" / "cache"
    with cli.compilation_cache(str(folder)):
        assert jax.config.jax_compilation_cache_dir == str(folder) and folder.is_dir()
        assert jax.config.jax_enable_compilation_cache is True
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
        assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
        with cli.compilation_cache(""):
            assert jax.config.jax_enable_compilation_cache is False
            assert jax.config.jax_compilation_cache_dir is None
        assert jax.config.jax_compilation_cache_dir == str(folder)
    assert (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache,
            jax.config.jax_persistent_cache_min_compile_time_secs) == before


def test_a_folder_that_cannot_be_created_turns_the_cache_off(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    with cli.compilation_cache(str(tmp_path / "file" / "cache")):
        assert jax.config.jax_enable_compilation_cache is False
        assert jax.config.jax_compilation_cache_dir is None


def test_every_command_has_the_flags():
    from animegamer_jax.commands.game_flags import parse_game_flags

    f, _ = cli.parse_flags(["prog"], lambda fv, argv: None)
    assert f.compilation_cache_dir is None
    f, _ = cli.parse_flags(["prog", "--compilation_cache_dir="], lambda fv, argv: None)
    assert f.compilation_cache_dir == ""
    f, _, _ = parse_game_flags("play", ["--compilation_cache_dir=gs://b/c"])
    assert f.compilation_cache_dir == "gs://b/c"
    # and --verbosity (docs/commands.md: --verbosity=0 shows every INFO line), play's and generate's too
    f, _ = cli.parse_flags(["prog", "--verbosity=0"], lambda fv, argv: None)
    assert f.verbosity == 0
    for prog in ("play", "generate"):
        f, _, _ = parse_game_flags(prog, ["--verbosity=0"])
        assert f.verbosity == 0


def test_a_cache_path_that_is_a_file_is_one_line_once(tmp_path, capsys):
    """A command whose --compilation_cache_dir is a file: one stage line, the cache off, the game played."""
    from animegamer_jax.commands import play

    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "one.txt").write_text("Character: Bunny; Motion: hop; Background: day meadow.\n")
    assert play.main([str(tmp_path / "one.txt"), "--standin", "--out", str(tmp_path / "out"),
                      f"--compilation_cache_dir={tmp_path / 'file'}"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [f"compilation cache off: cannot create the folder {tmp_path / 'file'} (File exists). "
                                "Fix: pass --compilation_cache_dir with a folder (empty turns the cache off)"]
    assert (tmp_path / "file").read_text() == "not a folder"


def test_a_read_only_cache_is_read_with_one_line_and_no_warnings(tmp_path, capsys, monkeypatch):
    """A folder that cannot be written: one line, JAX's warning for each program it cannot save hidden
    (the write is made to fail as it does in a read-only folder: as root, a chmod does not stop it)."""
    import warnings

    from jax._src import compilation_cache as jax_cache_module

    from animegamer_jax.commands import play

    ro = tmp_path / "ro"
    ro.mkdir()

    tries = []

    def refuse(*args, **kwargs):
        tries.append(args[1])
        raise PermissionError(13, "Permission denied", str(ro / "entry"))

    monkeypatch.setattr(cli, "_writable", lambda folder: folder != str(ro))
    monkeypatch.setattr(jax_cache_module, "put_executable_and_time", refuse)
    (tmp_path / "one.txt").write_text("Character: Bunny; Motion: hop; Background: day meadow.\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert play.main([str(tmp_path / "one.txt"), "--standin", "--out", str(tmp_path / "out"),
                          f"--compilation_cache_dir={ro}"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [f"compilation cache {ro} is read-only: compiled programs are loaded from it, new ones "
                                "are not saved. Fix: pass --compilation_cache_dir with a folder you can write to"]
    assert [str(w.message) for w in seen if "persistent compilation cache" in str(w.message)] == []
    assert len(tries) >= 3 and os.listdir(ro) == []  # the stages' programs did try to save
    # outside the command JAX warns again (the filter does not outlive it)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with cli.compilation_cache(str(tmp_path / "rw")):
            jax.jit(lambda x: x * 3)(jax.numpy.ones(3)).block_until_ready()
    assert any("Error writing persistent compilation cache entry" in str(w.message) for w in seen)


def test_writable_probe(tmp_path):
    assert cli._writable(str(tmp_path)) and os.listdir(tmp_path) == []
    assert not cli._writable(str(tmp_path / "missing"))
