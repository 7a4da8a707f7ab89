"""The web server (``python -m animegamer_jax.commands.web``) under load and under hostile input.

* Load: the real command in its own process (default host, the random stand-in system: the fastest
  turn, about 0.3 s on 2 cores; the tiny checkpoint's is about 0.8 s after a 10 s compile) and 16
  players x 3 turns through the HTTP API (benchmarks/web_load.py's driver and checks): all done,
  FIFO, positions, isolation, the server's peak RSS. The full 16 x 3 runs in CI (about 15-30 s),
  so there is no shorter variant; the figures in docs/results.md come from benchmarks/web_load.py.
* Hostile input: one table of requests, each with the status it must get, against a server in this
  process; the server keeps serving and nothing is written outside its games folder.
* The bounded queue: past ``max_queue`` waiting turns, 503 with ``Retry-After``.
* HTML in instructions is escaped on the page (headless Chromium, as tests/test_web.py) and in
  the game's gallery.
"""

import gc
import http.client as http_client
import json
import os
import socket
import threading
import time
import weakref

import pytest

from animegamer_jax.config import load_config
from animegamer_jax.game.folder import layout
from animegamer_jax.commands import web as web_main
from starlette.requests import Request

from animegamer_jax.web.app import Guard, create_app, host_names, no_auth_warning
from animegamer_jax.web.routes import COOKIE, STATIC, cookie_name
from animegamer_jax.web.server import build_server
from animegamer_jax.web.sessions import SESSIONS_FILE
from benchmarks.web_load import Player, ServerProcess, check_load, play_load, summarize
from tests.web_helpers import HttpThread, call, post, raw, read_to_close

PLAYERS, TURNS = 16, 3


def tree(root):
    """``{relative path: (size, mtime_ns)}`` of every file and folder under ``root``."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size if n in files else 0, st.st_mtime_ns)
    return out


@pytest.mark.slow
def test_sixteen_players_three_turns_each(tmp_path):
    out = tmp_path / "games"
    server = ServerProcess(["--standin"], str(out)).start()
    try:
        idle_kib = server.rss_kib()
        results = play_load(server.url, PLAYERS, TURNS)
        failures = check_load(results, TURNS, str(out), batch=server.batch)
        fig = summarize(results)
        peak_kib = server.peak_rss_kib()
        still = Player(server.url)
        assert still.join() == 200 and still.json("GET", "/api/state")[0] == 200  # still serving
    finally:
        rc = server.stop()
    print(f"\n{fig}; server RSS idle {idle_kib / 1024:.0f} MiB, peak {peak_kib / 1024:.0f} MiB")
    assert failures == []
    assert server.batch == 4  # the default --max_batch on one device
    assert fig["turns_done"] == PLAYERS * TURNS and fig["refused_503"] == 0  # the default queue holds 16
    assert len(fig["latency_by_turn_s"]) == TURNS and min(fig["latency_by_turn_s"]) > 0, fig
    # the players really waited behind each other: the queue was at least half of them deep
    assert fig["max_position"] >= PLAYERS // 2, fig
    # bounded: 48 turns held in 16 games cost the stand-in server well under 200 MiB over its idle size
    assert 0 < idle_kib <= peak_kib < idle_kib + 200 * 1024, (idle_kib, peak_kib)
    out_text = "".join(server.lines)
    assert f"serving on http://127.0.0.1:{server.port}/" in out_text and "no authentication" not in out_text
    # the command prints every saved turn (the server's on_turn hook, game/run.py print_turn)
    assert out_text.count("\n  states ML=") == PLAYERS * TURNS, out_text[-2000:]
    assert rc == 0, out_text[-2000:]
    # only the 16 games, finished, and the sessions' record under the games folder; nothing beside it
    assert os.listdir(tmp_path) == ["games"]
    games = sorted(os.listdir(out))
    assert games.pop(0) == SESSIONS_FILE
    assert len(games) == PLAYERS and all(g.startswith("web-") for g in games), games
    assert all(layout.is_finished(out / g) for g in games)
    assert sorted(r["state"]["game_id"] for r in results) == games


@pytest.mark.parametrize("host,warns", [("127.0.0.1", False), ("localhost", False), ("::1", False),
                                        ("0.0.0.0", True), ("192.168.1.5", True), ("example.org", True)])
def test_no_auth_warning_for_other_hosts(host, warns):
    w = no_auth_warning(host)
    assert (w is not None) == warns
    if warns:
        assert w.startswith(f"warning: serving on {host}") and "no authentication" in w and "\n" not in w


@pytest.mark.slow
def test_cli_warns_before_serving_on_another_host(capsys):
    # an output folder that cannot be made stops the command just before it would listen
    bad = ["--standin", "--out", "/proc/no-games-here", "--nowarmup"]
    assert web_main.main([*bad, "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("warning: serving on 0.0.0.0, which other machines can reach, with no authentication")
    assert "/proc/no-games-here" in err.splitlines()[-1]
    assert web_main.main(bad) == 2
    assert "warning" not in capsys.readouterr().err  # the default host: loopback


# -- hostile input ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    """A stand-in server in this process: games in <root>/games, a file of someone else's in <root>/outside."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "outside").mkdir()
    (root / "outside" / "secret.txt").write_text("not the server's")
    server = build_server(load_config("configs/tiny.py"), standin=True, out=str(root / "games"))
    server.start()
    http = HttpThread(create_app(server)).start()
    yield server, http, root
    http.stop()
    server.stop()


def get(path, extra=b"", host=b"127.0.0.1"):
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n" + extra + b"\r\n"


EVIL = b"Origin: http://evil.example\r\n"
CROSS = b"Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\nSec-Fetch-Dest: image\r\n"


BUNNY = {"character": "Bunny", "motion": "hop", "background": "day"}
# within game.max_instruction_tokens (48 on the tiny config); agjXss is set if the page runs any of it
HTML = {"character": "<b>Bo</b>", "motion": "<img src=x onerror=agjXss=1>", "background": "<script>agjXss=2</script>"}


def turn_with(**field) -> bytes:
    return json.dumps({**BUNNY, **field}).encode()


def chunked(body: bytes, extra=b"") -> bytes:
    return (b"POST /api/turn HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
            + b"Content-Type: application/json\r\n" + extra + b"\r\n"
            + b"".join(b"%x\r\n" % len(body[i:i + 4096]) + body[i:i + 4096] + b"\r\n"
                       for i in range(0, len(body), 4096))
            + b"0\r\n\r\n")


def hostile_cases(own, other, guessed):
    """(name, request bytes, status, a piece of the one-line reason).

    ``own`` / ``other``: cookie headers of a session that played a game and of another session;
    ``guessed``: a well-formed session id the server never issued. Game ids and the server's port
    are filled in by the test.
    """
    big = json.dumps({**BUNNY, "motion": "x" * (1 << 20)}).encode()
    text = turn_with()
    return [
        # other sites: a page elsewhere that makes the player's browser send requests (CSRF)
        ("cross-site text/plain turn, foreign Origin, no cookie (no CORS preflight)",
         post("/api/turn", text, EVIL, ctype=b"text/plain"), 403, "cross-site request refused (Origin 'http://evil"),
        ("cross-site text/plain turn, foreign Origin, the player's cookie",
         post("/api/turn", text, EVIL + own, ctype=b"text/plain"), 403, "cross-site request refused"),
        ("cross-site form turn", post("/api/turn", b"character=Bunny", EVIL + own,
                                      ctype=b"application/x-www-form-urlencoded"), 403, "cross-site request refused"),
        ("cross-site JSON undo", post("/api/undo", b"{}", EVIL + own), 403, "cross-site request refused"),
        ("cross-site JSON restart", post("/api/restart", b"{}", EVIL + own), 403, "cross-site request refused"),
        ("Origin null (sandboxed frame, file://)", post("/api/turn", text, b"Origin: null\r\n" + own), 403,
         "cross-site request refused (Origin 'null')"),
        ("another port's page", post("/api/turn", text, b"Origin: http://127.0.0.1:1\r\n" + own), 403,
         "cross-site request refused"),
        ("Sec-Fetch-Site cross-site turn, no Origin", post("/api/turn", text, b"Sec-Fetch-Site: cross-site\r\n" + own),
         403, "cross-site request refused (Sec-Fetch-Site cross-site)"),
        ("Sec-Fetch-Site same-site (another port) state", get("/api/state", b"Sec-Fetch-Site: same-site\r\n" + own),
         403, "Sec-Fetch-Site same-site"),
        ("cross-site <img> of the page (would make a session)", get("/", CROSS), 403, "cross-site request refused"),
        ("cross-site <img> of the state", get("/api/state", CROSS + own), 403, "cross-site request refused"),
        ("cross-site <video> of a game's clip", get("/games/{own_game}/turn_000.mp4", CROSS + own), 403,
         "cross-site request refused"),
        ("cross-site link to a game's zip", get("/games/{own_game}.zip", b"Sec-Fetch-Site: cross-site\r\n"
                                                b"Sec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\n" + own),
         403, "cross-site request refused"),
        ("cross-site <iframe> of the page", get("/", b"Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\n"
                                                b"Sec-Fetch-Dest: iframe\r\n"), 403, "cross-site request refused"),
        ("foreign Origin on a GET", get("/api/state", EVIL + own), 403, "cross-site request refused"),
        # content types that need no preflight, from the server's own origin too
        ("text/plain turn", post("/api/turn", text, own, ctype=b"text/plain"), 415, "Content-Type: application/json"),
        ("form turn", post("/api/turn", b"a=b", own, ctype=b"application/x-www-form-urlencoded"), 415, "not 'applica"),
        ("multipart restart", post("/api/restart", b"", own, ctype=b"multipart/form-data; boundary=x"), 415,
         "not 'multipart/form-data'"),
        ("turn without a Content-Type", post("/api/turn", text, own, ctype=b""), 415, "not ''"),
        # Host names: DNS rebinding (a site renames itself to 127.0.0.1; its page then is "same-origin")
        ("DNS rebinding: foreign Host, the player's cookie", get("/api/state", own, host=b"rebind.example:{port}"),
         403, "the Host 'rebind.example:"),
        ("foreign Host turn", post("/api/turn", text, own, host=b"rebind.example:{port}"), 403, "not a name of this"),
        ("foreign Host page", get("/", host=b"rebind.example"), 403, "not a name of this server"),
        ("foreign Host, a game's file", get("/games/{own_game}/game.json", own, host=b"evil.example:{port}"), 403,
         "not a name of this server"),
        ("loopback name, another port", get("/api/state", own, host=b"127.0.0.1:1"), 403, "not a name of this server"),
        ("an IP address that is not this server's", get("/api/state", own, host=b"10.1.2.3:{port}"), 403,
         "not a name of this server"),
        ("Host that is not name[:port]", get("/api/state", own, host=b"127.0.0.1:x"), 403, "not a name of this"),
        ("no Host (HTTP/1.0)", b"GET /api/state HTTP/1.0\r\n" + own + b"\r\n", 400, "no Host header"),
        # sessions come from the page load only
        ("no session: state", get("/api/state"), 403, "has no session. Fix: load the page (/)"),
        ("no session: turn", post("/api/turn", text), 403, "has no session"),
        ("no session: undo", post("/api/undo", b"{}"), 403, "has no session"),
        ("guessed session id: state", get("/api/state", guessed), 403, "unknown to the server"),
        # sizes
        ("body over the limit (1 MiB, Content-Length)", post("/api/turn", big, own), 413, "over 16384 bytes"),
        ("body over the limit (chunked)", chunked(big[:40000], own), 413, "over 16384 bytes"),
        ("instruction over max_instruction_tokens", post("/api/turn", turn_with(motion="run " * 400), own), 400,
         "max_instruction_tokens"),
        ("one 15 KB word", post("/api/turn", turn_with(motion="y" * 15000), own), 400, "max_instruction_tokens"),
        # encodings and JSON
        ("invalid UTF-8", post("/api/turn", b'{"character": "\xff\xfe", "motion": "a", "background": "b"}', own), 400,
         "not JSON"),
        ("JSON nested 5000 deep", post("/api/turn", b"[" * 5000 + b"]" * 5000, own), 400, "nested too deeply"),
        ("not a JSON object", post("/api/turn", b"[1, 2]", own), 400, "must be a JSON object"),
        ("restart seed past 64 bits", post("/api/restart", b'{"seed": 100000000000000000000000}', own), 400,
         "signed 64-bit"),
        ("restart with another key", post("/api/restart", b'{"seed": 1, "path": "/etc"}', own), 400, "restart takes"),
        # control characters and other text that is not one printable line
        ("ESC (terminal escape) in character", post("/api/turn", turn_with(character="Bun\x1b[2Jny"), own), 400,
         "control character U+001B"),
        ("NUL in motion", post("/api/turn", turn_with(motion="hop\x00"), own), 400, "control character U+0000"),
        ("newline in line", post("/api/turn", json.dumps({"line": "Character: A; Motion: b;\nBackground: c."}).encode(),
                                 own), 400, "control character U+000A"),
        ("DEL in background", post("/api/turn", turn_with(background="day\x7f"), own), 400, "U+007F"),
        ("lone surrogate", post("/api/turn", b'{"character": "Bun\\ud800ny", "motion": "a", "background": "b"}', own),
         400, "lone surrogate U+D800"),
        ("right-to-left override", post("/api/turn", turn_with(character="Bun\u202eny"), own), 400,
         "bidirectional formatting character U+202E"),
        # HTML and script where ids are expected
        ("HTML in a game id (file)", get("/games/%3Cscript%3Ealert(1)%3C%2Fscript%3E/turn_000.mp4", own), 404,
         "no route"),
        ("HTML in a game id (zip)", get("/games/%3Cscript%3Ealert(1)%3C%2Fscript%3E.zip", own), 404,
         "no such game file"),
        ("HTML in a game id, no slash", get("/games/%3Cimg%20src=x%20onerror=alert(1)%3E/game.json", own), 404,
         "no such game file"),
        # sessions
        ("tampered session cookie", get("/api/state", b'Cookie: ' + COOKIE.encode() + b'_{port}="x<script>"\r\n'), 400,
         "not issued by this server"),
        ("session cookie with a path",
         post("/api/turn", turn_with(), b"Cookie: " + COOKIE.encode() + b"_{port}=../../etc\r\n"), 400,
         "not issued by this server"),
        ("guessed session id: play", post("/api/turn", turn_with(), guessed), 403, "unknown to the server"),
        ("guessed session id: undo", post("/api/undo", b"", guessed), 403, "unknown to the server"),
        ("guessed session id: restart", post("/api/restart", b"", guessed), 403, "unknown to the server"),
        ("guessed session id: a game's file", get("/games/{own_game}/game.json", guessed), 404, "no such game file"),
        ("guessed session id: a game's zip", get("/games/{own_game}.zip", guessed), 404, "no such game"),
        ("no session: a game's file", get("/games/{own_game}/turn_000.mp4"), 404, "no such game file"),
        ("another session's game file", get("/games/{own_game}/turn_000.mp4", other), 404, "no such game file"),
        ("another session's zip", get("/games/{own_game}.zip", other), 404, "no such game"),
        # path traversal in every URL that serves a file
        ("static ../", get("/static/../server.py"), 404, "no route"),
        ("static %2e%2e/", get("/static/%2e%2e/server.py"), 404, "no route"),
        ("static ..%2f", get("/static/..%2fapp.py"), 404, "no route"),
        ("static ..%5c", get("/static/..%5capp.py"), 404, "no such static file"),
        ("static absolute", get("/static//etc/passwd"), 404, "no route"),
        ("static, a file beside the page's", get("/static/__init__.py"), 404, "no such static file"),
        ("static, a folder", get("/static/."), 404, "no such static file"),
        ("game file ..", get("/games/{own_game}/..", own), 404, "no such game file"),
        ("game file ../..", get("/games/{own_game}/../../outside/secret.txt", own), 404, "no route"),
        ("game file %2e%2e%2f", get("/games/{own_game}/%2e%2e%2f%2e%2e%2foutside%2fsecret.txt", own), 404, "no route"),
        ("game file ..%5c", get("/games/{own_game}/..%5c..%5coutside%5csecret.txt", own), 404, "no such game file"),
        ("game file NUL", get("/games/{own_game}/game.json%00.png", own), 404, "no such game file"),
        ("game file hidden", get("/games/{own_game}/.game.json", own), 404, "no such game file"),
        ("game id ..", get("/games/../outside/secret.txt", own), 404, "no route"),
        ("game id %2e%2e", get("/games/%2e%2e/outside/secret.txt", own), 404, "no route"),
        ("game id .. (file)", get("/games/%2e%2e/secret.txt", own), 404, "no such game file"),
        ("zip ..", get("/games/%2e%2e.zip", own), 404, "no such game"),
        ("zip ../outside", get("/games/..%2foutside.zip", own), 404, "no such game file"),
        # unknown routes and methods
        ("unknown route", get("/admin"), 404, "no route GET /admin"),
        ("unknown API route", get("/api/games"), 404, "no route GET /api/games"),
        ("DELETE a turn", b"DELETE /api/turn HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 405,
         "use POST"),
        ("PUT the page", b"PUT / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 405,
         "use GET, HEAD"),
        ("GET a POST route", get("/api/turn"), 405, "use POST"),
        ("invented method", b"BREW /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 405,
         "use GET, HEAD"),
        ("not HTTP (uvicorn's own plain-text reply)", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
         400, "Invalid HTTP request received."),
    ]


@pytest.mark.slow
def test_hostile_input_gets_a_4xx_with_one_line_each(hosted, capsys):
    server, http, root = hosted
    own, other = Player(http.url), Player(http.url)
    assert own.join() == 200 and other.join() == 200
    r = own.turn(HTML)  # HTML and script in an instruction: accepted as text, escaped where shown
    assert r["status"] == 200 and r["events"][-1]["event"] == "done", r
    game_id = r["events"][-1]["state"]["game_id"]
    assert own.json("GET", "/api/state")[1]["turns"][0]["character"] == "<b>Bo</b>"
    played = server.turns_played
    before = {"root": tree(root), "static": tree(STATIC)}
    cookie = lambda sid: f"Cookie: {cookie_name(COOKIE, http.port)}={sid}\r\n".encode()  # noqa: E731
    guessed = "A" * 24
    assert server.sessions.find(guessed) is None
    got, wrong = [], []
    sessions = set(server.sessions.live)
    for name, req, status, reason in hostile_cases(cookie(own.cookie), cookie(other.cookie), cookie(guessed)):
        code, body = raw(http, req.replace(b"{own_game}", game_id.encode()).replace(b"{port}", str(http.port).encode()))
        try:
            line = json.loads(body)["error"]
        except (ValueError, KeyError):  # uvicorn answers requests that are not HTTP itself, in plain text
            line = body.decode("utf-8", "replace").strip()
        got.append((name, code, line))
        if not (code == status and reason in line and "\n" not in line):
            wrong.append(f"{name}: want {status} {reason!r}, got {code} {line!r}")
        assert own.json("GET", "/api/state")[0] == 200, f"the server stopped serving after {name!r}"
    print("\n" + "\n".join(f"{code}  {name}: {line}" for name, code, line in got))
    assert wrong == []
    assert len(got) >= 80
    # nothing played, nothing written, no session made: the games folder holds the one game, everything
    # else as it was
    assert server.turns_played == played and server.alive and set(server.sessions.live) == sessions
    after = {"root": tree(root), "static": tree(STATIC)}
    assert after == before
    assert sorted(os.listdir(root)) == ["games", "outside"]
    assert sorted(os.listdir(root / "games")) == [SESSIONS_FILE, game_id]
    # a tampered cookie is cleared by the reply
    name = cookie_name(COOKIE, http.port)
    status, hdrs, resp = Player(http.url).request("GET", "/api/state", headers={"Cookie": f"{name}=x.y"})
    assert status == 400 and f'{name}=""' in hdrs["set-cookie"] and "Max-Age=0" in hdrs["set-cookie"]
    resp.read()
    # the gallery escapes the instruction; every reply tells browsers not to sniff types
    status, page = own.get(f"/games/{game_id}/index.html")
    assert status == 200 and b"&lt;img src=x onerror=agjXss=1&gt;" in page and b"<img src=x" not in page
    assert b"<script>agjXss" not in page and b"&lt;b&gt;Bo&lt;/b&gt;" in page
    assert own.request("GET", "/api/state")[1]["x-content-type-options"] == "nosniff"


@pytest.mark.slow
def test_full_queue_answers_busy_try_again(hosted, monkeypatch):
    server, http, _ = hosted
    release = threading.Event()
    step = server.engine.step

    def held_step(*a, **k):
        release.wait(60)
        return step(*a, **k)

    submit, jobs = server.submit, []

    def watched_submit(*a, **k):
        job = submit(*a, **k)
        jobs.append(weakref.ref(job))
        return job

    monkeypatch.setattr(server.engine, "step", held_step)
    monkeypatch.setattr(server, "submit", watched_submit)
    monkeypatch.setattr(server.queue, "max_queue", 2)
    players = [Player(http.url) for _ in range(4)]
    assert all(p.join() == 200 for p in players)
    streams = []
    for k, p in enumerate(players[:3]):  # one running (held), then two waiting: the queue is full
        status, _, resp = p.request("POST", "/api/turn", json.dumps(BUNNY).encode())
        assert status == 200
        streams.append(resp)
        until = "started" if k == 0 else "queued"
        while json.loads(resp.readline())["event"] != until:
            pass
    late = players[3].turn(BUNNY)
    assert late["status"] == 503 and int(late["retry_after"]) >= 1, late
    assert late["error"].startswith("the server is busy: the turn queue is full (2 turns waiting)")
    assert f"try again in {late['retry_after']} s" in late["error"] and "\n" not in late["error"]
    # the refused player has no turn queued: it may try again once there is room
    release.set()
    for resp in streams:
        events = [json.loads(x) for x in resp if x.strip()]
        assert events[-1]["event"] == "done"
    again = players[3].turn(BUNNY)
    assert again["status"] == 200 and again["events"][-1]["event"] == "done"
    # memory: a finished turn's event log (its streamed frames) is not kept once its stream ends
    for _ in range(100):
        gc.collect()
        if len(jobs) == 4 and all(j() is None for j in jobs):
            break
        time.sleep(0.05)
    assert len(jobs) == 4 and [j() for j in jobs] == [None] * 4


@pytest.mark.slow
def test_html_in_instructions_is_escaped_on_the_page(hosted, browser):  # noqa: F811 - the imported fixture
    server, http, _ = hosted
    p = Player(http.url)
    assert p.join() == 200
    r = p.turn(HTML)
    assert r["events"][-1]["event"] == "done"
    d = browser
    d.get(http.url + "/static/app.css")  # the cookie's origin, before the page loads
    d.add_cookie({"name": cookie_name(COOKIE, http.port), "value": p.cookie, "path": "/"})
    d.get(http.url + "/")
    for _ in range(600):
        if d.execute_script("return document.querySelectorAll('#history figure').length") == 1:
            break
        time.sleep(0.05)
    shown = d.execute_script("const f = document.querySelector('#history figcaption'); "
                             "return [f.textContent, document.querySelector('#caption').textContent, "
                             "document.querySelectorAll('#history img, #history script').length, "
                             "[...document.querySelectorAll('#history b')].map(b => b.textContent).join('|'), "
                             "window.agjXss === undefined]")
    text, caption, elements, bold, clean = shown
    want = "Character: <b>Bo</b>; Motion: <img src=x onerror=agjXss=1>; Background: <script>agjXss=2</script>."
    # shown as text: no element made from it (the only <b> is the page's own "Turn 1"), nothing ran
    assert want in text and want in caption and elements == 0 and bold == "Turn 1" and clean, shown


# -- who may use the server: Host names, other sites, the token ------------------------------------

def guard_check(bind, headers, method="GET", path="/", token=None, query=b""):
    """What :class:`Guard` says to a request (no HTTP): None to serve it, else (status, message)."""
    scope = {"type": "http", "method": method, "path": path, "query_string": query, "server": ("127.0.0.1", 7860),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    return Guard(None, *host_names(bind), token).check(Request(scope))


@pytest.mark.parametrize("bind,host,ok", [
    ("127.0.0.1", "127.0.0.1:7860", True), ("127.0.0.1", "localhost:7860", True), ("127.0.0.1", "[::1]:7860", True),
    ("127.0.0.1", "LOCALHOST", True), ("127.0.0.1", "127.0.0.1:7861", False), ("127.0.0.1", "rebind.example", False),
    ("127.0.0.1", "192.168.1.5:7860", False), ("127.0.0.1", "localhost.:7860", False), ("::1", "[::1]:7860", True),
    ("127.0.0.2", "127.0.0.2:7860", True),
    ("192.168.1.5", "192.168.1.5:7860", True), ("192.168.1.5", "10.0.0.1:7860", False),
    ("game.example", "game.example:7860", True), ("game.example", "rebind.example:7860", False),
    ("0.0.0.0", "10.1.2.3:7860", True), ("0.0.0.0", "[fe80::1]:7860", True), ("0.0.0.0", "rebind.example:7860", False),
    ("0.0.0.0", socket.gethostname() + ":7860", True), ("0.0.0.0", "10.1.2.3:80", False), ("::", "10.1.2.3", True),
])
def test_host_names_served(bind, host, ok):
    got = guard_check(bind, {"Host": host})
    assert (got is None) == ok, got
    if not ok:
        assert got[0] == 403 and f"the Host {host!r} is not a name of this server" in got[1]


def test_links_to_the_page_from_other_sites_still_open_it():
    nav = {"Host": "127.0.0.1:7860", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate",
           "Sec-Fetch-Dest": "document"}
    assert guard_check("127.0.0.1", nav) is None  # a link to http://127.0.0.1:7860/
    assert guard_check("127.0.0.1", nav, path="/api/state")[0] == 403  # a link to anything else
    assert guard_check("127.0.0.1", nav, method="POST")[0] == 403  # a cross-site form posted to /
    own = {"Host": "127.0.0.1:7860", "Origin": "http://127.0.0.1:7860", "Sec-Fetch-Site": "same-origin",
           "Content-Type": "application/json; charset=utf-8"}
    assert guard_check("127.0.0.1", own, method="POST", path="/api/turn") is None  # the page's own fetch
    assert guard_check("127.0.0.1", {**own, "Sec-Fetch-Site": "none"}, path="/") is None  # a typed URL


def test_token_is_required_when_set(hosted):
    server, _, _ = hosted
    token = "t0k3n-" + "x" * 20
    assert guard_check("0.0.0.0", {"Host": "10.1.2.3:7860"}, token=token)[0] == 403
    with pytest.raises(ValueError, match="--token must be 16 to 256 characters"):
        create_app(server, token="short")
    http = HttpThread(create_app(server, token=token)).start()
    try:
        p = Player(http.url)
        for path, reason in (("/", "needs its token. Fix: open the URL with ?token="),
                             ("/?token=" + "y" * 26, "the one given is wrong"), ("/api/state", "needs its token"),
                             ("/static/app.js", "needs its token")):
            status, hdrs, resp = p.request("GET", path)
            line = json.loads(resp.read())["error"]
            assert status == 403 and reason in line and "\n" not in line and "set-cookie" not in hdrs, (path, line)
        assert p.turn(BUNNY)["status"] == 403 and p.cookie is None
        # the page's URL carries it once; then a cookie does (the session cookie comes with it)
        status, _, resp = p.request("GET", "/?token=" + token)
        resp.read()
        cookies = resp.headers.get_all("Set-Cookie")
        assert status == 200 and len(cookies) == 2, cookies
        assert cookies[1].startswith(f"agj_token_{http.port}={token}; HttpOnly"), cookies
        assert "SameSite=strict" in cookies[1] and cookies[0].startswith(f"agj_session_{http.port}=")
        p.cookie = cookies[0].split(";")[0].split("=", 1)[1]
        carried = {"Cookie": f"agj_session_{http.port}={p.cookie}; agj_token_{http.port}={token}"}
        status, _, resp = p.request("GET", "/api/state", headers=carried)
        assert status == 200 and json.loads(resp.read())["turns"] == []
        status, _, resp = p.request("POST", "/api/turn", json.dumps(BUNNY).encode(), headers=carried)
        assert status == 200 and json.loads(resp.read().splitlines()[-1])["event"] == "done"
        assert p.json("GET", "/api/state")[0] == 403  # the session cookie without the token
    finally:
        http.stop()


def test_cli_refuses_a_weak_token(capsys):
    assert web_main.main(["--standin", "--nowarmup", "--token", "hunter2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--token must be 16 to 256 characters" in err[-1] and "warning" not in "".join(err)
    w = no_auth_warning("0.0.0.0", token=True)
    assert w.startswith("warning: serving on 0.0.0.0") and "plain HTTP" in w and "no authentication" not in w


def test_servers_on_two_ports_of_one_host_keep_their_own_cookies(hosted, tmp_path):
    """Browsers send a host's cookies to every port of it: one cookie jar (urllib's follows the same rule)
    plays on one server, opens a second server's page (with its token), and still has its game and token
    on the first."""
    import urllib.request
    from http.cookiejar import CookieJar

    from animegamer_jax.web.server import GameServer

    server, _, _ = hosted
    token_a, token_b = "a" * 20, "b" * 20
    a = HttpThread(create_app(server, token=token_a)).start()
    b = HttpThread(create_app(GameServer(server.engine, str(tmp_path / "b")), token=token_b)).start()
    jar = CookieJar()
    browser_ = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    try:
        assert call(browser_, f"{a.url}/?token={token_a}")[0] == 200
        status, stream = call(browser_, f"{a.url}/api/turn", BUNNY)
        assert status == 200 and json.loads(stream.splitlines()[-1])["event"] == "done"
        assert call(browser_, f"{b.url}/?token={token_b}")[0] == 200  # the second server's page, in the same browser
        status, state = call(browser_, f"{a.url}/api/state")  # no ?token=: the first server's cookies
        assert status == 200 and len(json.loads(state)["turns"]) == 1, state
        status, state = call(browser_, f"{b.url}/api/state")
        assert status == 200 and json.loads(state)["turns"] == [], state
        assert sorted(c.name for c in jar) == sorted(cookie_name(n, p) for n in (COOKIE, "agj_token")
                                                     for p in (a.port, b.port))
    finally:
        a.stop()
        b.stop()


# -- sessions: made by the page load only, players' games never dropped for room ---------------------

@pytest.mark.slow
def test_cookieless_requests_evict_no_player(hosted, monkeypatch):
    server, http, _ = hosted
    player = Player(http.url)
    assert player.join() == 200 and player.turn(BUNNY)["events"][-1]["event"] == "done"
    monkeypatch.setattr(server.sessions, "max_empty_sessions", 8)
    playing = {s.id for s in server.sessions.live.values() if s.holds_turns}
    # 70 requests of every kind without a cookie (a cross-site page's <img>s, or anyone on loopback)
    for k in range(70):
        assert raw(http, get("/api/state"))[0] == 403
        assert raw(http, post("/api/turn", turn_with()))[0] == 403
        assert raw(http, get("/"))[0] == 200  # a page load: a new session, with no turns
    assert player.cookie in server.sessions.live and playing <= set(server.sessions.live)
    assert len(server.sessions.live) == len(playing) + 8
    r = player.turn(BUNNY)  # the player's next turn
    assert r["status"] == 200 and len(r["events"][-1]["state"]["turns"]) == 2
    # 2000 more over one kept-alive connection: the sessions kept stay bounded
    conn = http_client.HTTPConnection(http.host, http.port, timeout=60)
    for k in range(2000):
        conn.request("GET", "/" if k % 2 else "/api/state")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == (200 if k % 2 else 403)
    conn.close()
    assert len(server.sessions.live) == len(playing) + 8 and player.cookie in server.sessions.live
    assert player.json("GET", "/api/state")[1]["turns"][1]["character"] == "Bunny"


def test_full_server_refuses_new_players_not_old_games(hosted, monkeypatch):
    server, http, _ = hosted
    waiting, player = Player(http.url), Player(http.url)
    assert waiting.join() == 200 and player.join() == 200
    assert player.turn(BUNNY)["status"] == 200
    monkeypatch.setattr(server.sessions, "max_sessions", sum(s.holds_turns for s in server.sessions.live.values()))
    status, j = Player(http.url).json("GET", "/")
    assert status == 503 and j["error"].startswith(f"the server holds the games of {server.sessions.max_sessions} players")
    assert "Fix: try again later" in j["error"] and "\n" not in j["error"]
    late = waiting.turn(BUNNY)  # a page loaded before the server filled up: its first turn
    assert late["status"] == 503 and "holds the games of" in late["error"]
    assert player.turn(BUNNY)["status"] == 200  # a game in play goes on
    assert waiting.json("GET", "/api/state")[0] == 200  # still a session, may play once there is room


def test_idle_sessions_expire_but_not_mid_turn(hosted):
    server, http, _ = hosted
    gone, busy = Player(http.url), Player(http.url)
    assert gone.join() == 200 and busy.join() == 200 and gone.turn(BUNNY)["status"] == 200
    with server.cv:
        for p in (gone, busy):
            server.sessions.live[p.cookie].last_seen -= server.sessions.idle_s + 1
        server.sessions.live[busy.cookie].job = "a turn in progress"
        server.sessions.expire()
        assert gone.cookie not in server.sessions.live and busy.cookie in server.sessions.live
        server.sessions.live[busy.cookie].job = None
    # a session whose game is saved is known again (its game read back from disk), one that played
    # nothing is gone
    status, j = gone.json("GET", "/api/state")
    assert status == 200 and len(j["turns"]) == 1 and gone.cookie in server.sessions.live, j
    empty = Player(http.url)
    assert empty.join() == 200
    with server.cv:
        server.sessions.live[empty.cookie].last_seen -= server.sessions.idle_s + 1
        server.sessions.expire()
    status, j = empty.json("POST", "/api/undo", {})
    assert status == 403 and "unknown to the server" in j["error"]
    assert empty.join() == 200 and empty.json("GET", "/api/state")[1]["turns"] == []  # a new session


# -- slow and idle connections ------------------------------------------------------------------------

@pytest.fixture
def quick(hosted):
    """The hosted game server behind a second HTTP server whose deadlines are 1 s."""
    server, _, _ = hosted
    http = HttpThread(create_app(server, body_timeout_s=1.0), idle_timeout_s=1, limit_concurrency=4).start()
    yield server, http
    http.stop()


def closed_by_server(s: socket.socket, trickle: bytes = b"") -> bytes:
    """Sends ``trickle`` one byte at a time (forever, from a thread) and reads until the server closes
    the connection; returns what it answered. A 60 s socket timeout fails the test instead."""
    stop = threading.Event()

    def drip():
        while trickle and not stop.is_set():
            try:
                s.send(trickle[:1])
            except OSError:
                return
            stop.wait(0.05)

    threading.Thread(target=drip, daemon=True).start()
    try:
        return read_to_close(s)
    finally:
        stop.set()


@pytest.mark.slow
def test_slow_and_idle_connections_are_closed(quick):
    server, http = quick
    player = Player(http.url)
    assert player.join() == 200
    head = (b"POST /api/turn HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Cookie: " + f"{player.cookie_name}={player.cookie}".encode() + b"\r\nContent-Length: 16000\r\n\r\n{")
    # a body trickling in: 408 and closed, while another player is served meanwhile
    with socket.create_connection((http.host, http.port), timeout=60) as s:
        s.sendall(head)
        assert Player(http.url).join() == 200
        assert player.json("GET", "/api/state")[0] == 200
        reply = closed_by_server(s, b"x" * 16000)
    status, _, body = reply.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408") and b"connection: close" in status.lower(), reply[:300]
    assert json.loads(body)["error"].startswith("the request body did not arrive within 1 s")
    # a connection that sends nothing, one that trickles its request head, one idle after a response
    with socket.create_connection((http.host, http.port), timeout=60) as s:
        assert closed_by_server(s) == b""
    with socket.create_connection((http.host, http.port), timeout=60) as s:
        s.sendall(b"GET /api/state HTTP/1.1\r\n")
        assert closed_by_server(s, b"X-Slow: a\r\n" * 10000) == b""
    with socket.create_connection((http.host, http.port), timeout=60) as s:
        s.sendall(b"GET /static/app.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = closed_by_server(s)
        assert reply.startswith(b"HTTP/1.1 200") and reply.count(b"HTTP/1.1") == 1
    # a turn that waits longer than the deadlines is not cut: its stream is a request being served
    r = player.turn(BUNNY)
    assert r["status"] == 200 and r["events"][-1]["event"] == "done"


def test_connections_past_the_limit_get_503(quick):
    server, http = quick
    held = [socket.create_connection((http.host, http.port), timeout=60) for _ in range(4)]
    try:
        connections = http._server.server_state.connections
        for _ in range(600):  # until the server has taken all four (it accepts asynchronously)
            if len(connections) >= 4:
                break
            time.sleep(0.05)
        assert len(connections) == 4
        status, body = raw(http, get("/static/app.css"))
        assert status == 503 and body == b"Service Unavailable"
    finally:
        for s in held:
            s.close()
    for _ in range(600):
        if not connections:
            break
        time.sleep(0.05)
    assert raw(http, get("/static/app.css"))[0] == 200
