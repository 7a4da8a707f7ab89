"""The web server under load: N concurrent players x T turns through the HTTP API.

Usage::

    python benchmarks/web_load.py [--players 16] [--turns 3] [--max_queue 32]
        [--checkpoint checkpoints/tiny_system | --standin] [--json report.json]

Starts ``python -m animegamer_jax.commands.web`` as its own process (default host, a free port, the warm-up
turn first, games in a temporary folder that is removed afterwards), then ``--players`` threads,
each one browser session with its own cookie, start together and play ``--turns`` turns each,
every turn POSTed as soon as the previous one is done (so the queue stays about ``players`` deep).
A turn refused with 503 is retried after its ``Retry-After``. Prints one line of figures:

* queue wait: the server's ``wait_s`` of each turn (queued -> its batch starts), p50 / p95 / max;
* turn latency: POST -> ``done`` as the player sees it, p50 / p95;
* the largest queue position a player was told, and the 503 refusals;
* turn latency by turn number (median over players; ``latency_by_turn_s`` in the JSON), and the
  last turn's over the first's: ``--players 1 --turns 40`` shows whether a turn's cost grows with
  the game;
* the server process's RSS: idle after the warm-up, at the end, and its peak (``VmHWM`` of
  /proc/<pid>/status), and RSS growth per turn held in memory ((end - idle) / turns played).

and checks (exit status 1, naming each failure): every turn finished ``done``; FIFO (each turn's
``served`` equals its ``ticket``); positions (non-increasing, ending at most at the server's batch
size, ``ahead`` consistent);
isolation (distinct games, each game holds exactly its player's instructions, on disk too, and
another player's clip and zip are 404). tests/test_web_load.py runs the same checks in CI.
Figures: docs/results.md "Web server under load".
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from animegamer_jax.io import fileio  # noqa: E402
from animegamer_jax.web.routes import COOKIE, cookie_name  # noqa: E402
from benchmarks.common import git_commit  # noqa: E402

SERVING = re.compile(r"serving on (http://([^:/]+):(\d+))/")
BATCH = re.compile(r"(\d+) turns per batch")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status_kib(pid: int, field: str) -> int:
    """``field`` (``VmRSS``, ``VmHWM``) of /proc/<pid>/status in KiB; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class ServerProcess:
    """``python -m animegamer_jax.commands.web ARGS --port <free> --out OUT`` in its own process.

    ``start()`` returns once the server accepts connections (``url`` then holds its address, as the
    server printed it); ``lines`` holds its output (stdout and stderr) as it comes; a thread samples
    its RSS every ``sample_s`` seconds into ``rss_kib`` (the largest sample in ``max_rss_kib``).
    ``stop()`` sends SIGINT (the command's Ctrl-C) and waits; returns the exit status.
    """

    def __init__(self, args: list[str], out: str, sample_s: float = 0.1):
        self.port = free_port()
        self.cmd = [sys.executable, "-m", "animegamer_jax.commands.web", *args, "--port", str(self.port), "--out", out]
        self.lines: list[str] = []
        self.url = ""
        self.max_rss_kib = 0
        self.sample_s = sample_s
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 600.0) -> "ServerProcess":
        """Starts the server and waits until it accepts connections.

        Raises:
          RuntimeError: it exited or did not listen within ``timeout`` seconds (its output attached).
        """
        env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()
        t0 = time.time()
        while True:
            m = next((SERVING.search(x) for x in list(self.lines) if SERVING.search(x)), None)
            if m:
                self.url = m.group(1)
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return self
                except OSError:
                    pass
            if self.proc.poll() is not None or time.time() - t0 > timeout:
                self.stop()
                raise RuntimeError(f"the web server did not start ({' '.join(self.cmd)}):\n"
                                   + "".join(self.lines[-40:]))
            time.sleep(0.05)

    @property
    def batch(self) -> int:
        """Turns the server runs in one batched step, as it printed at start (1 when it did not say)."""
        m = next((BATCH.search(x) for x in list(self.lines) if BATCH.search(x)), None)
        return int(m.group(1)) if m else 1

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def _sample(self) -> None:
        while self.proc.poll() is None:
            self.max_rss_kib = max(self.max_rss_kib, self.rss_kib())
            time.sleep(self.sample_s)

    def rss_kib(self) -> int:
        """The server's resident memory now (KiB)."""
        return proc_status_kib(self.proc.pid, "VmRSS")

    def peak_rss_kib(self) -> int:
        """The server's peak resident memory since it started (``VmHWM``, KiB)."""
        return proc_status_kib(self.proc.pid, "VmHWM")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class Player:
    """One browser session over HTTP/1.1 (its own cookie; a new connection per request)."""

    def __init__(self, url: str, timeout: float = 600.0):
        m = re.match(r"http://([^:/]+):(\d+)", url)
        self.host, self.port = m.group(1), int(m.group(2))
        self.timeout = timeout
        self.cookie: str | None = None
        self.cookie_name = cookie_name(COOKIE, self.port)  # the session cookie of the server on this port

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """``(status, headers (lower-case names), response)``; the caller reads and closes the response."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        h = dict(headers or {})
        if self.cookie and "Cookie" not in h:
            h["Cookie"] = f"{self.cookie_name}={self.cookie}"
        if body is not None:
            h.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
        m = re.search(rf"{self.cookie_name}=([^;]*)", hdrs.get("set-cookie", ""))
        if m:
            self.cookie = m.group(1) or None
        return resp.status, hdrs, resp

    def join(self) -> int:
        """Loads the page (``GET /``), which starts this player's session; returns the status."""
        return self.get("/")[0]

    def get(self, path: str) -> tuple[int, bytes]:
        status, _, resp = self.request("GET", path)
        return status, resp.read()

    def json(self, method: str, path: str, body=None) -> tuple[int, dict]:
        status, _, resp = self.request(method, path, None if body is None else json.dumps(body).encode())
        return status, json.loads(resp.read() or b"null")

    def turn(self, body: dict) -> dict:
        """POSTs a turn and reads its event stream to the end.

        Returns ``{"status", "retry_after", "error", "events", "t_post", "t_done"}``; ``events`` with
        each ``frames`` event's data URLs replaced by their count (``n``).
        """
        t0 = time.perf_counter()
        status, hdrs, resp = self.request("POST", "/api/turn", json.dumps(body).encode())
        out = {"status": status, "retry_after": hdrs.get("retry-after"), "error": None, "events": [], "t_post": t0}
        if status != 200:
            out["error"] = json.loads(resp.read()).get("error")
        else:
            for line in resp:
                if line.strip():
                    ev = json.loads(line)
                    if ev["event"] == "frames":
                        ev = {**ev, "frames": None, "n": len(ev["frames"])}
                    ev["t"] = time.perf_counter()
                    out["events"].append(ev)
        out["t_done"] = time.perf_counter()
        return out


def instruction(player: int, turn: int) -> dict:
    """Player ``player``'s turn ``turn``: text no other player or turn uses."""
    return {"character": f"Bunny{player}", "motion": f"hop {turn + 1} times", "background": f"meadow {player}"}


def play_load(url: str, players: int, turns: int, max_retries: int = 100) -> list[dict]:
    """``players`` threads, started together, each playing ``turns`` turns of its own game.

    Returns one dict a player: ``{"player", "turns": [Player.turn results of the turns played],
    "refused": 503s, "state": its final /api/state, "client": the Player}``.
    """
    barrier = threading.Barrier(players)
    results: list[dict] = [{} for _ in range(players)]

    def run(i: int) -> None:
        p = Player(url)
        res = {"player": i, "turns": [], "refused": 0, "client": p, "error": None}
        results[i] = res
        try:
            p.join()  # the session cookie
            barrier.wait(120)
            for k in range(turns):
                for _ in range(max_retries):
                    r = p.turn(instruction(i, k))
                    if r["status"] != 503:
                        break
                    res["refused"] += 1
                    time.sleep(float(r["retry_after"] or 1))
                res["turns"].append(r)
                if r["status"] != 200 or r["events"][-1]["event"] != "done":
                    break
            res["state"] = p.json("GET", "/api/state")[1]
        except Exception as e:  # noqa: BLE001 - reported by check_load
            res["error"] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=run, args=(i,)) for i in range(players)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def check_load(results: list[dict], turns: int, out_dir: str | None = None, batch: int = 1) -> list[str]:
    """The failures of a :func:`play_load` run (empty: all good): every turn done, FIFO, positions
    reported correctly (non-increasing, the last at most ``batch``: the server's turns per batched
    step, which start together), and isolation (own game, own instructions, on disk under ``out_dir`` when
    given, another player's clip and zip refused with 404)."""
    bad = []
    games = {}
    for r in results:
        i = r["player"]
        if r["error"]:
            bad.append(f"player {i}: {r['error']}")
            continue
        if len(r["turns"]) != turns or any(t["status"] != 200 or t["events"][-1]["event"] != "done"
                                           for t in r["turns"]):
            last = r["turns"][-1] if r["turns"] else {}
            bad.append(f"player {i}: {len(r['turns'])} turn(s) played, last {last.get('status')} "
                       f"{last.get('error') or (last.get('events') or [{}])[-1]}")
            continue
        for k, t in enumerate(r["turns"]):
            ev = t["events"]
            names = [e["event"] for e in ev]
            queued = [e for e in ev if e["event"] == "queued"]
            started = ev[names.index("started")] if "started" in names else None
            last_queued = max((j for j, n in enumerate(names) if n == "queued"), default=len(names))
            if started is None or names.index("started") < last_queued:
                bad.append(f"player {i} turn {k}: events out of order {names}")
                continue
            ticket = queued[0]["ticket"]
            if any(q["ticket"] != ticket for q in queued) or started["ticket"] != ticket:
                bad.append(f"player {i} turn {k}: the ticket changed {[q['ticket'] for q in queued]} {started}")
            if started["served"] != ticket:
                bad.append(f"player {i} turn {k}: not first in, first out: ticket {ticket} started as "
                           f"{started['served']}")
            pos = [q["position"] for q in queued]
            if pos != sorted(pos, reverse=True) or not 1 <= pos[-1] <= batch:
                bad.append(f"player {i} turn {k}: positions {pos} do not count down to 1..{batch}")
            if any(not 0 <= q["ahead"] - (q["position"] - 1) <= batch for q in queued):
                bad.append(f"player {i} turn {k}: 'ahead' is not position - 1 (+ the running turns): {queued}")
        state = r["state"]
        want = [f"Character: {b['character']}; Motion: {b['motion']}; Background: {b['background']}."
                for b in (instruction(i, k) for k in range(turns))]
        got = [t["instruction"] for t in state["turns"]]
        if got != want:
            bad.append(f"player {i}: its game holds {got}, not its own turns {want}")
        games[i] = state
        if out_dir is not None:
            try:
                with open(os.path.join(out_dir, state["game_id"], "game.json")) as f:
                    on_disk = json.load(f)["instructions"]
            except (OSError, ValueError, KeyError) as e:
                on_disk = f"unreadable ({e})"
            if on_disk != want:
                bad.append(f"player {i}: {state['game_id']}/game.json holds {on_disk}")
    ids = [s["game_id"] for s in games.values()]
    if len(set(ids)) != len(ids):
        bad.append(f"players share games: {ids}")
    order = sorted(games)
    for a, b in zip(order, order[1:] + order[:1]):
        if a == b:
            continue
        other = games[b]
        client = results[a]["client"]
        for path in (other["turns"][0]["video"], other["download"]):
            status, _ = client.get(path)
            if status != 404:
                bad.append(f"player {a} got {path} of player {b}'s game: {status}, not 404")
    return bad


def summarize(results: list[dict]) -> dict:
    """Figures of a :func:`play_load` run: players, turns, queue wait and turn latency percentiles (s),
    the largest position reported, 503 refusals."""
    waits, lat, pos = [], [], [0]
    by_turn: dict[int, list[float]] = {}
    for r in results:
        for k, t in enumerate(r["turns"]):
            for e in t["events"]:
                if e["event"] == "started":
                    waits.append(e["wait_s"])
                elif e["event"] == "queued":
                    pos.append(e["position"])
            if t["events"] and t["events"][-1]["event"] == "done":
                lat.append(t["t_done"] - t["t_post"])
                by_turn.setdefault(k, []).append(t["t_done"] - t["t_post"])
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan")  # noqa: E731
    return {"players": len(results), "turns": sum(len(r["turns"]) for r in results),
            "turns_done": len(lat), "wait_p50_s": pct(waits, 50), "wait_p95_s": pct(waits, 95),
            "wait_max_s": max(waits, default=float("nan")), "latency_p50_s": pct(lat, 50),
            "latency_p95_s": pct(lat, 95), "max_position": max(pos), "refused_503": sum(r["refused"] for r in results),
            "latency_by_turn_s": [float(np.median(by_turn[k])) for k in sorted(by_turn)]}


def _growth(by_turn: list[float]) -> str:
    """'turn 1 X s, turn N Y s (Y/X x); ' from the median latency of each turn number."""
    if len(by_turn) < 2:
        return ""
    return (f"turn 1 {by_turn[0]:.2f} s, turn {len(by_turn)} {by_turn[-1]:.2f} s "
            f"({by_turn[-1] / by_turn[0]:.2f}x); ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--players", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max_queue", type=int, default=None, help="the server's --max_queue (default its own)")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", default=os.path.join(ROOT, "checkpoints", "tiny_system"))
    which.add_argument("--standin", action="store_true", help="the random stand-in system (fastest turns)")
    ap.add_argument("--json", default="", help="also write the figures here")
    a = ap.parse_args()

    out = tempfile.mkdtemp(prefix="web_load_")
    args = ["--standin"] if a.standin else ["--checkpoint", a.checkpoint]
    if a.max_queue is not None:
        args += ["--max_queue", str(a.max_queue)]
    server = ServerProcess(args, os.path.join(out, "games"))
    try:
        t0 = time.perf_counter()
        server.start()
        print(f"server up in {time.perf_counter() - t0:.1f} s ({' '.join(server.cmd[1:])})", flush=True)
        time.sleep(1.0)
        idle = server.rss_kib()
        t0 = time.perf_counter()
        results = play_load(server.url, a.players, a.turns)
        wall = time.perf_counter() - t0
        end, peak = server.rss_kib(), server.peak_rss_kib()
        failures = check_load(results, a.turns, os.path.join(out, "games"), batch=server.batch)
    finally:
        rc = server.stop()
        shutil.rmtree(out, ignore_errors=True)
    fig = summarize(results)
    fig.update({"system": "stand-in" if a.standin else os.path.relpath(a.checkpoint, ROOT), "wall_s": wall,
                "rss_idle_mib": idle / 1024, "rss_end_mib": end / 1024, "rss_peak_mib": peak / 1024,
                "rss_per_turn_held_mib": (end - idle) / 1024 / max(1, fig["turns_done"]),
                "server_exit": rc, "failures": failures, "cpus": os.cpu_count(), "max_queue": a.max_queue})
    print(f"{fig['players']} players x {a.turns} turns ({fig['system']}): {fig['turns_done']}/{fig['turns']} done "
          f"in {wall:.1f} s; queue wait p50 {fig['wait_p50_s']:.2f} s, p95 {fig['wait_p95_s']:.2f} s, "
          f"max {fig['wait_max_s']:.2f} s; turn latency p50 {fig['latency_p50_s']:.2f} s, p95 "
          f"{fig['latency_p95_s']:.2f} s; max position {fig['max_position']}; 503s {fig['refused_503']}; "
          f"server RSS idle {fig['rss_idle_mib']:.0f} MiB, end {fig['rss_end_mib']:.0f} MiB, peak "
          f"{fig['rss_peak_mib']:.0f} MiB ({fig['rss_per_turn_held_mib']:.2f} MiB per turn held); "
          f"{_growth(fig['latency_by_turn_s'])}"
          f"checks: {'all passed' if not failures else f'{len(failures)} FAILED'}", flush=True)
    for f in failures:
        print("FAILED:", f)
    if a.json:
        fileio.write_text_atomic(a.json, json.dumps({**fig, **git_commit()}, indent=1) + "\n")
    sys.exit(1 if failures or rc != 0 else 0)


if __name__ == "__main__":
    main()
