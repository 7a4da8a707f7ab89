"""Inputs of a game that used to end in a traceback or a wrong picture (issue 53): a game.json of valid
JSON with wrong types on ``play --continue``, reference images of every PIL mode (16-bit greyscale
kept as its top 8 bits, not clipped to white), and a ``--character`` name the game never uses; each
bad one is one ``error:`` line and exit status 2."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from animegamer_jax.commands import generate, play
from animegamer_jax.game import characters

TEXTS = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
         "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow."]


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _rgb(data: bytes) -> np.ndarray:
    return characters.character_from_bytes("Bunny", data, "test").pixels()


def test_reference_images_of_every_mode_become_8_bit_rgb():
    ramp = (np.arange(64 * 64, dtype=np.int64).reshape(64, 64) * 16)  # 0 .. 65520
    sixteen = Image.fromarray(ramp.astype(np.uint16))
    assert sixteen.mode == "I;16" and Image.open(io.BytesIO(_png(sixteen))).mode == "I;16"
    want = np.repeat((ramp >> 8).astype(np.uint8)[..., None], 3, axis=-1)
    np.testing.assert_array_equal(_rgb(_png(sixteen)), want)  # was 255 (white) for all but the first row
    np.testing.assert_array_equal(np.asarray(characters.rgb8(Image.fromarray(ramp.astype(np.int32)))), want)  # I
    over = Image.fromarray(np.full((40, 40), 70000, np.int32))  # I beyond 16 bits: clipped to white
    assert np.asarray(characters.rgb8(over)).min() == 255
    grey = (np.arange(40 * 40).reshape(40, 40) % 256).astype(np.uint8)
    la = Image.fromarray(np.stack([grey, np.full_like(grey, 7)], -1), "LA")
    np.testing.assert_array_equal(_rgb(_png(la)), np.repeat(grey[..., None], 3, -1))  # alpha dropped
    pal = Image.fromarray(grey, "L").convert("P")
    np.testing.assert_array_equal(_rgb(_png(pal)), np.asarray(pal.convert("RGB")))
    rgb = _rgb(_png(Image.fromarray(np.stack([grey, 255 - grey, grey // 2], -1), "RGB")))
    assert rgb.dtype == np.uint8 and rgb.shape == (40, 40, 3) and rgb[0, 5].tolist() == [5, 250, 2]


@pytest.fixture
def saved(tmp_path):
    """A saved one-turn stand-in game ``out/g`` and a one-turn script to continue it with."""
    (tmp_path / "g.txt").write_text(TEXTS[0] + "\n")
    (tmp_path / "more.txt").write_text(TEXTS[1] + "\n")
    assert play.main([str(tmp_path / "g.txt"), "--standin", "--out", str(tmp_path / "out")]) == 0
    return tmp_path, tmp_path / "out" / "g"


@pytest.mark.parametrize("change, why", [
    (lambda r: r.update(turns={"0": r["turns"][0]}), "turns is not a list"),
    (lambda r: r.update(seed="7"), "seed is not an integer"),
    (lambda r: r["turns"][0].update(states=[1, 0, 0, 0]), "turns[0].states is not an object"),
    (lambda r: r["turns"][0]["meters"].update(social="50"), "turns[0].meters.social is not an integer"),
    (lambda r: r["files"].update({"turn_000.mp4": "abc"}), "files['turn_000.mp4'] is not an object"),
    (lambda r: r.update(instructions=[1]), "instructions[0] is not a string"),
    (lambda r: r.update(characters={"name": "Bunny"}), "characters is not a list"),
])
def test_a_game_json_of_wrong_types_is_one_line(saved, capsys, change, why):
    d, g = saved
    rec = json.load(open(g / "game.json"))
    change(rec)
    (g / "game.json").write_text(json.dumps(rec))
    capsys.readouterr()
    assert play.main(["--continue", str(g), str(d / "more.txt"), "--standin"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: cannot continue {g}: its game.json is damaged ({why}). Fix: replay the "
                                f"game (play SCRIPT --overwrite)"]


def test_an_unused_character_name_is_refused(tmp_path, capsys):
    (tmp_path / "g.txt").write_text(TEXTS[0] + "\n")
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(tmp_path / "ref.png")
    (tmp_path / "g.jsonl").write_text(json.dumps({"game_id": "g", "turns": TEXTS}) + "\n")
    for main, args in ((play.main, [str(tmp_path / "g.txt")]), (generate.main, [str(tmp_path / "g.jsonl")])):
        capsys.readouterr()
        assert main([*args, "--standin", "--out", str(tmp_path / "out"),
                     f"--character=Bunnny={tmp_path / 'ref.png'}"]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: --character Bunnny: no turn of {args[0]} names the character 'Bunnny' (its Character fields: "
            f"Bunny). Fix: name the character as the script's 'Character:' field does, or drop it"]
    assert not (tmp_path / "out").exists()
    # the name as the script writes it, any case, is used
    assert play.main([str(tmp_path / "g.txt"), "--standin", "--out", str(tmp_path / "out"),
                      f"--character=bunny={tmp_path / 'ref.png'}"]) == 0
    assert [c["name"] for c in json.load(open(tmp_path / "out" / "g" / "game.json"))["characters"]] == ["bunny"]
