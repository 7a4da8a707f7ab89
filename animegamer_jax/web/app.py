"""The HTTP layer of the game server: a small Starlette app over :class:`GameServer`.

Routes (every asset is served from this package; the page needs no internet):

==============================  ===============================================================
``GET /``                       the page (static/index.html); the only route that makes a session
                                (sets the session cookie); 503 when ``max_sessions`` players
                                hold games
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
``POST /api/continue``          ``{"game_id"}``: one of the session's saved games (``state``'s
                                ``saved_games``) becomes its current game again, read from disk
``POST /api/character``         ``{"name", "image_b64"}``: a new game whose turns naming ``name`` are
                                decoded with the image (base64, at most 8 MB decoded; checked as
                                play's ``--character``) as reference; it keeps the current game's
                                seed and other characters (400 with one line on a bad image or a
                                system without a reference adapter)
``POST /api/branch``            optional ``{"turns": k}``: a new game (its own folder) holding the
                                current game's first k turns (default all); the source stays
``GET /games/<id>/<file>``      a file of one of the session's games (MP4s with range requests;
                                ``game.mp4`` and ``contact_sheet.png`` made on demand)
``GET /games/<id>.zip``         the game folder as a zip (game video and contact sheet made first):
                                every file of it, the marker and ``characters/`` too, so the
                                game unzipped anywhere continues with ``play --continue``
==============================  ===============================================================

Every refusal is a 4xx (or a 503) with a JSON body ``{"error": "<one line>"}``. Before any route
(:class:`Guard`, in this order):

* 400 / 403: no ``Host`` header / a ``Host`` that is not a name of this server (:func:`host_names`;
  a DNS-rebinding page sends its own name) or names another port;
* 403: a cross-site request: an ``Origin`` other than the server's own (``http://<Host>``), or
  ``Sec-Fetch-Site: cross-site`` / ``same-site`` (another port of the same host is same-site),
  except a top-level navigation to ``GET /`` (a link to the page);
* 403: with ``token`` set, a request without it (``?token=`` in the URL, or the cookie that a
  request with it set);
* 415: an ``/api/`` POST whose ``Content-Type`` is not ``application/json`` (a cross-site form or
  ``text/plain`` fetch needs no CORS preflight; JSON does, and this server answers none).

Then, in the routes:

* 400: a body that is not JSON (invalid UTF-8, nested too deep), bad instruction text
  (:func:`~animegamer_jax.inference.instructions.check_text`), a session cookie this server did not issue
  (the reply clears it);
* 403: an API or game request without a session cookie, or with a well-formed one the server does
  not know (it expired or the server restarted): load the page (``GET /``) to get a session;
* 404: unknown routes, static names outside the page's files, game files or zips of games the
  session did not play, file names that are not plain names (path traversal);
* 405: a method the route does not take (``Allow`` says which);
* 408: a request body that has not arrived within ``body_timeout_s`` (the connection is closed);
* 413: a request body over ``max_body`` bytes (checked before it is read; ``/api/character`` takes
  up to :data:`CHARACTER_MAX_BODY`);
* 503: the first turn of a session while ``max_sessions`` players hold games
  (:class:`~animegamer_jax.web.server.ServerFull`), or ``max_queue`` turns wait (``Retry-After``).

Connections (:func:`uvicorn_settings`): a request head must arrive within ``idle_timeout_s`` of
the connection opening or of its last response (:func:`timed_h11_protocol`; uvicorn's own
keep-alive timeout is reset by every byte, so it does not bound a slow sender); at most
``limit_concurrency`` connections at once (uvicorn answers the next with a plain-text 503).

Files are only ever read from the static folder and ``<out>/<game_id>/`` of the session's own games;
the only writes are the game folders under ``out`` (:class:`GameServer`).

The command (``python -m animegamer_jax.commands.web``, commands/web.py) serves it with uvicorn in the
foreground (the tests serve it on a thread, tests/web_helpers.py ``HttpThread``).
"""

from __future__ import annotations

import asyncio
import functools
import io
import ipaddress
import json
import os
import re
import secrets
import socket
import zipfile

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from animegamer_jax.game import writers
from animegamer_jax.web.server import (MAX_CHARACTER_BYTES, BadInput, Busy, GameServer, QueueFull, ServerFull, Session,
                                       session_id_ok)

STATIC = os.path.join(os.path.dirname(__file__), "static")
#: the session cookie's name, before the port (:func:`cookie_name`)
COOKIE = "agj_session"
#: the name, before the port, of the cookie that carries ``--token`` once a URL with ``?token=`` has been opened
TOKEN_COOKIE = "agj_token"
#: what a ``--token`` may hold: URL- and cookie-safe characters, long enough not to be guessed
TOKEN = re.compile(r"^[A-Za-z0-9._~-]{16,256}$")
#: Host names served whatever ``--host`` is (the server's port, or none, may follow)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
#: ``--host`` values that bind every interface
WILDCARDS = ("0.0.0.0", "::")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: seconds between keep-alive lines of a turn stream while nothing happens
KEEPALIVE_S = 10.0
#: default largest request body in bytes (a turn's JSON is a few hundred bytes)
MAX_BODY = 16 * 1024
#: the largest ``POST /api/character`` body: an image of ``MAX_CHARACTER_BYTES`` as base64, and its name
CHARACTER_MAX_BODY = 4 * (MAX_CHARACTER_BYTES // 3 + 1) + 4096
#: default seconds a request body may take to arrive (408 and the connection closed after that)
BODY_TIMEOUT_S = 10.0
#: default seconds a connection may take to send a request head (after it opens or after a response)
IDLE_TIMEOUT_S = 10
#: default connections served at once (uvicorn answers more with 503)
LIMIT_CONCURRENCY = 128
#: what every response carries: browsers must not guess another content type than the one sent, and
#: no other site may frame the page (clickjacking)
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                    "X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}


class Refused(Exception):
    """A request refused before it reaches the game (status, one-line message, headers to add)."""

    def __init__(self, status: int, message: str, headers: dict | None = None, clear_cookie: bool = False):
        super().__init__(message)
        self.status, self.headers, self.clear_cookie = status, headers or {}, clear_cookie


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any address in 127.0.0.0/8 or ``::1`` (brackets allowed)."""
    try:
        return host.lower() == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def no_auth_warning(host: str, token: bool = False) -> str | None:
    """The warning to print when serving on ``host``; None for a loopback address.

    Every host but loopback (``0.0.0.0``, a LAN address, a name) is reachable from other machines:
    without a ``token`` anyone who reaches it can play; with one, the token still crosses the
    network in plain HTTP.
    """
    if is_loopback(host):
        return None
    if token:
        return (f"warning: serving on {host}, which other machines can reach, over plain HTTP: the token keeps "
                f"out those who do not have it, not those who can watch the network. Fix: serve on 127.0.0.1 "
                f"(the default) and tunnel to it (ssh -L) on networks you do not trust")
    return (f"warning: serving on {host}, which other machines can reach, with no authentication: anyone who "
            f"reaches this port can play turns and fill the disk with games. Fix: add --token, or serve on "
            f"127.0.0.1 (the default) and tunnel to it (ssh -L), or use --host only on a network you trust")


def check_port(host: str, port: int) -> None:
    """Raises ValueError (one line with the fix) when ``host:port`` cannot be served on, a port
    another program listens on say: the web command checks before it loads and compiles, so a taken
    port is its first line, not a failure after the warm-up. Each address ``host`` resolves to is
    bound as uvicorn's server binds it (``SO_REUSEADDR``; IPv6 only on an IPv6 socket), then let go."""
    if not port:
        return  # the system picks a free one
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        raise ValueError(f"cannot serve on {host}:{port}: {getattr(e, 'strerror', None) or e}. Fix: pass --host "
                         f"with an address or name of this machine") from None
    for family, kind, proto, _, addr in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
            except OSError as e:
                raise ValueError(f"cannot serve on {host}:{port}: {(e.strerror or str(e)).lower()}. Fix: pass "
                                 f"--port with a free port (or stop the program serving on {port})") from None


def check_token(token: str | None) -> None:
    """Raises ValueError (one line) unless ``token`` is None or matches :data:`TOKEN`."""
    if token is not None and not TOKEN.match(token):
        raise ValueError("--token must be 16 to 256 characters of A-Z a-z 0-9 . _ ~ - (it travels in a URL and "
                         "a cookie). Fix: --token $(python -c 'import secrets; print(secrets.token_urlsafe())')")


def host_names(host: str) -> tuple[frozenset[str], bool]:
    """The ``Host`` header names a server bound to ``host`` answers to, and whether any IP address is one.

    Always :data:`LOOPBACK_NAMES`; plus ``host`` itself (an IPv6 address in brackets). A wildcard
    (:data:`WILDCARDS`: every interface) adds this machine's name (``socket.gethostname()``) and any
    IP address: the server cannot know every name that reaches it, and an address (unlike a name)
    cannot be rebound by DNS to another site.
    """
    names = set(LOOPBACK_NAMES)
    bare = host.strip("[]").lower()
    if bare in WILDCARDS:
        return frozenset(names | {socket.gethostname().lower()}), True
    try:
        names.add(f"[{bare}]" if ipaddress.ip_address(bare).version == 6 else bare)
    except ValueError:
        names.add(bare)
    return frozenset(names), False


def cookie_name(base: str, port: int | None) -> str:
    """The name of cookie ``base`` (:data:`COOKIE`, :data:`TOKEN_COOKIE`) of the server on ``port``:
    ``agj_session_7860`` (``base`` when the port is unknown). Browsers send a host's cookies to every
    port of it, so servers on two ports of one host would otherwise replace each other's session and
    token cookies (a player's game lost to "session unknown" in the other tab)."""
    return base if port is None else f"{base}_{int(port)}"


def _cookie(scope, base: str) -> str:
    """:func:`cookie_name` of ``base`` for the server port of ASGI ``scope``."""
    server = scope.get("server")
    return cookie_name(base, None if server is None else server[1])


def split_host(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` header -> (lower-case name, port or None); None when it is not ``name[:port]``."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        if end < 0:
            return None
        name, rest = v[: end + 1], v[end + 1:]
    else:
        name, sep, port = v.partition(":")
        rest = sep + port
    if not name or (rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6)):
        return None
    return name, int(rest[1:]) if rest else None


class Guard:
    """ASGI middleware: refuses, before any route, what app.py's docstring lists under :class:`Guard`.

    ``names`` / ``any_ip``: :func:`host_names`; ``token``: required on every request when set (it is
    compared in constant time; a request that brings it in ``?token=`` gets the cookie
    :data:`TOKEN_COOKIE` (:func:`cookie_name`), so the page's own requests carry it).
    """

    def __init__(self, app, names: frozenset[str], any_ip: bool, token: str | None):
        self.app, self.names, self.any_ip, self.token = app, names, any_ip, token

    def host_ok(self, name: str, port: int | None, scope) -> bool:
        server = scope.get("server")
        if port is not None and server is not None and port != server[1]:
            return False
        if name in self.names:
            return True
        if self.any_ip:
            try:
                ipaddress.ip_address(name.strip("[]"))
                return True
            except ValueError:
                return False
        return False

    def check(self, request: Request) -> tuple[int, str] | None:
        """(status, one-line message) of the refusal, or None to serve the request."""
        h = request.headers
        host = h.get("host")
        if not host:
            return 400, "the request has no Host header. Fix: send HTTP/1.1 with a Host header"
        parsed = split_host(host)
        if parsed is None or not self.host_ok(*parsed, request.scope):
            return 403, (f"the Host {host[:100]!r} is not a name of this server (a page on another site can "
                         f"reach a loopback server by renaming itself). Fix: open http://127.0.0.1:"
                         f"{(request.scope.get('server') or ('', 'PORT'))[1]}/ or serve with --host NAME to "
                         f"answer to NAME")
        origin = h.get("origin")
        site = h.get("sec-fetch-site", "").lower()
        link_to_page = (request.method in ("GET", "HEAD") and request.url.path == "/"
                        and h.get("sec-fetch-mode") == "navigate" and h.get("sec-fetch-dest") == "document")
        own = {f"http://{host.strip().lower()}", f"https://{host.strip().lower()}"}
        if (origin is not None and origin.lower() not in own) or (site in ("cross-site", "same-site")
                                                                  and not link_to_page):
            what = f"Origin {origin[:100]!r}" if origin is not None and origin.lower() not in own else \
                f"Sec-Fetch-Site {site}"
            return 403, (f"cross-site request refused ({what}): only the server's own page may use it. Fix: "
                         f"open the page (/) and play there")
        if self.token is not None:
            carried = request.cookies.get(_cookie(request.scope, TOKEN_COOKIE))
            given = request.query_params.get("token") or carried or ""
            if not secrets.compare_digest(given.encode(), self.token.encode()):
                return 403, ("this server needs its token" + (" (the one given is wrong)" if given else "")
                             + ". Fix: open the URL with ?token= that the server printed when it started")
        if request.method == "POST" and request.url.path.startswith("/api/"):
            ctype = h.get("content-type", "").split(";")[0].strip().lower()
            if ctype != "application/json":
                return 415, (f"the request body must be sent as Content-Type: application/json, not "
                             f"{ctype[:100]!r}. Fix: send JSON with that header (the page does)")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        refusal = self.check(request)
        if refusal is not None:
            status, message = refusal
            return await JSONResponse({"error": message}, status_code=status)(scope, receive, send)
        send_on = send
        if self.token is not None and request.query_params.get("token"):
            async def send_on(message):  # the token came in the URL: a cookie carries it from now on
                if message["type"] == "http.response.start":
                    carrier = Response()
                    carrier.set_cookie(_cookie(scope, TOKEN_COOKIE), self.token, httponly=True, samesite="strict",
                                       path="/")
                    message = {**message, "headers": [*message.get("headers", []),
                                                      *[h for h in carrier.raw_headers if h[0] == b"set-cookie"]]}
                await send(message)
        await self.app(scope, receive, send_on)


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


def create_app(server: GameServer, max_body: int = MAX_BODY, host: str = "127.0.0.1", token: str | None = None,
               body_timeout_s: float = BODY_TIMEOUT_S) -> "SecurityHeaders":
    """The ASGI app serving ``server`` (its worker must be started by the caller): the routes behind
    :class:`Guard`, every response with :data:`SECURITY_HEADERS`.

    Args:
      max_body: the largest request body in bytes (larger ones get 413 unread).
      host: the address the server binds (``--host``): which ``Host`` names it answers to
        (:func:`host_names`).
      token: when set, every request must carry it (:class:`Guard`); :data:`TOKEN` says what it may hold.
      body_timeout_s: seconds a request body may take to arrive (408 after that).

    Raises:
      ValueError: a ``token`` :func:`check_token` refuses.
    """
    check_token(token)
    static_files = {n: os.path.join(STATIC, n) for n in sorted(os.listdir(STATIC))
                    if n != "index.html" and os.path.isfile(os.path.join(STATIC, n))}

    def cookie_sid(request: Request) -> str | None:
        sid = request.cookies.get(_cookie(request.scope, COOKIE))
        if sid is not None and not session_id_ok(sid):
            raise Refused(400, "the session cookie was not issued by this server. Fix: reload the page "
                               "(this reply cleared the cookie)", clear_cookie=True)
        return sid

    def session_of(request: Request) -> Session:
        """The request's live session; 403 without one (only the page load makes sessions)."""
        sid = cookie_sid(request)
        if sid is None:
            raise Refused(403, "this request has no session. Fix: load the page (/) first: it starts a session")
        s = server.find_session(sid)
        if s is None:
            raise Refused(403, "this session is unknown to the server (it expired or the server restarted before "
                               "it saved a game). Fix: reload the page to start a new session")
        return s

    async def body_of(request: Request, limit: int | None = None, **fix):
        return parse_json(await read_body(request, max_body if limit is None else limit, body_timeout_s, **fix),
                          empty={})

    def error(status: int, message: str, **extra) -> JSONResponse:
        return JSONResponse({"error": message, **extra}, status_code=status)

    async def index(request: Request) -> Response:
        sid = cookie_sid(request)
        s = server.find_session(sid) if sid else None
        page = FileResponse(os.path.join(STATIC, "index.html"), media_type="text/html",
                            headers={"Cache-Control": "no-store"})
        if s is None:
            try:
                s = server.new_session()
            except ServerFull as e:
                return error(503, str(e))
            page.set_cookie(_cookie(request.scope, COOKIE), s.id, httponly=True, samesite="strict", path="/")
        return page

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "gallery.css":
            return Response(writers.GALLERY_CSS, media_type="text/css")
        if name not in static_files:
            return error(404, f"no such static file; the page's files are {['gallery.css', *static_files]}")
        return FileResponse(static_files[name])

    async def state(request: Request) -> Response:
        return JSONResponse(server.state(session_of(request)))

    async def turn(request: Request) -> Response:
        s = session_of(request)
        body = await body_of(request)
        try:
            t, ids = server.parse_turn(s, body)
            job = server.submit(s, t, ids)
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

    async def answer(fn, *args, in_thread: bool = True, bad: tuple[type[Exception], ...] = (BadInput,)) -> Response:
        """``fn(*args)``'s value as JSON (run on a worker thread unless ``in_thread`` is False); 400 with
        the message of a ``bad`` error, 409 with a :class:`Busy` one."""
        try:
            return JSONResponse(await asyncio.to_thread(fn, *args) if in_thread else fn(*args))
        except Busy as e:
            return error(409, str(e))
        except bad as e:
            return error(400, str(e))

    async def undo(request: Request) -> Response:
        s = session_of(request)
        await body_of(request)
        return await answer(server.undo, s, bad=(IndexError, BadInput))

    async def restart(request: Request) -> Response:
        s = session_of(request)
        body = await body_of(request)
        if not isinstance(body, dict) or set(body) - {"seed"}:
            return error(400, "restart takes {\"seed\": <integer>} or nothing")
        return await answer(server.restart, s, body.get("seed"), in_thread=False)

    async def switch(request: Request) -> Response:
        s = session_of(request)
        body = await body_of(request)
        if not isinstance(body, dict) or set(body) != {"game_id"}:
            return error(400, "continue takes {\"game_id\": \"<one of the session's saved games>\"}")
        return await answer(server.continue_game, s, body["game_id"])

    async def character(request: Request) -> Response:
        s = session_of(request)
        body = await body_of(request, max(max_body, CHARACTER_MAX_BODY),
                             fix=f"upload an image of at most {MAX_CHARACTER_BYTES >> 20} MB")
        if not isinstance(body, dict) or set(body) != {"name", "image_b64"}:
            return error(400, "character takes {\"name\": \"<character name>\", \"image_b64\": \"<the image, base64>\"}")
        return await answer(server.add_character, s, body["name"], body["image_b64"])

    async def branch(request: Request) -> Response:
        s = session_of(request)
        body = await body_of(request)
        if not isinstance(body, dict) or set(body) - {"turns"}:
            return error(400, "branch takes {\"turns\": <turns to keep>} or nothing")
        return await answer(server.branch, s, body.get("turns"))

    def own_game(request: Request) -> str | None:
        """The folder of the URL's game when the request's session played it (no session is made)."""
        s = server.find_session(cookie_sid(request))
        return None if s is None else server.game_dir(s, request.path_params["game_id"])

    async def game_file(request: Request) -> Response:
        name = request.path_params["name"]
        folder = own_game(request)
        if folder is None or not _SAFE_NAME.match(name):
            return error(404, "no such game file in this session")
        if name in writers.DERIVED_FILES[:2]:  # game.mp4, the contact sheet: made on demand
            folder = await asyncio.to_thread(server.finish_game, server.find_session(cookie_sid(request)),
                                             request.path_params["game_id"])
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return error(404, "no such game file in this session")
        return FileResponse(path, headers={"Cache-Control": "no-cache"})

    async def game_zip(request: Request) -> Response:
        game_id = request.path_params["game_id"]
        folder = own_game(request)
        if folder is None:
            return error(404, "no such game in this session")
        await asyncio.to_thread(server.finish_game, server.find_session(cookie_sid(request)), game_id)

        def pack() -> bytes:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
                for name in writers.folder_files(folder):  # the marker and characters/ too: it continues anywhere
                    z.write(os.path.join(folder, *name.split("/")), f"{game_id}/{name}")
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
        Route("/api/continue", switch, methods=["POST"]),
        Route("/api/branch", branch, methods=["POST"]),
        Route("/api/character", character, methods=["POST"]),
        Route("/games/{game_id}.zip", game_zip),
        Route("/games/{game_id}/{name}", game_file),
    ]

    async def refused(request: Request, exc: Refused) -> Response:
        response = JSONResponse({"error": str(exc)}, status_code=exc.status, headers=exc.headers)
        if exc.clear_cookie:
            response.delete_cookie(_cookie(request.scope, COOKIE), path="/")
        return response

    async def http_error(request: Request, exc: HTTPException) -> Response:
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

    app = Starlette(routes=routes, exception_handlers={Refused: refused, HTTPException: http_error})
    names, any_ip = host_names(host)
    return SecurityHeaders(Guard(app, names, any_ip, token))


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


@functools.cache
def timed_h11_protocol() -> type:
    """``TimedH11Protocol`` (below), defined on first use: uvicorn is an optional dependency."""
    from uvicorn.protocols.http import h11_impl  # optional

    h11, H11Protocol = h11_impl.h11, h11_impl.H11Protocol

    class TimedH11Protocol(H11Protocol):
        """uvicorn's h11 protocol with a deadline on each request head: a connection that has not
        sent a whole request head within ``timeout_keep_alive`` seconds of opening, or of the end of
        its last response, is closed (idle, or a sender trickling header bytes). uvicorn's own
        keep-alive timer is cancelled by every byte received and is not armed before the first
        request. A request being served is never cut (its body has its own deadline, :func:`read_body`)."""

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_timeout)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._head_timer.cancel()
            self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_timeout)

        def connection_lost(self, exc) -> None:
            self._head_timer.cancel()
            super().connection_lost(exc)

        def _head_timeout(self) -> None:
            if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
                return  # closed already, or a request is being served
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:
                pass
            self.transport.close()

    return TimedH11Protocol


def uvicorn_settings(idle_timeout_s: float = IDLE_TIMEOUT_S, limit_concurrency: int = LIMIT_CONCURRENCY) -> dict:
    """uvicorn's settings for the app (``uvicorn.run(app, host=..., port=..., **uvicorn_settings())``).

    The h11 protocol with a deadline on request heads (:func:`timed_h11_protocol`, ``idle_timeout_s``
    seconds, also uvicorn's keep-alive timeout), at most ``limit_concurrency`` connections at once
    (uvicorn answers more with a plain-text 503), no access log.
    """
    return {"http": timed_h11_protocol(), "timeout_keep_alive": idle_timeout_s, "limit_concurrency": limit_concurrency,
            "log_level": "warning", "access_log": False}

