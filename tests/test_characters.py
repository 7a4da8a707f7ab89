"""--character NAME=IMAGE (game/characters.py): reference images for the turns naming a character,
on the random stand-in (which takes references): per-game outputs independent of the batch, turns
not naming the character byte-identical to a game without it, the game folder keeping the image,
--continue reloading it, interactive = script."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from animegamer_jax.commands import play
from animegamer_jax.game import characters
from tests.subproc import run_python

REF = "data/characters/Bunny/ref.png"
T = ["Character: Bunny; Motion: hop; Background: meadow.", "Character: Driver; Motion: shout; Background: car.",
     "Character: bunny; Motion: sit; Background: meadow."]


@pytest.mark.slow
def test_mixed_batch_each_game_equals_itself_alone():
    """Batch of 2 on 2 devices: a game with a reference beside one without; each equals itself alone;
    the reference changes exactly the turns naming the character."""
    out = run_python("""
        import numpy as np, jax
        from animegamer_jax import parallel
        from animegamer_jax.config import load_config
        from animegamer_jax.game.characters import load_character
        from animegamer_jax.game.engine import GameEngine
        from animegamer_jax.inference.instructions import Game, parse_instruction
        from animegamer_jax.inference.standin_model import StandinTurnModel
        T = TEXTS_HERE
        cfg = load_config("configs/tiny.py")
        sysm = StandinTurnModel(cfg)
        bunny = load_character("Bunny=data/characters/Bunny/ref.png")
        turns = tuple(parse_instruction(t) for t in T)
        a, b, a0 = Game("a", turns, 3, (bunny,)), Game("b", turns[::-1], 4), Game("a0", turns, 3)
        big = GameEngine(cfg, sysm)
        assert big.batch_size == 2
        ra, rb = big.play([a, b])
        one = GameEngine(cfg, sysm, mesh=parallel.mesh_from_config(cfg, devices=jax.devices()[:1]))
        for r, g in ((ra, a), (rb, b)):
            alone = one.play([g])[0]
            for x, y in zip(r["turns"], alone["turns"]):
                assert x.states == y.states and np.array_equal(x.frames, y.frames)
        plain = one.play([a0])[0]
        same = [bool(np.array_equal(x.frames, y.frames)) for x, y in zip(ra["turns"], plain["turns"])]
        print("SAME", same)
    """.replace("TEXTS_HERE", repr(T)), devices=2)
    assert "SAME [False, True, False]" in out


def _files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()
            and p.name != "timings.json"}


@pytest.mark.slow
def test_play_keeps_the_reference_and_continue_reloads_it(tmp_path, monkeypatch, capsys):
    s2, s1, s3 = tmp_path / "g.txt", tmp_path / "more.txt", tmp_path / "all.txt"
    s2.write_text("\n".join(T[:2]) + "\n")
    s1.write_text(T[2] + "\n")
    s3.write_text("\n".join(T) + "\n")
    out = tmp_path / "o"
    std = ["--standin", "--out", str(out), "--config.game.seed=5"]
    assert play.main([str(s3), *std, "--game-id", "plain"]) == 0
    assert play.main([str(s3), *std, "--game-id", "one", "--character", f"BUNNY={REF}"]) == 0
    assert play.main([str(s2), *std, "--game-id", "cont", "--character", f"BUNNY={REF}"]) == 0
    rec = json.loads((out / "cont" / "game.json").read_text())
    png = (out / "cont" / "characters" / "BUNNY.png").read_bytes()
    assert rec["characters"] == [{"name": "BUNNY", "image": "characters/BUNNY.png",
                                  "sha256": characters.Character("BUNNY", png).sha256}]
    assert [t.get("reference") for t in rec["turns"]] == ["characters/BUNNY.png", None]
    assert Image.open(io.BytesIO(png)).size == Image.open(REF).size
    assert play.main([str(s1), "--standin", "--continue", str(out / "cont")]) == 0
    one, cont, plain = _files(out / "one"), _files(out / "cont"), _files(out / "plain")
    for k in range(3):  # --continue = one go; only the turns naming Bunny differ from the plain game
        name = f"turn_{k:03d}.mp4"
        assert cont[name] == one[name]
        assert (one[name] == plain[name]) == (k == 1), k
    assert "characters/BUNNY.png" in cont and "BUNNY" in (out / "cont" / "index.html").read_text()
    capsys.readouterr()
    # typed turns equal the script's
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(T) + "\n"))
    assert play.main(["-", *std, "--game-id", "typed", "--character", f"BUNNY={REF}"]) == 0
    typed = _files(out / "typed")
    assert all(typed[f"turn_{k:03d}.mp4"] == one[f"turn_{k:03d}.mp4"] for k in range(3))
    # --character with a plain --continue is refused (the game keeps its own)
    assert play.main([str(s1), "--standin", "--continue", str(out / "cont"), "--character", f"X={REF}"]) == 2
    assert "--character does not apply to --continue" in capsys.readouterr().err


def test_image_checks(tmp_path, monkeypatch):
    (tmp_path / "t.png").write_bytes(b"")
    Image.new("RGB", (31, 200)).save(tmp_path / "small.png")
    Image.new("RGB", (8193, 40)).save(tmp_path / "wide.png")
    (tmp_path / "x.txt").write_text("hello")
    for value, needle in [("Bunny", "expected NAME=IMAGE"), (f"={REF}", "expected NAME=IMAGE"),
                          (f"a/b={REF}", "not a usable character name"),
                          (f"B={tmp_path}/missing.png", "cannot read the image"),
                          (f"B={tmp_path}/x.txt", "is not an image"), (f"B={tmp_path}/t.png", "is not an image"),
                          (f"B={tmp_path}/small.png", "31x200 px"), (f"B={tmp_path}/wide.png", "8193x40 px")]:
        with pytest.raises(characters.CharacterError, match=needle):
            characters.load_character(value)
    with pytest.raises(characters.CharacterError, match="given twice"):
        characters.load_characters([f"B={REF}", f"b={REF}"])
    monkeypatch.setattr(characters, "MAX_BYTES", 1000)
    with pytest.raises(characters.CharacterError, match="over the 0.000953674 MB limit"):
        characters.load_character(f"B={REF}")


def test_fit_image_covers_and_centre_crops():
    img = np.zeros((100, 50, 3), np.uint8)
    img[:, :, 0] = np.arange(100)[:, None]
    out = characters.fit_image(img, 64, 96)
    assert out.shape == (64, 96, 3)
    # scaled x1.92 to 96 wide, 192 tall, then the middle 64 rows: the source's rows ~33..66
    assert 30 <= out[0, 48, 0] <= 36 and 63 <= out[-1, 48, 0] <= 69
