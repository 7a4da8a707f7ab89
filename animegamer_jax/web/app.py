"""The HTTP layer of the game server: a small Starlette app over :class:`GameServer`.

Routes (every asset is served from this package; the page needs no internet):

==============================  ===============================================================
``GET /``                       the page (static/index.html); sets the session cookie
``GET /static/<name>``          static/app.js, static/app.css, and ``gallery.css`` (game/)
``GET /api/state``              the session's game as JSON (:meth:`GameServer.state`)
``POST /api/turn``              JSON ``{character, motion, background}`` or ``{line}``; 400 with
                                ``{"error", "fields"}`` on bad input (the script parser's
                                message), 409 while a turn of this game is pending, 503 with
                                ``Retry-After`` while the queue is full, else 200 with an NDJSON
                                stream of the turn's events (``queued``, ``started``,
                                ``frames``, then ``done`` with the new state or ``error``)
``POST /api/undo``              drops the last turn (409 while busy, 400 with nothing to undo)
``POST /api/restart``           a new game, optional JSON ``{"seed": int}``
``GET /games/<id>/<file>``      a file of one of the session's games (MP4s with range requests)
``GET /games/<id>.zip``         the game folder as a zip
==============================  ===============================================================

Every refusal is a 4xx (or the 503 above) with a JSON body ``{"error": "<one line>"}``:

* 400: a body that is not JSON (invalid UTF-8, nested too deep), bad instruction text
  (:func:`~animegamer_jax.game.script.check_text`), a session cookie this server did not issue
  (the reply clears it);
* 403: a POST with a well-formed session cookie the server does not know (it expired or the server
  restarted: reload the page); GET requests with such a cookie get a new session;
* 404: unknown routes, static names outside the page's files, game files or zips of games the
  session did not play, file names that are not plain names (path traversal);
* 405: a method the route does not take (``Allow`` says which);
* 413: a request body over ``max_body`` bytes (checked before it is read).

Files are only ever read from the static folder and ``<out>/<game_id>/`` of the session's own games;
the only writes are the game folders under ``out`` (:class:`GameServer`).

:class:`HttpThread` serves the app on a background thread (tests, notebooks); the command
(``python -m animegamer_jax.web``, web/__main__.py) serves it with uvicorn in the foreground.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import os
import re
import threading
import time
import zipfile

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from animegamer_jax.game import writers
from animegamer_jax.web.server import BadInput, Busy, GameServer, QueueFull, Session, session_id_ok

STATIC = os.path.join(os.path.dirname(__file__), "static")
COOKIE = "agj_session"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: seconds between keep-alive lines of a turn stream while nothing happens
KEEPALIVE_S = 10.0
#: default largest request body in bytes (a turn's JSON is a few hundred bytes)
MAX_BODY = 16 * 1024
#: what every response carries: browsers must not guess another content type than the one sent
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


class Refused(Exception):
    """A request refused before it reaches the game (status, one-line message, headers to add)."""

    def __init__(self, status: int, message: str, headers: dict | None = None, clear_cookie: bool = False):
        super().__init__(message)
        self.status, self.headers, self.clear_cookie = status, headers or {}, clear_cookie


def no_auth_warning(host: str) -> str | None:
    """The warning to print when serving on ``host``; None for a loopback address.

    ``localhost`` and any address in 127.0.0.0/8 or ``::1`` are loopback; every other host
    (``0.0.0.0``, a LAN address, a name) is reachable from other machines.
    """
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (f"warning: serving on {host}, which other machines can reach, with no authentication: anyone who "
            f"reaches this port can play turns and fill the disk with games. Fix: serve on 127.0.0.1 (the "
            f"default) and tunnel to it (ssh -L), or use --host only on a network you trust")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 once it is over ``limit`` bytes (by Content-Length,
    before anything is read, or while a chunked body streams in)."""
    too_big = f"the request body is over {limit} bytes. Fix: send a turn of a few hundred bytes"
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise Refused(400, "the Content-Length header is not a number")
    if declared is not None and int(declared) > limit:
        raise Refused(413, too_big)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, too_big)
        chunks.append(chunk)
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


def create_app(server: GameServer, max_body: int = MAX_BODY) -> Starlette:
    """The Starlette app serving ``server`` (its worker must be started by the caller).

    ``max_body``: the largest request body in bytes (larger ones get 413 unread).
    """
    static_files = {n: os.path.join(STATIC, n) for n in sorted(os.listdir(STATIC))
                    if n != "index.html" and os.path.isfile(os.path.join(STATIC, n))}

    def cookie_sid(request: Request) -> str | None:
        sid = request.cookies.get(COOKIE)
        if sid is not None and not session_id_ok(sid):
            raise Refused(400, "the session cookie was not issued by this server. Fix: reload the page "
                               "(this reply cleared the cookie)", clear_cookie=True)
        return sid

    def session_of(request: Request, known: bool = False) -> tuple[Session, bool]:
        """The request's session and whether it is new; ``known``: an unknown cookie is refused (403)."""
        sid = cookie_sid(request)
        if known and sid is not None and server.find_session(sid) is None:
            raise Refused(403, "this session is unknown to the server (it expired or the server restarted; its "
                               "games stay saved on disk). Fix: reload the page to start a new session")
        s = server.session(sid)
        return s, s.id != sid

    def reply(request: Request, response: Response, s: Session, new: bool) -> Response:
        if new:
            response.set_cookie(COOKIE, s.id, httponly=True, samesite="strict", path="/")
        return response

    def error(status: int, message: str, **extra) -> JSONResponse:
        return JSONResponse({"error": message, **extra}, status_code=status)

    async def index(request: Request) -> Response:
        s, new = session_of(request)
        return reply(request, FileResponse(os.path.join(STATIC, "index.html"), media_type="text/html"), s, new)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "gallery.css":
            return Response(writers.GALLERY_CSS, media_type="text/css")
        if name not in static_files:
            return error(404, f"no such static file; the page's files are {['gallery.css', *static_files]}")
        return FileResponse(static_files[name])

    async def state(request: Request) -> Response:
        s, new = session_of(request)
        return reply(request, JSONResponse(server.state(s)), s, new)

    async def turn(request: Request) -> Response:
        s, new = session_of(request, known=True)
        body = parse_json(await read_body(request, max_body), empty={})
        try:
            t, ids = server.parse_turn(s, body)
            job = server.submit(s, t, ids)
        except BadInput as e:
            return reply(request, error(400, str(e), fields=list(e.fields)), s, new)
        except Busy as e:
            return reply(request, error(409, str(e)), s, new)
        except QueueFull as e:
            return reply(request, JSONResponse({"error": str(e)}, status_code=503,
                                               headers={"Retry-After": str(e.retry_after_s)}), s, new)
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

        resp = StreamingResponse(events(), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        return reply(request, resp, s, new)

    async def undo(request: Request) -> Response:
        s, new = session_of(request, known=True)
        await read_body(request, max_body)
        try:
            return reply(request, JSONResponse(await asyncio.to_thread(server.undo, s)), s, new)
        except Busy as e:
            return reply(request, error(409, str(e)), s, new)
        except IndexError as e:
            return reply(request, error(400, str(e)), s, new)

    async def restart(request: Request) -> Response:
        s, new = session_of(request, known=True)
        body = parse_json(await read_body(request, max_body), empty={})
        if not isinstance(body, dict) or set(body) - {"seed"}:
            return reply(request, error(400, "restart takes {\"seed\": <integer>} or nothing"), s, new)
        try:
            return reply(request, JSONResponse(server.restart(s, body.get("seed"))), s, new)
        except BadInput as e:
            return reply(request, error(400, str(e)), s, new)
        except Busy as e:
            return reply(request, error(409, str(e)), s, new)

    def own_game(request: Request) -> str | None:
        """The folder of the URL's game when the request's session played it (no session is made)."""
        s = server.find_session(cookie_sid(request))
        return None if s is None else server.game_dir(s, request.path_params["game_id"])

    async def game_file(request: Request) -> Response:
        name = request.path_params["name"]
        folder = own_game(request)
        if folder is None or not _SAFE_NAME.match(name):
            return error(404, "no such game file in this session")
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return error(404, "no such game file in this session")
        return FileResponse(path, headers={"Cache-Control": "no-cache"})

    async def game_zip(request: Request) -> Response:
        game_id = request.path_params["game_id"]
        folder = own_game(request)
        if folder is None:
            return error(404, "no such game in this session")

        def pack() -> bytes:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
                for name in sorted(os.listdir(folder)):
                    if not name.startswith("."):
                        z.write(os.path.join(folder, name), f"{game_id}/{name}")
            return buf.getvalue()

        data = await asyncio.to_thread(pack)
        return Response(data, media_type="application/zip",
                        headers={"Content-Disposition": f'attachment; filename="{game_id}.zip"'})

    routes = [
        Route("/", index),
        Route("/static/{name}", static),
        Route("/api/state", state),
        Route("/api/turn", turn, methods=["POST"]),
        Route("/api/undo", undo, methods=["POST"]),
        Route("/api/restart", restart, methods=["POST"]),
        Route("/games/{game_id}.zip", game_zip),
        Route("/games/{game_id}/{name}", game_file),
    ]

    async def refused(request: Request, exc: Refused) -> Response:
        response = JSONResponse({"error": str(exc)}, status_code=exc.status, headers=exc.headers)
        if exc.clear_cookie:
            response.delete_cookie(COOKIE, path="/")
        return response

    async def http_error(request: Request, exc: HTTPException) -> Response:
        where = f"{request.method} {request.url.path[:200]}"
        if exc.status_code == 404:
            message = f"no route {where}. Fix: the page is at /, the API under /api/ (state, turn, undo, restart)"
        elif exc.status_code == 405:
            allowed = sorted((exc.headers or {}).get("Allow", "").replace(" ", "").split(","))
            message = f"method not allowed: {where}. Fix: use {', '.join(allowed)}"
        else:
            message = f"{where}: {exc.detail}"
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    return Starlette(routes=routes, exception_handlers={Refused: refused, HTTPException: http_error},
                     middleware=[Middleware(SecurityHeaders)])


class SecurityHeaders:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to every HTTP response (unless already set)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                have = {k.lower() for k, _ in headers}
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()
                            if k.lower().encode() not in have]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class HttpThread:
    """Serves an ASGI app (:func:`create_app`'s) with uvicorn on a background thread (tests, notebooks).

    ``start()`` returns once the socket listens; ``url`` is ``http://host:port``; ``stop()`` shuts
    uvicorn down and joins the thread. ``port=0`` picks a free port (``port`` holds it after ``start()``).
    """

    def __init__(self, asgi_app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn  # optional

        self._server = uvicorn.Server(uvicorn.Config(asgi_app, host=host, port=port, log_level="warning",
                                                     access_log=False, lifespan="off"))
        self._server.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=self._server.run, name="http", daemon=True)
        self.host = host
        self.port = port

    def start(self, timeout: float = 30.0) -> "HttpThread":
        """Starts the thread and waits (up to ``timeout`` seconds) until the socket listens.

        Raises:
          RuntimeError: the server did not start in time (or its thread died).
        """
        self._thread.start()
        t0 = time.time()
        while not self._server.started:
            if not self._thread.is_alive() or time.time() - t0 > timeout:
                raise RuntimeError(f"the HTTP server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
