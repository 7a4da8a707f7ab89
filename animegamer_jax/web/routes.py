"""The game server's HTTP routes: module-level handlers taking ``(site, request)``, registered in
:data:`ROUTES` (the table is docs/commands.md's "The page's API"), and what they share: the session
cookie, request bodies read within a size and a deadline, one-line JSON refusals."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import re
import zipfile
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from animegamer_jax.game.folder import gallery, layout
from animegamer_jax.web.queue import QueueFull
from animegamer_jax.web.server import GameServer
from animegamer_jax.web.sessions import MAX_CHARACTER_BYTES, BadInput, Busy, ServerFull, Session, session_id_ok

STATIC = os.path.join(os.path.dirname(__file__), "static")
#: the session cookie's name, before the port (:func:`cookie_name`)
COOKIE = "agj_session"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: seconds between keep-alive lines of a turn stream while nothing happens
KEEPALIVE_S = 10.0
#: default largest request body in bytes (a turn's JSON is a few hundred bytes)
MAX_BODY = 16 * 1024
#: the largest ``POST /api/character`` body: an image of ``MAX_CHARACTER_BYTES`` as base64, and its name
CHARACTER_MAX_BODY = 4 * (MAX_CHARACTER_BYTES // 3 + 1) + 4096
#: default seconds a request body may take to arrive (408 and the connection closed after that)
BODY_TIMEOUT_S = 10.0


class Refused(Exception):
    """A request refused before it reaches the game (status, one-line message, headers to add)."""

    def __init__(self, status: int, message: str, headers: dict | None = None, clear_cookie: bool = False):
        super().__init__(message)
        self.status, self.headers, self.clear_cookie = status, headers or {}, clear_cookie


def cookie_name(base: str, port: int | None) -> str:
    """The name of cookie ``base`` (:data:`COOKIE`, app.py's ``TOKEN_COOKIE``) of the server on ``port``:
    ``agj_session_7860`` (``base`` when the port is unknown). Browsers send a host's cookies to every
    port of it, so servers on two ports of one host would otherwise replace each other's session and
    token cookies (a player's game lost to "session unknown" in the other tab)."""
    return base if port is None else f"{base}_{int(port)}"


def cookie_of(scope, base: str) -> str:
    """:func:`cookie_name` of ``base`` for the server port of ASGI ``scope``."""
    server = scope.get("server")
    return cookie_name(base, None if server is None else server[1])


async def read_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S,
                    fix: str = "send a turn of a few hundred bytes") -> bytes:
    """The request body, refused with 413 once it is over ``limit`` bytes (by Content-Length,
    before anything is read, or while a chunked body streams in; ``fix`` ends the message) and with
    408 when all of it has not arrived within ``timeout_s`` seconds (a sender trickling bytes); both
    close the connection."""
    close = {"Connection": "close"}  # the rest of the body is not read
    too_big = f"the request body is over {limit} bytes. Fix: {fix}"
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise Refused(400, "the Content-Length header is not a number", close)
    if declared is not None and int(declared) > limit:
        raise Refused(413, too_big, close)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise Refused(413, too_big, close)
                chunks.append(chunk)
    except TimeoutError:
        raise Refused(408, f"the request body did not arrive within {timeout_s:g} s ({size} bytes came). Fix: "
                           f"send the whole request at once", close) from None
    return b"".join(chunks)


def parse_json(raw: bytes, empty=None):
    """``raw`` parsed as JSON (``empty`` for a blank body).

    Raises:
      Refused: 400 for invalid UTF-8, bad JSON or nesting too deep to parse.
    """
    if not raw.strip():
        return empty
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e).splitlines()[0]
        raise Refused(400, f"the request body is not JSON ({why}). Fix: send "
                           f"{{\"character\": ..., \"motion\": ..., \"background\": ...}} as UTF-8 JSON") from None


@dataclasses.dataclass(frozen=True)
class Site:
    """What the handlers serve: the game server, the body limits, the page's static files (name -> path)."""

    server: GameServer
    max_body: int = MAX_BODY
    body_timeout_s: float = BODY_TIMEOUT_S
    static_files: dict = dataclasses.field(default_factory=lambda: {
        n: os.path.join(STATIC, n) for n in sorted(os.listdir(STATIC))
        if n != "index.html" and os.path.isfile(os.path.join(STATIC, n))})


def cookie_sid(request: Request) -> str | None:
    """The request's session cookie, None without one.

    Raises:
      Refused: 400 (the reply clears the cookie) when it is not of the form this server issues.
    """
    sid = request.cookies.get(cookie_of(request.scope, COOKIE))
    if sid is not None and not session_id_ok(sid):
        raise Refused(400, "the session cookie was not issued by this server. Fix: reload the page "
                           "(this reply cleared the cookie)", clear_cookie=True)
    return sid


def session_of(site: Site, request: Request) -> Session:
    """The request's live session; 403 without one (only the page load makes sessions)."""
    sid = cookie_sid(request)
    if sid is None:
        raise Refused(403, "this request has no session. Fix: load the page (/) first: it starts a session")
    s = site.server.sessions.find(sid)
    if s is None:
        raise Refused(403, "this session is unknown to the server (it expired or the server restarted before "
                           "it saved a game). Fix: reload the page to start a new session")
    return s


async def body_of(site: Site, request: Request, limit: int | None = None, **fix):
    """The request's JSON body (``{}`` when blank), read within ``limit`` (default ``max_body``) bytes."""
    return parse_json(await read_body(request, site.max_body if limit is None else limit, site.body_timeout_s,
                                      **fix), empty={})


def error(status: int, message: str, **extra) -> JSONResponse:
    """The one-line refusal ``{"error": message, **extra}``."""
    return JSONResponse({"error": message, **extra}, status_code=status)


async def answer(fn, *args, in_thread: bool = True, bad: tuple[type[Exception], ...] = (BadInput,)) -> Response:
    """``fn(*args)``'s value as JSON (run on a worker thread unless ``in_thread`` is False); 400 with
    the message of a ``bad`` error, 409 with a :class:`Busy` one."""
    try:
        return JSONResponse(await asyncio.to_thread(fn, *args) if in_thread else fn(*args))
    except Busy as e:
        return error(409, str(e))
    except bad as e:
        return error(400, str(e))


async def index(site: Site, request: Request) -> Response:
    """The page; the only handler that makes a session (and sets its cookie)."""
    sid = cookie_sid(request)
    s = site.server.sessions.find(sid) if sid else None
    page = FileResponse(os.path.join(STATIC, "index.html"), media_type="text/html",
                        headers={"Cache-Control": "no-store"})
    if s is None:
        try:
            s = site.server.sessions.new()
        except ServerFull as e:
            return error(503, str(e))
        page.set_cookie(cookie_of(request.scope, COOKIE), s.id, httponly=True, samesite="strict", path="/")
    return page


async def static(site: Site, request: Request) -> Response:
    name = request.path_params["name"]
    if name == "gallery.css":
        return Response(gallery.GALLERY_CSS, media_type="text/css")
    if name not in site.static_files:
        return error(404, f"no such static file; the page's files are {['gallery.css', *site.static_files]}")
    return FileResponse(site.static_files[name])


async def state(site: Site, request: Request) -> Response:
    return JSONResponse(site.server.sessions.state(session_of(site, request)))


async def turn(site: Site, request: Request) -> Response:
    """Queues a turn; its events (``queued``, ``started``, ``frames``, then ``done`` or ``error``) as
    an NDJSON stream, a ``ping`` line every :data:`KEEPALIVE_S` while nothing happens."""
    s = session_of(site, request)
    body = await body_of(site, request)
    try:
        t, ids = site.server.parse_turn(s, body)
        job = site.server.submit(s, t, ids)
    except BadInput as e:
        return error(400, str(e), fields=list(e.fields))
    except Busy as e:
        return error(409, str(e))
    except ServerFull as e:
        return error(503, str(e))
    except QueueFull as e:
        return JSONResponse({"error": str(e)}, status_code=503, headers={"Retry-After": str(e.retry_after_s)})
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    job.notify = lambda: loop.call_soon_threadsafe(wake.set)

    async def events():
        sent = 0
        while True:
            wake.clear()
            new_events = job.events[sent:]
            sent += len(new_events)
            for ev in new_events:
                yield json.dumps(ev) + "\n"
            if job.finished and sent == len(job.events):
                return
            if not new_events:
                try:
                    await asyncio.wait_for(wake.wait(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield json.dumps({"event": "ping"}) + "\n"

    return StreamingResponse(events(), media_type="application/x-ndjson",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def undo(site: Site, request: Request) -> Response:
    s = session_of(site, request)
    await body_of(site, request)
    return await answer(site.server.sessions.undo, s, bad=(IndexError, BadInput))


async def restart(site: Site, request: Request) -> Response:
    s = session_of(site, request)
    body = await body_of(site, request)
    if not isinstance(body, dict) or set(body) - {"seed"}:
        return error(400, "restart takes {\"seed\": <integer>} or nothing")
    return await answer(site.server.sessions.restart, s, body.get("seed"), in_thread=False)


async def switch(site: Site, request: Request) -> Response:
    s = session_of(site, request)
    body = await body_of(site, request)
    if not isinstance(body, dict) or set(body) != {"game_id"}:
        return error(400, "continue takes {\"game_id\": \"<one of the session's saved games>\"}")
    return await answer(site.server.sessions.continue_game, s, body["game_id"])


async def character(site: Site, request: Request) -> Response:
    s = session_of(site, request)
    body = await body_of(site, request, max(site.max_body, CHARACTER_MAX_BODY),
                         fix=f"upload an image of at most {MAX_CHARACTER_BYTES >> 20} MB")
    if not isinstance(body, dict) or set(body) != {"name", "image_b64"}:
        return error(400, "character takes {\"name\": \"<character name>\", \"image_b64\": \"<the image, base64>\"}")
    return await answer(site.server.sessions.add_character, s, body["name"], body["image_b64"])


async def branch(site: Site, request: Request) -> Response:
    s = session_of(site, request)
    body = await body_of(site, request)
    if not isinstance(body, dict) or set(body) - {"turns"}:
        return error(400, "branch takes {\"turns\": <turns to keep>} or nothing")
    return await answer(site.server.sessions.branch, s, body.get("turns"))


def own_game(site: Site, request: Request) -> tuple[Session | None, str | None]:
    """The request's session and the folder of the URL's game when that session played it (no session
    is made)."""
    s = site.server.sessions.find(cookie_sid(request))
    return s, None if s is None else site.server.sessions.game_dir(s, request.path_params["game_id"])


async def game_file(site: Site, request: Request) -> Response:
    """A file of one of the session's games (``game.mp4`` and the contact sheet made on demand)."""
    name = request.path_params["name"]
    s, folder = own_game(site, request)
    if folder is None or not _SAFE_NAME.match(name):
        return error(404, "no such game file in this session")
    if name in layout.DERIVED_FILES[:2]:  # game.mp4, the contact sheet: made on demand
        folder = await asyncio.to_thread(site.server.sessions.finish_game, s, request.path_params["game_id"])
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return error(404, "no such game file in this session")
    return FileResponse(path, headers={"Cache-Control": "no-cache"})


async def game_zip(site: Site, request: Request) -> Response:
    """The game folder as a zip, every file of it (the marker and ``characters/`` too: it continues
    anywhere), the game video and contact sheet made first."""
    game_id = request.path_params["game_id"]
    s, folder = own_game(site, request)
    if folder is None:
        return error(404, "no such game in this session")
    await asyncio.to_thread(site.server.sessions.finish_game, s, game_id)

    def pack() -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            for name in layout.folder_files(folder):
                z.write(os.path.join(folder, *name.split("/")), f"{game_id}/{name}")
        return buf.getvalue()

    data = await asyncio.to_thread(pack)
    return Response(data, media_type="application/zip",
                    headers={"Content-Disposition": f'attachment; filename="{game_id}.zip"'})


Handler = Callable[[Site, Request], Awaitable[Response]]
#: (path, handler, methods): every route of the app (methods None: GET and HEAD)
ROUTES: tuple[tuple[str, Handler, tuple[str, ...] | None], ...] = (
    ("/", index, None),
    ("/static/{name}", static, None),
    ("/api/state", state, None),
    ("/api/turn", turn, ("POST",)),
    ("/api/undo", undo, ("POST",)),
    ("/api/restart", restart, ("POST",)),
    ("/api/continue", switch, ("POST",)),
    ("/api/branch", branch, ("POST",)),
    ("/api/character", character, ("POST",)),
    ("/games/{game_id}.zip", game_zip, None),
    ("/games/{game_id}/{name}", game_file, None),
)


def routes(site: Site) -> list[Route]:
    """:data:`ROUTES` as Starlette routes, each handler given ``site``."""
    def bound(handler: Handler):
        async def endpoint(request: Request) -> Response:
            return await handler(site, request)
        endpoint.__name__ = handler.__name__
        return endpoint

    return [Route(path, bound(handler), methods=None if methods is None else list(methods))
            for path, handler, methods in ROUTES]


async def refused(request: Request, exc: Refused) -> Response:
    """The exception handler of :class:`Refused`: its one-line JSON (the session cookie cleared when it says so)."""
    response = JSONResponse({"error": str(exc)}, status_code=exc.status, headers=exc.headers)
    if exc.clear_cookie:
        response.delete_cookie(cookie_of(request.scope, COOKIE), path="/")
    return response


async def http_error(request: Request, exc: HTTPException) -> Response:
    """The exception handler of Starlette's 404 / 405: one JSON line with the fix (``Allow`` kept)."""
    where = f"{request.method} {request.url.path[:200]}"
    if exc.status_code == 404:
        message = (f"no route {where}. Fix: the page is at /, the API under /api/ (state, turn, undo, restart, "
                   f"continue, branch, character)")
    elif exc.status_code == 405:
        allowed = sorted((exc.headers or {}).get("Allow", "").replace(" ", "").split(","))
        message = f"method not allowed: {where}. Fix: use {', '.join(allowed)}"
    else:
        message = f"{where}: {exc.detail}"
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)
