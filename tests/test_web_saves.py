"""The web server's saves and batches, in process on the stand-in system (no HTTP).

* a long web game: every turn's save writes the same files (the new turn's clip, GIF and state,
  game.json, index.html, timings.json), no earlier turn's file is touched, and the turn files equal
  the same game played in one go; game.mp4 / the contact sheet are made on demand;
* players per chip: games played together in one batched step equal, byte for byte, the same
  games played alone on the server (its one batch shape);
* undo takes the last turn off the save (the game still loads and continues).
"""

import os
import time

import pytest

from animegamer_jax.game.folder import layout, saves
from animegamer_jax.game.folder.load import load_game
from animegamer_jax.game.turn_by_turn import instruction_from_fields
from animegamer_jax.inference.instructions import Game
from tests.web_helpers import standin_server

TURN_FILES = (".mp4", ".gif", ".state.npz")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = standin_server(str(tmp_path_factory.mktemp("games")), max_batch=4)
    yield srv
    srv.stop()


def fields(i: int, who: str = "Bunny") -> dict:
    return {"character": who, "motion": f"hops {i % 7} times", "background": ["meadow", "kitchen"][i % 2]}


def play(srv, s, body: dict) -> dict:
    """One turn of session ``s``; returns its ``done`` event."""
    job = srv.submit(s, *srv.parse_turn(s, body))
    deadline = time.time() + 120
    while not job.finished:
        assert time.time() < deadline, "turn did not finish"
        time.sleep(0.01)
    assert job.events[-1]["event"] == "done", job.events[-1]
    return job.events[-1]


def snapshot(folder: str) -> dict:
    return {n: (st.st_ino, st.st_mtime_ns, st.st_size) for n in os.listdir(folder)
            for st in [os.stat(os.path.join(folder, n))]}


def turn_files(folder: str) -> dict:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))
            if n.startswith("turn_") and n.endswith(TURN_FILES)}


@pytest.mark.parametrize("n", [10, pytest.param(40, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_save_work_per_turn_does_not_grow_and_equals_one_go(server, n):
    s = server.sessions.new()
    folder, touched, media_bytes = None, [], []
    for i in range(n):
        before = snapshot(folder) if folder else {}
        play(server, s, fields(i))
        folder = os.path.join(server.out_dir, s.game.game_id)
        after = snapshot(folder)
        changed = sorted(k for k, v in after.items() if before.get(k) != v)
        touched.append(changed)
        media_bytes.append(sum(after[k][2] for k in changed if k.endswith(TURN_FILES)))
        assert s.game.results[i].frames is None  # saved: not held in memory
    for k in range(1, n):
        assert touched[k] == sorted([f"turn_{k:03d}.gif", f"turn_{k:03d}.mp4", f"turn_{k:03d}.state.npz",
                                     "game.json", "index.html", "timings.json"]), k
    # the new turn's media: the same size class at turn 40 as at turn 2 (no earlier turn rewritten)
    assert media_bytes[-1] < 2 * max(media_bytes[1:5])
    # game.mp4 / contact sheet: made once on demand, covering every turn
    rec = layout.read_json(os.path.join(folder, layout.GAME_JSON))
    assert rec["save"]["derived"]["turns"] == 1
    assert server.sessions.finish_game(s, s.game.game_id) == folder
    rec = layout.read_json(os.path.join(folder, layout.GAME_JSON))
    assert rec["save"]["derived"]["turns"] == n
    assert len(layout.read_video(os.path.join(folder, "game.mp4"))) == sum(
        len(layout.read_video(os.path.join(folder, f"turn_{k:03d}.mp4"))) for k in range(n))
    # the same game in one go (same engine, same batch shape): every turn file equal
    game = Game("one-go", tuple(s.game.turns), s.game.seed)
    one_go, _ = saves.save_game(server.engine.config, server.engine.model, server.engine.play([game])[0],
                                os.path.join(server.out_dir, f"ref-{n}"))
    ref, got = turn_files(one_go), turn_files(folder)
    assert len(ref) == 3 * n and ref.keys() == got.keys()
    assert [k for k in ref if ref[k] != got[k]] == []
    # and it loads back as a game to continue
    loaded, _ = load_game(server.engine, folder)
    assert len(loaded) == n and loaded.results[-1].meters == s.game.results[-1].meters


def test_games_played_together_equal_each_alone(server):
    players = ["Bunny", "Fox", "Owl"]
    together = [server.sessions.new() for _ in players]
    server.stop()  # queue every first turn before the worker runs: one batch of three
    jobs = [server.submit(s, *server.parse_turn(s, fields(0, who))) for s, who in zip(together, players)]
    server.start()
    for j in jobs:
        while not j.finished:
            time.sleep(0.01)
    assert [j.events[-1]["state"]["turns"][0]["timings_s"]["batch"] for j in jobs] == [3, 3, 3]
    for i in range(1, 3):  # then interleaved: each player's next turn as soon as its last is done
        for s, who in zip(together, players):
            play(server, s, fields(i, who))
    for s, who in zip(together, players):
        alone = server.sessions.new()
        for i in range(3):
            done = play(server, alone, fields(i, who))
            assert done["state"]["turns"][i]["timings_s"]["batch"] == 1
        a = turn_files(os.path.join(server.out_dir, alone.game.game_id))
        b = turn_files(os.path.join(server.out_dir, s.game.game_id))
        assert len(a) == 9 and a == b, who
    # the three games differ from each other (the comparison above can fail)
    clips = [turn_files(os.path.join(server.out_dir, s.game.game_id))["turn_002.mp4"] for s in together]
    assert len(set(clips)) == 3


def test_undo_takes_the_last_turn_off_the_save(server):
    s = server.sessions.new()
    for i in range(3):
        play(server, s, fields(i))
    folder = os.path.join(server.out_dir, s.game.game_id)
    state = server.sessions.undo(s)
    assert len(state["turns"]) == 2
    assert not any(n.startswith("turn_002") for n in os.listdir(folder))
    loaded, rec = load_game(server.engine, folder)
    assert len(loaded) == 2 and len(rec["files"]) == 6
    play(server, s, fields(7))  # the replacement third turn
    alone = server.sessions.new()
    for i in (0, 1, 7):
        play(server, alone, fields(i))
    assert turn_files(folder) == turn_files(os.path.join(server.out_dir, alone.game.game_id))
    server.sessions.finish_game(s, s.game.game_id)
    assert layout.read_json(os.path.join(folder, layout.GAME_JSON))["save"]["derived"]["turns"] == 3


def test_server_restart_loses_no_game(server, tmp_path):
    """Start the app, play 2 turns, stop; start again on the same output folder and port: the page
    has the game, the 3rd turn continues it, the turn files equal the game in one go; the token and
    the session cookie still decide who may play."""
    import json
    import urllib.request
    from http.cookiejar import CookieJar

    from animegamer_jax.web.app import create_app
    from animegamer_jax.web.server import GameServer
    from animegamer_jax.web.sessions import SESSIONS_FILE
    from tests.web_helpers import HttpThread, call

    out, token = str(tmp_path / "games"), "t" * 20
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    def serve(port=0):
        srv = GameServer(server.engine, out)
        srv.start()
        return srv, HttpThread(create_app(srv, token=token), port=port).start()

    srv, http = serve()
    port = http.port
    try:
        assert call(opener, f"{http.url}/?token={token}")[0] == 200
        for i in range(2):
            status, stream = call(opener, f"{http.url}/api/turn", fields(i))
            assert status == 200 and json.loads(stream.splitlines()[-1])["event"] == "done"
        game_id = json.loads(call(opener, f"{http.url}/api/state")[1])["game_id"]
    finally:
        http.stop()
        srv.stop()
    saved = json.loads(open(os.path.join(out, SESSIONS_FILE)).read())["sessions"]
    assert [v["current"] for v in saved.values()] == [game_id]
    assert not any(c.value in json.dumps(saved) for c in jar)  # the file holds no cookie

    srv, http = serve(port)
    try:
        assert call(urllib.request.build_opener(), f"{http.url}/api/state")[0] == 403  # no token, no cookie
        status, state = call(opener, f"{http.url}/api/state")
        state = json.loads(state)
        assert status == 200 and state["game_id"] == game_id and len(state["turns"]) == 2, state
        status, stream = call(opener, f"{http.url}/api/turn", fields(2))
        done = json.loads(stream.splitlines()[-1])
        assert done["event"] == "done" and len(done["state"]["turns"]) == 3 and done["state"]["game_id"] == game_id
    finally:
        http.stop()
        srv.stop()
    one_go = Game("one-go", tuple(instruction_from_fields(**fields(i)) for i in range(3)), server.seed)
    engine = server.engine
    ref, _ = saves.save_game(engine.config, engine.model, engine.play([one_go])[0], str(tmp_path / "ref"))
    assert turn_files(ref) == turn_files(os.path.join(out, game_id))


def test_branch_and_continue_saved_games(server):
    from animegamer_jax.web.sessions import BadInput

    s = server.sessions.new()
    for i in range(3):
        play(server, s, fields(i))
    src = s.game.game_id
    src_folder = os.path.join(server.out_dir, src)
    before = turn_files(src_folder)
    with pytest.raises(BadInput, match="1..3"):
        server.sessions.branch(s, 4)
    state = server.sessions.branch(s, 2)  # from turn 2
    new = state["game_id"]
    assert new != src and len(state["turns"]) == 2
    assert [(g["game_id"], g["turns"], g["current"]) for g in state["saved_games"]] == sorted(
        [(src, 3, False), (new, 2, True)], reverse=True)
    play(server, s, fields(9))  # the branch's own third turn
    assert turn_files(src_folder) == before  # the source is only read
    alone = server.sessions.new()
    for i in (0, 1, 9):
        play(server, alone, fields(i))
    assert turn_files(os.path.join(server.out_dir, new)) == turn_files(os.path.join(server.out_dir,
                                                                                    alone.game.game_id))
    state = server.sessions.continue_game(s, src)  # back to the first game, read from its save
    assert state["game_id"] == src and len(state["turns"]) == 3
    play(server, s, fields(3))
    assert len(turn_files(src_folder)) == 12
    with pytest.raises(BadInput, match="no such saved game"):
        server.sessions.continue_game(s, alone.game.game_id)  # another player's game


def test_a_damaged_or_removed_save_is_a_4xx_json_line(server):
    """Branching from a game whose turn file was damaged on disk, and undo after the game's folder was
    removed outside the server: each one JSON line with the fix (400), not a 500; the session goes on."""
    import shutil

    from animegamer_jax.web.app import create_app
    from tests.web_helpers import Client, HttpThread

    http = HttpThread(create_app(server)).start()
    try:
        c = Client(http.url)
        for i in range(2):
            events = c.events(c.open_turn(fields(i)))
            assert events[-1]["event"] == "done", events[-1]
        game_id = events[-1]["state"]["game_id"]
        folder = os.path.join(server.out_dir, game_id)
        with open(os.path.join(folder, "turn_001.state.npz"), "wb") as fh:
            fh.write(b"damaged")
        status, body = c.json("/api/branch", {"turns": 2})
        assert status == 400 and list(body) == ["error"] and "\n" not in body["error"]
        assert body["error"] == (f"cannot continue {folder}: turn 2's file turn_001.state.npz is missing or damaged. "
                                 f"Fix: branch from the intact turns: play --continue {folder} --from_turn 1 "
                                 f"--out ELSEWHERE")
        status, body = c.json("/api/branch", {"turns": 1})  # the intact first turn still branches
        assert status == 200 and len(body["turns"]) == 1
        branch = os.path.join(server.out_dir, body["game_id"])
        shutil.rmtree(branch)  # removed outside the server
        status, body = c.json("/api/undo", {})
        assert status == 400 and body == {"error": f"game {os.path.basename(branch)}'s folder is no longer in "
                                                   f"{server.out_dir} (removed outside the server), so its turns "
                                                   f"cannot be undone there. Fix: restart for a new game"}
        status, body = c.json("/api/restart", {})
        assert status == 200 and body["turns"] == []
        events = c.events(c.open_turn(fields(5)))
        assert events[-1]["event"] == "done"  # the session plays on
    finally:
        http.stop()
