"""A game folder is a save file wherever it was made (issue 53): a game made by ``generate`` and one
made in the web app (with an uploaded character, downloaded as a zip and unzipped elsewhere)
continue with ``play --continue``, and their turn files equal, byte for byte, the same game played
in one go by ``play``. Play runs the latency layout, generate and the web app the config's mesh:
the device layout is not part of a game's fingerprint (game/folder/fingerprint.py ``PLACEMENT_FIELDS``,
``same_making``)."""

import base64
import io
import json
import os
import shutil
import zipfile

import pytest
from PIL import Image

from animegamer_jax.commands import generate, play
from animegamer_jax.commands import web as web_command
from animegamer_jax.commands.game_flags import parse_game_flags
from animegamer_jax.game.folder import layout
from animegamer_jax.web.app import create_app
from animegamer_jax.web.server import build_server
from tests.web_helpers import Client, HttpThread

TEXTS = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
         "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.",
         "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest."]
CKPT = "checkpoints/tiny_system"


def _turn_files(folder) -> dict:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder)) if n.startswith("turn_")}


def _png(colour=(200, 60, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), colour).save(buf, format="PNG")
    return buf.getvalue()


def _scripts(d):
    (d / "all.txt").write_text("\n".join(TEXTS) + "\n")
    (d / "last.txt").write_text(TEXTS[2] + "\n")
    (d / "games.jsonl").write_text(json.dumps({"game_id": "gen", "turns": TEXTS[:2]}) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("system", [["--standin"], pytest.param(["--checkpoint", CKPT], marks=pytest.mark.paper)],
                         ids=["standin", "tiny_system"])
def test_a_generated_game_continues_with_play_as_one_go(tmp_path, system, capsys):
    _scripts(tmp_path)
    assert play.main([str(tmp_path / "all.txt"), *system, "--out", str(tmp_path / "one")]) == 0
    one = _turn_files(tmp_path / "one" / "all")
    assert len(one) == 9

    assert generate.main([str(tmp_path / "games.jsonl"), *system, "--out", str(tmp_path / "gen")]) == 0
    game = tmp_path / "gen" / "gen"
    assert play.main(["--continue", str(game), str(tmp_path / "last.txt"), *system]) == 0
    assert _turn_files(game) == one
    assert layout.verify_game(str(game)) is None
    rec = json.load(open(game / "game.json"))
    # what the game is, not where it ran: no mesh, sharding rules or layout in its fingerprint
    config = rec["fingerprint"]["parts"]["config"]
    assert "mesh" not in config and "sharding_rules" not in config and "play_layout" not in config["game"]
    # the same rule on generate's resume: a run of the 3-turn game keeps the game play continued
    (tmp_path / "three.jsonl").write_text(json.dumps({"game_id": "gen", "turns": TEXTS}) + "\n")
    capsys.readouterr()
    assert generate.main([str(tmp_path / "three.jsonl"), *system, "--out", str(tmp_path / "gen")]) == 0
    assert "0 games to play (0 replayed), 1 already finished" in capsys.readouterr().out


@pytest.mark.slow
def test_a_web_game_downloaded_as_zip_continues_with_play_as_one_go(tmp_path):
    """The web app's game (a character uploaded, its default batch of 4 rows), downloaded as a zip
    and unzipped elsewhere, continues with ``play --continue`` and equals ``play`` in one go."""
    _scripts(tmp_path)
    (tmp_path / "bunny.png").write_bytes(_png())
    f, _, config = parse_game_flags("animegamer-web", ["--standin", "--out", str(tmp_path / "web")],
                                    web_command.define_flags, exclude=("overwrite",))
    server = build_server(config, standin=True, out=f.out, max_batch=f.max_batch)
    server.start()
    http = HttpThread(create_app(server)).start()
    try:
        c = Client(http.url)
        status, st = c.json("/api/character", {"name": "Bunny", "image_b64": base64.b64encode(_png()).decode()})
        assert status == 200, st
        for line in TEXTS[:2]:
            events = c.events(c.open_turn({"line": line}))
            assert events[-1]["event"] == "done", events[-1]
        st = events[-1]["state"]
        game_id = st["game_id"]
        r = c.request(st["download"])
        assert r.status == 200
        data = r.read()
    finally:
        http.stop()
        server.stop()
    folder = os.path.join(server.out_dir, game_id)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        # everything the folder holds: the marker and the character's picture too
        assert z.namelist() == [f"{game_id}/{n}" for n in layout.folder_files(folder)]
        assert f"{game_id}/{layout.MARKER}" in z.namelist()
        assert f"{game_id}/characters/Bunny.png" in z.namelist()
        z.extractall(tmp_path / "elsewhere")
    shutil.rmtree(server.out_dir)  # the download stands alone
    unzipped = tmp_path / "elsewhere" / game_id
    assert play.main(["--continue", str(unzipped), str(tmp_path / "last.txt"), "--standin"]) == 0
    assert play.main([str(tmp_path / "all.txt"), "--standin", "--character", f"Bunny={tmp_path / 'bunny.png'}",
                      "--out", str(tmp_path / "one")]) == 0
    assert _turn_files(unzipped) == _turn_files(tmp_path / "one" / "all")
    assert len(json.load(open(unzipped / "game.json"))["turns"]) == 3
