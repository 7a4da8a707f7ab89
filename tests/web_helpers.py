"""The web tests' shared server and client side: the app served by uvicorn on a background thread
(:class:`HttpThread`), an HTTP session with its own cookies, raw requests on a new connection, and
waits / a played turn in the headless Chromium page (the ``browser`` fixture is in conftest.py)."""

import http.cookiejar
import json
import socket
import threading
import time
import urllib.error
import urllib.request

TURN_TIMEOUT = 300  # s: the first turn compiles the three stages on a loaded 2-core CPU


def standin_server(out: str, max_batch: int = 4):
    """A started ``GameServer`` of configs/tiny.py on the stand-in system, its games in ``out``
    (the caller stops it)."""
    from animegamer_jax.config import load_config
    from animegamer_jax.web.server import build_server

    server = build_server(load_config("configs/tiny.py"), standin=True, out=out, max_batch=max_batch)
    server.start()
    return server


class HttpThread:
    """Serves an ASGI app (``web.app.create_app``'s) with uvicorn on a background thread.

    ``start()`` returns once the socket listens; ``url`` is ``http://host:port``; ``stop()`` shuts
    uvicorn down and joins the thread. ``port=0`` picks a free port (``port`` holds it after ``start()``).
    ``settings``: ``web.app.uvicorn_settings``'s arguments (the command's defaults otherwise).
    """

    def __init__(self, asgi_app, host: str = "127.0.0.1", port: int = 0, **settings):
        import uvicorn  # optional

        from animegamer_jax.web.app import uvicorn_settings  # optional (starlette)

        self._server = uvicorn.Server(uvicorn.Config(asgi_app, host=host, port=port, lifespan="off",
                                                     **uvicorn_settings(**settings)))
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


class Client:
    """One browser session over plain HTTP (its own cookie jar; the page load starts the session)."""

    def __init__(self, url):
        self.url = url
        self.op = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        page = self.op.open(self.url + "/", timeout=TURN_TIMEOUT)
        assert page.status == 200 and b"<script src=\"/static/app.js\">" in page.read()

    def request(self, path, body=None, raw=None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        try:
            return self.op.open(req, timeout=TURN_TIMEOUT)
        except urllib.error.HTTPError as e:
            return e

    def json(self, path, body=None, raw=None):
        r = self.request(path, body, raw)
        return r.status, json.loads(r.read())

    def open_turn(self, body):
        """POSTs a turn; returns the open streaming response (the turn is queued when it returns)."""
        r = self.request("/api/turn", body)
        assert r.status == 200, r.read()
        return r

    @staticmethod
    def events(resp):
        return [json.loads(line) for line in resp if line.strip()]


def wait(driver, script, timeout, what):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = driver.execute_script(script)
        if v:
            return v
        time.sleep(0.05)
    status = driver.execute_script("return document.querySelector('#status').textContent + ' | ' + "
                                   "document.querySelector('#error').textContent")
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; page says: {status}")


PLAYING = ("const v=document.querySelector('#clip'); return v.src.includes(arguments[0]) && !v.paused && "
           "v.readyState>=2 && v.currentTime>0 && v.videoWidth>0")


def play_turn(driver, k, character, motion, background, done=None):
    for name, value in (("character", character), ("motion", motion), ("background", background)):
        el = driver.find_element("id", name)
        el.clear()
        el.send_keys(value)
    driver.find_element("id", "generate").click()
    wait(driver, f"return window.agj.turnsDone === {k + 1 if done is None else done}", TURN_TIMEOUT, f"turn {k + 1}")
    src = f"turn_{k:03d}.mp4"
    wait(driver, PLAYING.replace("arguments[0]", repr(src)), 30, f"the clip {src} to play")
    # the streamed frames gave way to the finished clip in its player
    wait(driver, "return document.querySelector('#live').hidden", 10, "the live frames to give way to the clip")
    return driver.execute_script("return {click: agj.tClick, first: agj.tFirstFrame, done: agj.tDone, "
                                 "shown: agj.framesShown}")


def read_to_close(s: socket.socket) -> bytes:
    """Everything ``s`` receives until the other side closes (or resets) the connection."""
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        buf += chunk
    return buf


def call(opener, url: str, body=None) -> tuple[int, bytes]:
    """``(status, body)`` of a GET (``body`` None) or a JSON POST of ``body`` through ``opener`` (a
    ``urllib`` opener with its own cookie jar), 4xx and 5xx included."""
    req = urllib.request.Request(url, None if body is None else json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with opener.open(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def raw(http, data: bytes, read_timeout=30.0) -> tuple[int, bytes]:
    """Sends ``data`` as it is on a new connection; ``(status, body)`` of the reply."""
    with socket.create_connection((http.host, http.port), timeout=read_timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):  # the server answered and closed before all was sent
            pass
        buf = read_to_close(s)
    head, _, body = buf.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def post(path, body: bytes, extra=b"", ctype=b"application/json", host=b"127.0.0.1"):
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n"
            + (b"Content-Type: " + ctype + b"\r\n" if ctype else b"") + extra
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
