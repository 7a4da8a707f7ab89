"""Saved stage executables (inference/executables.py): play --executables=DIR runs the programs a recording
saved, compiles none of the stage programs and writes the same game files; a folder saved for another
config or jax version is not used (one line says why) and everything compiles."""

import json
import os

import jax
import pytest
from ml_collections import config_flags

from animegamer_jax.commands import cli
from animegamer_jax.commands import play

from animegamer_jax.io import paths
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.script import load_script
from animegamer_jax.inference.standin_model import StandinTurnModel
from animegamer_jax.inference import executables
from animegamer_jax.inference.layout import apply_layout

_BACKEND = "/jax/core/compile/backend_compile_duration"


def _script(tmp_path):
    script = tmp_path / "two.txt"
    script.write_text("Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.\n"
                      "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.\n")
    return script


def _play(script, out, *flags) -> int:
    """play's command line in this process with the stand-in; returns the backend compiles it ran."""
    count = []

    def listen(name, secs, **_):
        if name == _BACKEND:
            count.append(secs)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        assert play.main([str(script), "--standin", "--out", str(out), *flags]) == 0
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return len(count)


def _files(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "timings.json"}


def _record(script, folder):
    """Records the stand-in engine's stage programs as play builds it (tiny config, latency layout)."""
    config = config_flags.config_flags._LoadConfigModule("tiny", paths.resource("configs/tiny.py")).get_config()
    config = apply_layout(config, "latency", jax.device_count())
    with executables.recording(str(folder)) as store:
        engine = GameEngine(config, StandinTurnModel(config, seed=int(config.seed)), latency=True)
        engine.play([load_script(str(script))])
    return store


@pytest.mark.slow
def test_play_runs_saved_executables_compiles_no_stage_and_writes_the_same_game(tmp_path, capsys):
    script = _script(tmp_path)
    # warms the eager helpers so the next count is the stages', and fills a persistent compilation cache:
    # the recording below runs with it on, as `animegamer-aot --save` does on the CPU with a user's cache
    # (XLA:CPU cannot re-serialize an executable loaded from that cache; the recording compiles afresh)
    cache = str(tmp_path / "jax_cache")
    _play(script, tmp_path / "plain", f"--compilation_cache_dir={cache}")
    assert os.listdir(cache)
    with cli.compilation_cache(cache):
        store = _record(script, tmp_path / "exe")
    assert store.saved == 3  # mllm, sampling, vae (the turns' shapes are equal)
    manifest = json.loads((tmp_path / "exe" / executables.MANIFEST).read_text())
    assert manifest["jax"] == jax.__version__ and {p["stage"] for p in manifest["programs"]} == {
        "mllm", "sampling", "vae"}
    capsys.readouterr()
    compiles = _play(script, tmp_path / "loaded", f"--executables={tmp_path / 'exe'}")
    err = capsys.readouterr().err
    assert compiles == 0, err
    assert "executables:" not in err
    assert _files(tmp_path / "loaded") == _files(tmp_path / "plain")
    timings = json.loads((tmp_path / "loaded" / "two" / "timings.json").read_text())
    assert len(timings["turns"]) == 2 and all(0 < t["ttff_s"] <= t["turn_s"] for t in timings["turns"])

    # another config: one line, then everything compiles, same files as a plain run of that config
    compiles = _play(script, tmp_path / "other", f"--executables={tmp_path / 'exe'}", "--config.game.meter_step=7")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("executables:")]
    assert len(lines) == 1 and "was saved for another config" in lines[0] and lines[0].endswith(", compiling")
    assert compiles >= 3

    # another jax version: one line naming it
    path = tmp_path / "exe" / executables.MANIFEST
    path.write_text(json.dumps(dict(manifest, jax="0.10.1")))
    _play(script, tmp_path / "old", f"--executables={tmp_path / 'exe'}")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("executables:")]
    assert len(lines) == 1 and "was saved for jax 0.10.1" in lines[0], lines


def test_a_folder_without_manifest_is_one_line_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc = play.main([str(_script(tmp_path)), "--standin", "--out", str(tmp_path / "o"),
                    f"--executables={tmp_path / 'empty'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "has no manifest.json" in err[0] and "aot --save" in err[0]
    assert not (tmp_path / "o").exists()


def test_signature_names_tree_shapes_and_shardings():
    x = jax.numpy.zeros((2, 3), jax.numpy.float32)
    sig = executables.signature(({"a": x}, 1))
    assert "float32[2,3]" in sig and "SingleDeviceSharding" in sig and sig.splitlines()[-1].startswith("int")
    assert executables.signature(({"a": x[:1]}, 1)) != sig
