"""The HTTP layer of the game server: a small Starlette app over :class:`GameServer`.

Routes (every asset is served from this package; the page needs no internet):

==============================  ===============================================================
``GET /``                       the page (static/index.html); sets the session cookie
``GET /static/...``             static/app.js, static/app.css, and ``gallery.css`` (game/)
``GET /api/state``              the session's game as JSON (:meth:`GameServer.state`)
``POST /api/turn``              JSON ``{character, motion, background}`` or ``{line}``; 400 with
                                ``{"error", "fields"}`` on bad input (the script parser's
                                message), 409 while a turn of this game is pending, else 200
                                with an NDJSON stream of the turn's events (``queued``,
                                ``started``, ``frames``, then ``done`` with the new state or
                                ``error``)
``POST /api/undo``              drops the last turn (409 while busy, 400 with nothing to undo)
``POST /api/restart``           a new game, optional JSON ``{"seed": int}``
``GET /games/<id>/<file>``      a file of one of the session's games (MP4s with range requests)
``GET /games/<id>.zip``         the game folder as a zip
==============================  ===============================================================

:class:`HttpThread` serves the app on a background thread (tests, notebooks); the command
(``python -m animegamer_jax.web``, web/__main__.py) serves it with uvicorn in the foreground.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import threading
import time
import zipfile

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from animegamer_jax.game import writers
from animegamer_jax.web.server import BadInput, Busy, GameServer, Session

STATIC = os.path.join(os.path.dirname(__file__), "static")
COOKIE = "agj_session"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: seconds between keep-alive lines of a turn stream while nothing happens
KEEPALIVE_S = 10.0


def create_app(server: GameServer) -> Starlette:
    """The Starlette app serving ``server`` (its worker must be started by the caller)."""

    def session_of(request: Request) -> tuple[Session, bool]:
        sid = request.cookies.get(COOKIE)
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

    async def gallery_css(request: Request) -> Response:
        return Response(writers.GALLERY_CSS, media_type="text/css")

    async def state(request: Request) -> Response:
        s, new = session_of(request)
        return reply(request, JSONResponse(server.state(s)), s, new)

    async def turn(request: Request) -> Response:
        s, new = session_of(request)
        try:
            body = json.loads(await request.body() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return reply(request, error(400, f"the request body is not JSON ({e}). Fix: send "
                                             f"{{\"character\": ..., \"motion\": ..., \"background\": ...}}",
                                        fields=[]), s, new)
        try:
            t, ids = server.parse_turn(s, body)
            job = server.submit(s, t, ids)
        except BadInput as e:
            return reply(request, error(400, str(e), fields=list(e.fields)), s, new)
        except Busy as e:
            return reply(request, error(409, str(e)), s, new)
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
        s, new = session_of(request)
        try:
            return reply(request, JSONResponse(await asyncio.to_thread(server.undo, s)), s, new)
        except Busy as e:
            return reply(request, error(409, str(e)), s, new)
        except IndexError as e:
            return reply(request, error(400, str(e)), s, new)

    async def restart(request: Request) -> Response:
        s, new = session_of(request)
        seed = None
        raw = await request.body()
        if raw.strip():
            try:
                body = json.loads(raw)
                seed = body.get("seed") if isinstance(body, dict) else None
                if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
                    raise ValueError
            except ValueError:
                return reply(request, error(400, "restart takes {\"seed\": <integer>} or nothing"), s, new)
        try:
            return reply(request, JSONResponse(server.restart(s, seed)), s, new)
        except Busy as e:
            return reply(request, error(409, str(e)), s, new)

    async def game_file(request: Request) -> Response:
        s, _ = session_of(request)
        game_id, name = request.path_params["game_id"], request.path_params["name"]
        folder = server.game_dir(s, game_id)
        if folder is None or not _SAFE_NAME.match(name):
            return error(404, "no such game file in this session")
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return error(404, "no such game file in this session")
        return FileResponse(path, headers={"Cache-Control": "no-cache"})

    async def game_zip(request: Request) -> Response:
        s, _ = session_of(request)
        game_id = request.path_params["game_id"]
        folder = server.game_dir(s, game_id)
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
        Route("/static/gallery.css", gallery_css),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        Route("/api/state", state),
        Route("/api/turn", turn, methods=["POST"]),
        Route("/api/undo", undo, methods=["POST"]),
        Route("/api/restart", restart, methods=["POST"]),
        Route("/games/{game_id}.zip", game_zip),
        Route("/games/{game_id}/{name}", game_file),
    ]
    return Starlette(routes=routes)


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
