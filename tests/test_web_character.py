"""The web page's character upload (POST /api/character), on the stand-in system (it takes references):
a new game whose turns naming the character use the picture, recorded in game.json and equal, byte for
byte, to the same game played by play/generate's path; bad uploads are one line (400/413/415) and
change nothing; and the page's upload field in headless Chromium (skipped where it is not installed).
"""

import base64
import io
import json
import os
import urllib.request

import pytest
from PIL import Image

from animegamer_jax.game import characters
from animegamer_jax.game.folder import saves
from animegamer_jax.inference.instructions import Game, parse_instruction
from animegamer_jax.web.app import create_app
from animegamer_jax.web.routes import CHARACTER_MAX_BODY
from animegamer_jax.web.sessions import MAX_CHARACTER_BYTES
from tests.web_helpers import Client, HttpThread, play_turn, post, raw, standin_server, wait

TURN_FILES = (".mp4", ".gif", ".state.npz")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = standin_server(str(tmp_path_factory.mktemp("games")), max_batch=2)
    http = HttpThread(create_app(server)).start()
    yield server, http
    http.stop()
    server.stop()


def png(size=(64, 48), colour=(200, 60, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def api_turn(c, body):
    events = c.events(c.open_turn(body))
    assert events[-1]["event"] == "done", events[-1]
    return events[-1]["state"]


def test_upload_starts_a_game_with_the_character_equal_to_plays(served, tmp_path):
    server, http = served
    c = Client(http.url)
    _, before = c.json("/api/state")
    assert before["characters"] == [] and before["references"] is True
    image = png()
    status, st = c.json("/api/character", {"name": "Bunny", "image_b64": base64.b64encode(image).decode()})
    assert status == 200, st
    assert st["characters"] == ["Bunny"] and st["seed"] == before["seed"] and st["game_id"] != before["game_id"]
    lines = ["Character: Bunny; Motion: hop; Background: meadow.", "Character: Rabbit; Motion: hop; Background: meadow.",
             "Character: bunny; Motion: sit; Background: forest."]
    for line in lines:
        st = api_turn(c, {"line": line})
    folder = os.path.join(server.out_dir, st["game_id"])
    rec = json.load(open(os.path.join(folder, "game.json")))
    char = characters.character_from_bytes("Bunny", image, "test")
    assert rec["characters"] == [{"name": "Bunny", "image": "characters/Bunny.png", "sha256": char.sha256}]
    assert [t.get("reference") for t in rec["turns"]] == ["characters/Bunny.png", None, "characters/Bunny.png"]
    assert open(os.path.join(folder, "characters", "Bunny.png"), "rb").read() == char.png
    # the same game through play / generate's path (all turns at once): the same turn files
    game = Game("same", tuple(parse_instruction(x, "t") for x in lines), st["seed"], (char,))
    result = server.engine.play([game])[0]
    other, _ = saves.save_game(server.engine.config, server.engine.model, result, str(tmp_path))
    files = sorted(n for n in os.listdir(folder) if n.startswith("turn_") and n.endswith(TURN_FILES))
    assert len(files) == 9
    for n in files:
        assert open(os.path.join(folder, n), "rb").read() == open(os.path.join(other, n), "rb").read(), n
    # the reference changed the Bunny turns: the game without the character differs there only
    engine = server.engine
    plain = saves.save_game(engine.config, engine.model, engine.play([Game("plain", game.turns, game.seed)])[0],
                            str(tmp_path))[0]
    same = [open(os.path.join(folder, f"turn_{k:03d}.state.npz"), "rb").read()
            == open(os.path.join(plain, f"turn_{k:03d}.state.npz"), "rb").read() for k in range(3)]
    differ = [open(os.path.join(folder, f"turn_{k:03d}.mp4"), "rb").read()
              != open(os.path.join(plain, f"turn_{k:03d}.mp4"), "rb").read() for k in range(3)]
    assert differ[0] and differ[2] and same[0]  # the states come from the MLLM, which sees no image
    # a second upload keeps the first character, replaces one of the same name
    status, st2 = c.json("/api/character", {"name": "Driver", "image_b64": base64.b64encode(png(colour=(9, 9, 9))).decode()})
    assert status == 200 and st2["characters"] == ["Bunny", "Driver"] and st2["turns"] == []


def test_bad_uploads_are_one_line_and_change_nothing(served):
    server, http = served
    c = Client(http.url)
    _, before = c.json("/api/state")
    listing = sorted(os.listdir(server.out_dir))
    ok = base64.b64encode(png()).decode()
    cases = [
        ({"name": "Bunny"}, 400, "character takes"),
        ({"name": "Bunny", "image_b64": ok, "x": 1}, 400, "character takes"),
        ({"name": 3, "image_b64": ok}, 400, "character takes"),
        ({"name": "Bunny", "image_b64": "not base64!"}, 400, "is not base64"),
        ({"name": "Bunny", "image_b64": base64.b64encode(b"GIF89a nope").decode()}, 400, "is not an image"),
        ({"name": "Bunny", "image_b64": base64.b64encode(png((16, 16))).decode()}, 400, "the image is 16x16 px"),
        ({"name": "a/b", "image_b64": ok}, 400, "is not a usable character name"),
        ({"name": "Bunny", "image_b64": base64.b64encode(b"\0" * (MAX_CHARACTER_BYTES + 1)).decode()}, 400,
         "over 8 MB"),
    ]
    for body, want, says in cases:
        status, j = c.json("/api/character", body)
        assert status == want and says in j["error"] and "\n" not in j["error"], (body.keys(), status, j)
    jar = next(h.cookiejar for h in c.op.handlers if isinstance(h, urllib.request.HTTPCookieProcessor))
    cookie = b"Cookie: " + "; ".join(f"{k.name}={k.value}" for k in jar).encode() + b"\r\n"
    big = b'{"name": "B", "image_b64": "' + b"A" * CHARACTER_MAX_BODY + b'"}'
    status, body = raw(http, post("/api/character", big, cookie))  # refused by Content-Length, unread
    assert status == 413 and "image of at most 8 MB" in json.loads(body)["error"]
    status, body = raw(http, post("/api/character", b"name=B", cookie, ctype=b"text/plain"))  # the Guard
    assert status == 415
    server.engine.supports_references = False
    try:
        status, j = c.json("/api/character", {"name": "Bunny", "image_b64": ok})
        assert status == 400 and "has no reference adapter" in j["error"]
    finally:
        server.engine.supports_references = True
    _, after = c.json("/api/state")
    assert after["game_id"] == before["game_id"] and after["characters"] == []
    assert sorted(os.listdir(server.out_dir)) == listing


@pytest.mark.slow
def test_browser_uploads_a_character(served, browser, tmp_path):
    server, http = served
    d = browser
    d.get(http.url + "/")
    wait(d, "return document.querySelector('#info').textContent.startsWith('game web-')", 30, "the page")
    picture = tmp_path / "bunny.png"
    picture.write_bytes(png((80, 60), (20, 180, 40)))
    d.find_element("id", "char-name").send_keys("Bunny")
    d.find_element("id", "char-image").send_keys(str(picture))
    d.find_element("id", "char-upload").click()
    wait(d, "return document.querySelector('#characters').textContent.includes('Bunny')", 30, "the upload")
    play_turn(d, 0, "Bunny", "hop", "meadow")
    game_id = d.execute_script("return document.querySelector('#info').textContent.split(' ')[1]")
    rec = json.load(open(os.path.join(server.out_dir, game_id, "game.json")))
    assert rec["characters"][0]["name"] == "Bunny" and rec["turns"][0]["reference"] == "characters/Bunny.png"
    with Image.open(os.path.join(server.out_dir, game_id, "characters", "Bunny.png")) as im:
        assert im.size == (80, 60) and im.convert("RGB").getpixel((5, 5)) == (20, 180, 40)
