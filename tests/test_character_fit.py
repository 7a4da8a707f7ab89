"""character fit: one-line refusals (fast) and, end to end (slow), a fitted system whose turns naming
the character change while every other turn stays byte-identical."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from PIL import Image

from animegamer_jax.commands.character import main

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = str(REPO / "checkpoints" / "tiny_system")


def _picture(path, seed=0):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)).save(path)


def _err(capsys, argv):
    assert main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_fit_refuses_bad_inputs_in_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "notes.txt").write_text("not a picture")
    ok = tmp_path / "ok"
    ok.mkdir()
    _picture(ok / "a.png")
    out = str(tmp_path / "out")
    base = ["--name=Zed", f"--checkpoint={TINY}", f"--out={out}"]
    assert "empty" in _err(capsys, [f"--images={empty}", *base])
    assert _err(capsys, [f"--images={bad}", *base]) == (
        f"error: --images {bad}: no PNG or JPEG picture in the folder (1 other file(s): notes.txt). Fix: put PNG "
        f"or JPEG pictures of Zed in it")
    (bad / "broken.png").write_text("not a picture either")
    assert "not an image" in _err(capsys, [f"--images={bad}", *base])
    assert "no such folder" in _err(capsys, [f"--images={tmp_path / 'none'}", *base])
    assert "not a usable character name" in _err(capsys, [f"--images={ok}", "--name=a/b", f"--checkpoint={TINY}",
                                                           f"--out={out}"])
    assert "no such system checkpoint" in _err(capsys, [f"--images={ok}", "--name=Zed",
                                                        f"--checkpoint={tmp_path / 'nosys'}", f"--out={out}"])
    assert "exists" in _err(capsys, [f"--images={ok}", "--name=Zed", f"--checkpoint={TINY}", f"--out={ok}"])
    assert "--out is required" in _err(capsys, [f"--images={ok}", "--name=Zed", f"--checkpoint={TINY}"])
    assert not (tmp_path / "out").exists()


def test_fit_skips_the_files_beside_the_pictures_with_one_line(tmp_path):
    """A README.txt (and a subfolder) beside the pictures: skipped, named in one line; the pictures read."""
    from animegamer_jax.character.fit import read_images

    pics = tmp_path / "pics"
    (pics / "more").mkdir(parents=True)
    _picture(pics / "a.png", 0)
    _picture(pics / "B.JPG", 1)
    (pics / "README.txt").write_text("pictures of Zed")
    lines = []
    pictures = read_images(str(pics), None, "Zed", log=lines.append)
    assert [p.shape for p in pictures] == [(64, 96, 3), (64, 96, 3)]
    assert lines == [f"--images {pics}: 2 picture(s); skipped 2 file(s) that are not PNG or JPEG pictures: "
                     "README.txt, more/"]


@pytest.mark.slow
def test_fit_stores_the_character_and_only_its_turns_change(tmp_path, capsys):
    from animegamer_jax.checkpoint.store import load_config
    from animegamer_jax.game.engine import GameEngine
    from animegamer_jax.game.loading import load_game_system
    from animegamer_jax.game.script import parse_lines
    from animegamer_jax.inference.instructions import Game

    pics = tmp_path / "pics"
    pics.mkdir()
    _picture(pics / "a.png", 0)
    _picture(pics / "b.png", 1)
    out = tmp_path / "sys"
    assert main(["fit", f"--images={pics}", "--name=Zed", f"--checkpoint={TINY}", f"--out={out}", "--steps=3",
                 "--variants=4"]) == 0
    assert "characters: Zed" in capsys.readouterr().out
    man = json.loads((out / "manifest" / "metadata").read_text())
    assert man["characters"]["names"] == ["Zed"] and "characters" in man["components"]
    # the name is now stored: a second fit of it needs --overwrite
    assert "already stores" in _err(capsys, [f"--images={pics}", "--name=zed", f"--checkpoint={out}",
                                             f"--out={tmp_path / 'sys2'}"])

    config = load_config(TINY)
    game = Game("g", parse_lines(["Character: Bunny; Motion: slowly walk; Background: day meadow.",
                                  "Character: Zed; Motion: calmly stands still; Background: a plain background."]),
                seed=0)
    plays = {}
    for label, ckpt in (("base", TINY), ("fit", str(out))):
        system = load_game_system(ckpt, config)
        plays[label] = GameEngine(config, system, latency=True).play([game])[0]["turns"]
    assert np.array_equal(plays["base"][0].frames, plays["fit"][0].frames)  # Bunny: byte-identical
    assert not np.array_equal(plays["base"][1].frames, plays["fit"][1].frames)  # Zed: its LoRA
