"""The web front end (``python -m animegamer_jax.commands.web``) on the shipped tiny system.

One server for the module (one engine, one compile): HTTP-level tests (bad input, two games at
once, failed turns, the CLI's error) and a real-browser test (headless Debian Chromium driven by
selenium + chromedriver: two turns, the clip changes and plays, the meters move, Undo, Restart, a
screenshot). The browser is installed by ``make browser`` (run by ``make test`` and CI); the browser
test is skipped, saying so, only where it could not be installed.
"""

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from animegamer_jax import checkpoint
from animegamer_jax.commands.game_flags import OUT_DIR
from animegamer_jax.config import load_config
from animegamer_jax.game.folder import layout, saves
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.inference.standin_model import StandinTurnModel
from animegamer_jax.inference.turn_model import ChunkedDecode
from animegamer_jax.inference.instructions import GameScriptError, parse_instruction
from animegamer_jax.web.app import create_app
from animegamer_jax.web.server import GameServer, build_server
from tests.web_helpers import PLAYING, Client, HttpThread, play_turn, wait

pytestmark = pytest.mark.slow  # its tests (or the fixtures they share) take over ~10 s each on a loaded 2-core host

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CKPT = os.path.join(ROOT, "checkpoints", "tiny_system")
#: where test_browser_plays_two_turns_undo_restart copies its screenshot (docs/serve_screenshot.png), if set
SCREENSHOT = os.path.abspath(os.environ["AGJ_SCREENSHOT"]) if os.environ.get("AGJ_SCREENSHOT") else None


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("web_games")
    # one turn per step: test_two_games_at_once checks the queue positions of one player behind
    # another (batches of several players: tests/test_web_saves.py, tests/test_web_load.py)
    # the checkpoint as a relative path (checkpoints/tiny_system from the repository root): the page
    # names the system by it, as it names the one `--checkpoint checkpoints/tiny_system` serves
    server = build_server(checkpoint.load_config(CKPT), os.path.relpath(CKPT), out=str(out), max_batch=1)
    server.start()
    http = HttpThread(create_app(server)).start()
    yield server, http
    http.stop()
    server.stop()


def test_bad_input_is_refused_with_the_parsers_message(served):
    server, http = served
    c = Client(http.url)
    before = server.turns_played, sorted(os.listdir(server.out_dir))
    status, j = c.json("/api/turn", {"character": "Bunny", "motion": "  ", "background": "meadow"})
    with pytest.raises(GameScriptError) as want:
        parse_instruction("Character: Bunny; Motion: ; Background: meadow.", "turn 1")
    assert status == 400 and j["error"] == str(want.value) and j["fields"] == ["motion"]
    assert "field 'Motion' is empty" in j["error"] and "Fix:" in j["error"]
    status, j = c.json("/api/turn", {"line": "Character Bunny; Motion: run; Background: day"})
    assert status == 400 and j["fields"] == ["line"] and "'Character Bunny' is not a 'Key: value' field" in j["error"]
    status, j = c.json("/api/turn", {"character": "", "motion": "", "background": "x"})
    assert status == 400 and j["fields"] == ["character"]  # the parser stops at the first problem
    status, j = c.json("/api/turn", {"character": "Bunny", "motion": "run " * 400, "background": "day"})
    assert status == 400 and "max_instruction_tokens" in j["error"]
    status, j = c.json("/api/turn", raw=b"{not json")
    assert status == 400 and "not JSON" in j["error"]
    status, j = c.json("/api/turn", {"character": "Bunny", "motion": "run", "background": "day", "speed": 3})
    assert status == 400 and "unknown key(s) ['speed']" in j["error"]
    status, j = c.json("/api/turn", {"character": ["Bunny"], "motion": "run", "background": "day"})
    assert status == 400 and j["fields"] == ["character"]
    assert c.json("/api/undo", {})[0] == 400
    assert c.json("/api/restart", {"seed": "three"})[0] == 400
    status, state = c.json("/api/state")
    assert status == 200 and state["turns"] == [] and state["download"] is None
    # what the shipped system is (its checkpoint's manifest description), for the page's #about line
    assert state["system_description"] == checkpoint.read_manifest(CKPT)["description"]
    assert "81 two-second 64x96 clips" in state["system_description"]
    assert (server.turns_played, sorted(os.listdir(server.out_dir))) == before


def test_two_games_at_once(served):
    server, http = served
    a, b = Client(http.url), Client(http.url)
    ra = a.open_turn({"character": "Bunny", "motion": "slowly walk", "background": "day meadow"})
    rb = b.open_turn({"line": "Character: Squirrel; Motion: quickly climb a tree; Background: forest."})
    # one pending turn per game
    status, j = a.json("/api/turn", {"character": "Bunny", "motion": "hop", "background": "day"})
    assert status == 409 and "already queued or running" in j["error"]
    assert a.json("/api/undo", {})[0] == 409 and a.json("/api/restart", {})[0] == 409
    ev_a, ev_b = Client.events(ra), Client.events(rb)
    assert ev_a[-1]["event"] == "done" and ev_b[-1]["event"] == "done", (ev_a[-1], ev_b[-1])
    # b waited behind a, and was told so (batch size 1 on one CPU device)
    assert server.engine.batch_size == 1
    # Exactly one turn was ahead of b when it was queued: position 2 when the worker had not yet taken
    # a's turn off the queue, else 1 (a running). The worker re-announces as a starts and ends, so
    # b is then next (position 1), with a running (ahead 1) or done (ahead 0), until b starts.
    queued_b = [e for e in ev_b if e["event"] == "queued"]
    ticket_a = next(e for e in ev_a if e["event"] == "queued")["ticket"]
    assert all(e["ticket"] == ticket_a + 1 for e in queued_b)  # queued right after a (tests/test_web_load.py: FIFO)
    assert {**queued_b[0], "ticket": None} in ({"event": "queued", "position": 1, "ahead": 1, "ticket": None},
                                               {"event": "queued", "position": 2, "ahead": 1, "ticket": None}), queued_b
    assert all(e["position"] == 1 and e["ahead"] in (0, 1) for e in queued_b[1:]), queued_b
    names_b = [e["event"] for e in ev_b]
    assert max(i for i, n in enumerate(names_b) if n == "queued") < names_b.index("started")
    for ev in (ev_a, ev_b):
        names = [e["event"] for e in ev]
        assert names.index("started") < names.index("frames") < names.index("done")
        assert sum(len(e["frames"]) for e in ev if e["event"] == "frames") == 17
        assert [e["start"] for e in ev if e["event"] == "frames"] == [0, 9]  # two VAE chunks, streamed
    sa, sb = ev_a[-1]["state"], ev_b[-1]["state"]
    assert sa["game_id"] != sb["game_id"]
    assert [t["instruction"] for t in sa["turns"]] == ["Character: Bunny; Motion: slowly walk; Background: day meadow."]
    assert [t["instruction"] for t in sb["turns"]] == [
        "Character: Squirrel; Motion: quickly climb a tree; Background: forest."]
    assert a.json("/api/state")[1]["turns"] == sa["turns"] and b.json("/api/state")[1]["game_id"] == sb["game_id"]
    # saved after the turn, in the play layout
    for s in (sa, sb):
        rec = json.load(open(os.path.join(server.out_dir, s["game_id"], "game.json")))
        assert rec["instructions"] == [s["turns"][0]["instruction"]] and rec["turns"][0]["video"] == "turn_000.mp4"
        assert rec["states"][0] == list(s["turns"][0]["states"].values())
    # the streamed frames are the clip's frames (the saved MP4 holds them enlarged above the HUD)
    streamed = [f for e in ev_a if e["event"] == "frames" for f in e["frames"]]
    clip = layout.read_video(os.path.join(server.out_dir, sa["game_id"], "turn_000.mp4"))
    for k in (0, 8, 9, 16):  # first and last frame of both VAE chunks
        img = np.asarray(Image.open(io.BytesIO(base64.b64decode(streamed[k].split(",", 1)[1]))))
        h, w, _ = img.shape
        f = -(-240 // w)
        saved = clip[k, : h * f : f, : w * f : f]
        assert img.shape == saved.shape and np.abs(img.astype(int) - saved.astype(int)).mean() < 12
    # files only for their own session
    va, vb = sa["turns"][0]["video"], sb["turns"][0]["video"]
    assert a.request(va).status == 200 and b.request(vb).status == 200
    assert a.request(vb).status == 404 and b.request(va).status == 404
    z = zipfile.ZipFile(io.BytesIO(a.request(sa["download"]).read()))
    assert f"{sa['game_id']}/game.json" in z.namelist() and f"{sa['game_id']}/turn_000.mp4" in z.namelist()
    assert b.request(sa["download"]).status == 404


def test_failed_turn_leaves_the_game_as_it_was(served, monkeypatch):
    server, http = served
    c = Client(http.url)
    body = {"character": "Bunny", "motion": "gently sit", "background": "evening meadow"}

    def broken_step(*a, **k):
        raise RuntimeError("simulated device failure")

    monkeypatch.setattr(server.engine, "step", broken_step)
    ev = Client.events(c.open_turn(body))
    assert ev[-1]["event"] == "error" and "simulated device failure" in ev[-1]["message"]
    assert "the game is unchanged" in ev[-1]["message"]
    monkeypatch.undo()

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(saves, "save_game", full_disk)
    ev = Client.events(c.open_turn(body))
    assert ev[-1]["event"] == "error" and "could not be saved" in ev[-1]["message"]
    state = c.json("/api/state")[1]
    assert state["turns"] == [] and not os.path.exists(os.path.join(server.out_dir, state["game_id"]))
    monkeypatch.undo()
    assert server.alive
    ev = Client.events(c.open_turn(body))
    assert ev[-1]["event"] == "done" and len(ev[-1]["state"]["turns"]) == 1


def test_cli_reports_a_missing_checkpoint():
    proc = subprocess.run([sys.executable, "-m", "animegamer_jax.commands.web", "--checkpoint", "/nonexistent/ckpt",
                           "--nowarmup"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "checkpoint directory '/nonexistent/ckpt' not found" in proc.stderr and "Fix:" in proc.stderr


# -- the real browser ------------------------------------------------------------------------------

def _page_meters(driver):
    return driver.execute_script(
        "const o={}; for (const n of ['social','entertainment','stamina']) {"
        " const v=document.querySelector('#meters [data-meter='+n+']').textContent;"
        " const w=document.querySelector('#meters .fill.'+n).style.width;"
        " const d=document.querySelector('#meters [data-delta='+n+']').textContent;"
        " o[n]=[Number(v), w, d]; } return o;")


@pytest.fixture
def served_in_a_checkout(served, tmp_path, monkeypatch):
    """A server and its HTTP thread over ``served``'s engine, run in an empty working folder and
    writing to the web command's default ``--out`` (outputs/games, relative): the page shows the paths that
    `python -m animegamer_jax.commands.web --checkpoint checkpoints/tiny_system` shows in a checkout (the
    screenshot in docs/commands.md), not this machine's."""
    engine = served[0].engine
    monkeypatch.chdir(tmp_path)
    server = GameServer(engine, OUT_DIR)
    server.start()
    http = HttpThread(create_app(server)).start()
    yield server, http
    http.stop()
    server.stop()


def test_browser_plays_two_turns_undo_restart(served_in_a_checkout, browser, tmp_path, record_property):
    server, http = served_in_a_checkout
    assert not os.path.isabs(server.out_dir)
    d = browser
    d.get(http.url + "/")
    wait(d, "return document.querySelector('#info').textContent.startsWith('game web-')", 30, "the page")
    start = server.engine.new_run().meters.as_dict()
    assert {n: v[0] for n, v in _page_meters(d).items()} == start
    step = int(server.engine.config.game.meter_step)

    t1 = play_turn(d, 0, "Bunny", "slowly walk out of the burrow", "day meadow")
    m1 = _page_meters(d)
    t2 = play_turn(d, 1, "Bunny", "quickly chase a butterfly", "day forest")
    m2 = _page_meters(d)
    for t in (t1, t2):
        # frames of the clip were on screen before the turn finished (streamed VAE chunks)
        assert t["first"] is not None and t["click"] < t["first"] < t["done"] and t["shown"] >= 1
    first_frame_s = (t2["first"] - t2["click"]) / 1000
    record_property("generate_to_first_frame_s_cold", (t1["first"] - t1["click"]) / 1000)
    record_property("generate_to_first_frame_s_warm", first_frame_s)
    print(f"\nGenerate -> first frame shown: turn 1 (compiles) {(t1['first'] - t1['click']) / 1000:.2f} s, "
          f"turn 2 {first_frame_s:.2f} s; turn done {(t2['done'] - t2['click']) / 1000:.2f} s")

    # the meters on the page are the engine's (as saved), drawn as bars, with this turn's change
    game_id = d.execute_script("return document.querySelector('#info').textContent").split()[1]
    rec = json.load(open(os.path.join(server.out_dir, game_id, "game.json")))
    assert len(rec["turns"]) == 2
    # the page and the saved game say what the system is
    about = d.execute_script("return document.querySelector('#about').textContent")
    assert about == rec["system_description"] == server.engine.model.description
    assert "81 two-second 64x96 clips" in about
    prev = start
    for meters_page, turn in ((m1, rec["turns"][0]), (m2, rec["turns"][1])):
        want = turn["meters"]
        for n, (v, width, delta) in meters_page.items():
            assert v == want[n] and width == f"{want[n]}%" and delta == f"{want[n] - prev[n]:+d}"
        prev = want
    moved = [n for n in start if rec["turns"][1]["meters"][n] != start[n]]
    assert moved, f"no meter moved in two turns (states {rec['states']})"
    assert rec["meters"][0] == {n: max(0, min(100, start[n] + step * s)) for n, s in
                                zip(("social", "entertainment", "stamina"), rec["states"][0][1:])}
    assert d.execute_script("return document.querySelectorAll('#history figure').length") == 2
    assert d.execute_script("return document.querySelector('#clip').controls") is True
    assert "Bunny" in d.find_element("id", "caption").text and "butterfly" in d.find_element("id", "caption").text
    href = d.find_element("id", "download").get_attribute("href")
    assert href.endswith(f"/games/{game_id}.zip")

    shot = tmp_path / "serve.png"
    d.execute_script("window.scrollTo(0, 0)")
    assert d.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
    if SCREENSHOT:
        shutil.copy(shot, SCREENSHOT)

    # Undo: back to turn 1's clip and meters, and the saved game has one turn
    d.find_element("id", "undo").click()
    wait(d, "return document.querySelectorAll('#history figure').length === 1", 60, "undo")
    wait(d, PLAYING.replace("arguments[0]", "'turn_000.mp4'"), 30, "turn 1's clip after undo")
    assert _page_meters(d) == m1
    assert len(json.load(open(os.path.join(server.out_dir, game_id, "game.json")))["turns"]) == 1

    # Restart: a new game at the start meters; the old one stays saved
    d.find_element("id", "restart").click()
    wait(d, f"return !document.querySelector('#info').textContent.includes('{game_id}') && "
             "document.querySelectorAll('#history figure').length === 0", 30, "restart")
    assert {n: v[0] for n, v in _page_meters(d).items()} == start
    assert layout.is_finished(os.path.join(server.out_dir, game_id))

    # everything came from this server (the page works offline), and no script error
    urls = d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(u.startswith(http.url) or u.startswith("data:") for u in urls), urls
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def _files(folder, prefix="turn_"):
    """{name: bytes} of ``folder``'s turn files (clip, GIF, state record)."""
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))
            if n.startswith(prefix) and n.endswith((".mp4", ".gif", ".state.npz"))}


def _page_game(driver):
    return driver.execute_script("return document.querySelector('#info').textContent").split()[1]


def test_browser_undo_branch_and_continue_after_a_restart(served, browser, tmp_path):
    """In the page: two turns, Undo last turn, a new second turn, Branch from turn 1 (picked in the
    history), then the server restarts on the same game folder and port, the page lists the first
    game under Saved games and continues it with a third turn. Its turn files equal the same three
    turns played in one go; the branch's turn 1 equals the first game's; the branch left the first
    game's turn files as they were."""
    from animegamer_jax.inference.instructions import Game
    from animegamer_jax.game.turn_by_turn import instruction_from_fields
    from animegamer_jax.web.server import GameServer
    from animegamer_jax.web.sessions import SESSIONS_FILE

    engine, out, d = served[0].engine, str(tmp_path / "games"), browser
    turns = [("Bunny", "slowly walk out of the burrow", "day meadow"),  # turn 1
             ("Bunny", "quickly chase a butterfly", "day forest"),  # turn 2, undone
             ("Bunny", "happily stretch in the sun", "day meadow"),  # turn 2 again
             ("Bunny", "jump over a log", "night forest")]  # turn 3, after the restart

    def serve(port=0):
        srv = GameServer(engine, out)
        srv.start()
        return srv, HttpThread(create_app(srv), port=port).start()

    srv, http = serve()
    port = http.port
    try:
        d.get(http.url + "/")
        wait(d, "return document.querySelector('#info').textContent.startsWith('game web-')", 30, "the page")
        assert d.find_element("id", "undo").text == "Undo last turn"
        assert not d.find_element("id", "branch").is_enabled()  # nothing to branch from yet
        play_turn(d, 0, *turns[0])
        play_turn(d, 1, *turns[1])
        first = _page_game(d)
        folder = os.path.join(out, first)
        assert len(_files(folder)) == 6
        d.find_element("id", "undo").click()
        wait(d, "return document.querySelectorAll('#history figure').length === 1", 60, "undo")
        assert sorted(_files(folder)) == ["turn_000.gif", "turn_000.mp4", "turn_000.state.npz"]
        play_turn(d, 1, *turns[2], done=3)
        before = _files(folder)
        assert len(before) == 6 and d.find_element("id", "branch").text == "Branch from turn 2"
        stats = {n: os.stat(os.path.join(folder, n)).st_mtime_ns for n in before}

        d.find_element("css selector", "#history figure[data-turn='0']").click()  # pick turn 1
        assert d.find_element("id", "branch").text == "Branch from turn 1"
        d.find_element("id", "branch").click()
        wait(d, f"return !document.querySelector('#info').textContent.includes('{first}') && "
                 "document.querySelectorAll('#history figure').length === 1", 60, "the branch")
        branch = _page_game(d)
        listed = d.execute_script("return [...document.querySelectorAll('#saved-games li')].map(e => e.textContent)")
        assert listed == sorted([f"{branch} (playing) · 1 turn", f"{first} · 2 turns"], reverse=True), listed
    finally:
        http.stop()
        srv.stop()
    # the branch: turn 1's files copied from the first game, which it did not touch
    assert _files(os.path.join(out, branch)) == _files(folder, "turn_000")
    assert _files(folder) == before
    assert {n: os.stat(os.path.join(folder, n)).st_mtime_ns for n in before} == stats
    assert json.load(open(os.path.join(out, SESSIONS_FILE)))["sessions"].popitem()[1] == {
        "games": sorted([first, branch]), "current": branch}

    srv, http = serve(port)  # a new server on the same game folder and port: the session is known again
    # what the open page asked for while no server listened (its video, say) was refused: drop those
    # entries, so the check below reads what the page logged once the new server is up
    d.get_log("browser")
    try:
        d.refresh()
        wait(d, f"return document.querySelector('#info').textContent.startsWith('game {branch}') && "
                 "document.querySelectorAll('#history figure').length === 1", 60, "the branch after the restart")
        d.find_element("css selector", f"#saved-games a[data-game='{first}']").click()  # continue the first game
        wait(d, f"return document.querySelector('#info').textContent.startsWith('game {first}') && "
                 "document.querySelectorAll('#history figure').length === 2", 60, "the first game continued")
        assert d.find_element("id", "branch").text == "Branch from turn 2"
        play_turn(d, 2, *turns[3], done=1)  # the reloaded page counts from 0
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        http.stop()
        srv.stop()

    # the same three turns played in one go: every turn file byte-identical
    seed = json.load(open(os.path.join(folder, "game.json")))["seed"]
    assert seed == srv.seed
    one_go = Game("one-go", tuple(instruction_from_fields(*t) for t in (turns[0], turns[2], turns[3])), seed)
    ref, _ = saves.save_game(engine.config, engine.model, engine.play([one_go])[0], str(tmp_path / "ref"))
    got, want = _files(folder), _files(ref)
    assert len(want) == 9 and sorted(got) == sorted(want)
    assert [n for n in want if got[n] != want[n]] == []
    assert _files(os.path.join(out, branch)) == _files(ref, "turn_000")


def test_engine_streams_decode_chunks():
    """GameEngine.step(on_frames=...) runs the model's streaming decode over its plan, the cache carried."""
    cfg = load_config("configs/tiny.py")

    def decode(p, z):  # causal in time: frame t depends on latents 0..t
        return jnp.moveaxis(jnp.cumsum(z[:, :, :3], axis=1), 2, -1)

    def decode_chunk(p, z, cache):
        x = jnp.cumsum(z[:, :, :3], axis=1) + (0.0 if cache is None else cache)
        return jnp.moveaxis(x, 2, -1), x[:, -1:]

    system = StandinTurnModel(cfg)
    system.decode, system.streaming = decode, ChunkedDecode((3, 2), decode_chunk)
    eng = GameEngine(cfg, system)
    run = eng.new_run()
    ids = eng.tok.encode_plain("Character: Bunny; Motion: hop; Background: day.")
    got = []
    _, _, streamed, timing = eng.step([run], [3], [ids], [0], on_frames=lambda s, f: got.append((s, f.copy())))
    _, _, whole, _ = eng.step([run], [3], [ids], [0])
    assert [(s, f.shape[1]) for s, f in got] == [(0, 3), (3, 2)] and timing["vae_s"] > 0
    np.testing.assert_allclose(streamed, whole, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([f for _, f in got], axis=1), whole, rtol=1e-6, atol=1e-6)
    system.streaming = ChunkedDecode((3, 3), decode_chunk)
    bad = GameEngine(cfg, system)
    with pytest.raises(ValueError, match=r"decode_plan \(3, 3\) does not split 5"):
        bad.step([run], [3], [ids], [0], on_frames=lambda s, f: None)
