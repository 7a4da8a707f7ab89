"""The game server's ASGI app: the routes (routes.py) behind :class:`Guard` (Host names, other sites,
the token, JSON bodies) with :data:`SECURITY_HEADERS` on every response, and uvicorn's settings for
it. What each request gets: docs/commands.md, "Who may use it" and "What the server refuses"."""

from __future__ import annotations

import functools
import ipaddress
import re
import secrets
import socket

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from animegamer_jax.web.routes import BODY_TIMEOUT_S, MAX_BODY, Refused, Site, cookie_of, http_error, refused, routes
from animegamer_jax.web.server import GameServer

#: the name, before the port, of the cookie that carries ``--token`` once a URL with ``?token=`` has been opened
TOKEN_COOKIE = "agj_token"
#: what a ``--token`` may hold: URL- and cookie-safe characters, long enough not to be guessed
TOKEN = re.compile(r"^[A-Za-z0-9._~-]{16,256}$")
#: Host names served whatever ``--host`` is (the server's port, or none, may follow)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
#: ``--host`` values that bind every interface
WILDCARDS = ("0.0.0.0", "::")
#: default seconds a connection may take to send a request head (after it opens or after a response)
IDLE_TIMEOUT_S = 10
#: default connections served at once (uvicorn answers more with 503)
LIMIT_CONCURRENCY = 128
#: what every response carries: browsers must not guess another content type than the one sent, and
#: no other site may frame the page (clickjacking)
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                    "X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}


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
    """ASGI middleware refusing, before any route and in this order (one JSON line each):

    * 400 / 403: no ``Host`` header / a ``Host`` that is not a name of this server (:func:`host_names`;
      a DNS-rebinding page sends its own name) or names another port;
    * 403: a cross-site request: an ``Origin`` other than the server's own (``http://<Host>``), or
      ``Sec-Fetch-Site: cross-site`` / ``same-site``, except a top-level navigation to ``GET /``;
    * 403: with ``token`` set, a request without it (``?token=`` in the URL, or its cookie);
    * 415: an ``/api/`` POST whose ``Content-Type`` is not ``application/json`` (JSON needs a CORS
      preflight, which this server answers none of).

    ``names`` / ``any_ip``: :func:`host_names`; ``token`` is compared in constant time; a request that
    brings it in ``?token=`` gets the cookie :data:`TOKEN_COOKIE` (routes.py ``cookie_name``), so the
    page's own requests carry it.
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
            carried = request.cookies.get(cookie_of(request.scope, TOKEN_COOKIE))
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
                    carrier.set_cookie(cookie_of(scope, TOKEN_COOKIE), self.token, httponly=True, samesite="strict",
                                       path="/")
                    message = {**message, "headers": [*message.get("headers", []),
                                                      *[h for h in carrier.raw_headers if h[0] == b"set-cookie"]]}
                await send(message)
        await self.app(scope, receive, send_on)



def create_app(server: GameServer, max_body: int = MAX_BODY, host: str = "127.0.0.1", token: str | None = None,
               body_timeout_s: float = BODY_TIMEOUT_S) -> "SecurityHeaders":
    """The ASGI app serving ``server`` (its worker must be started by the caller): routes.py's
    ``ROUTES`` behind :class:`Guard`, every response with :data:`SECURITY_HEADERS`.

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
    site = Site(server, max_body=max_body, body_timeout_s=body_timeout_s)
    app = Starlette(routes=routes(site), exception_handlers={Refused: refused, HTTPException: http_error})
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
        request. A request being served is never cut (its body has its own deadline, routes.py ``read_body``)."""

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

