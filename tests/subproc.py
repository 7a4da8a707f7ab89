"""Runs a Python snippet in a fresh interpreter with N fake CPU devices (conftest already imported jax here)."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, devices: int = 8, timeout: int = 300, env: dict | None = None) -> str:
    """Runs ``code`` with ``--xla_force_host_platform_device_count=devices``; returns stdout.

    Raises AssertionError with the child's stderr when it exits non-zero.
    """
    full_env = dict(os.environ)
    full_env.update({"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
                     "JAX_PLATFORMS": "cpu", "JAX_THREEFRY_PARTITIONABLE": "0", "PYTHONPATH": ROOT + os.pathsep + full_env.get("PYTHONPATH", "")})
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)
    assert proc.returncode == 0, f"child failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


#: the first lines of a run_processes worker: joins the two-process jax.distributed group (``pid``,
#: ``port``, ``workdir`` from argv; ``json``, ``jax`` and ``parallel`` imported)
WORKER_JOIN = r"""
import json, sys
import jax
from animegamer_jax import parallel
pid, port, workdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
assert parallel.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
"""
#: the last lines of a worker that trained ``r`` (loop.fit's result): its JSON line, then leaves the group
WORKER_REPORT = r"""
print(json.dumps({"pid": jax.process_index(), "devices": jax.device_count(), "losses": list(r.losses.values())}))
jax.distributed.shutdown()
"""


def agreed_losses(results: list[dict], devices: int, steps: int) -> list[float]:
    """The losses of two WORKER_REPORT workers (run_processes' results), asserting that each saw
    ``devices`` devices and that both logged the same ``steps`` losses."""
    assert [r["devices"] for r in results] == [devices, devices]
    assert len(results[0]["losses"]) == steps and results[0]["losses"] == results[1]["losses"]
    return results[0]["losses"]


def free_port() -> int:
    """A free local TCP port (for a jax.distributed coordinator, a storage emulator)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_results(procs: list[subprocess.Popen], timeout: int, key: str = "pid") -> list[dict]:
    """Waits for ``procs`` (text stdout / stderr pipes); returns the JSON object each prints on its last
    stdout line, sorted by its ``key`` field.

    Raises AssertionError with a child's stderr when it exits non-zero.
    """
    import json

    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (_, e) in zip(procs, outs):
        assert p.returncode == 0, e[-4000:]
    return sorted((json.loads(o.strip().splitlines()[-1]) for o, _ in outs), key=lambda r: r[key])


def run_processes(code: str, workdir: str, n: int = 2, devices: int = 1, timeout: int = 300) -> list[dict]:
    """Runs ``code`` as ``n`` jax.distributed processes on a free local port, each called with
    ``argv = [process_id, port, workdir]`` and ``devices`` fake CPU devices; returns the JSON object
    each prints on its last stdout line, sorted by its ``"pid"`` field.

    Raises AssertionError with a child's stderr when it exits non-zero.
    """
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(port), str(workdir)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for i in range(n)]
    return json_results(procs, timeout)


#: a child that takes the lock argv[1] (``locks.exclusive_lock``: a local lock file or a gs:// lease),
#: prints "held" and holds it until its stdin closes (or it is killed); refused, it prints
#: "refused: pid N on host H" (whose the lock is) and exits 3
LOCK_HOLDER = ("import sys\nfrom animegamer_jax.io import locks\n"
               "try:\n    with locks.exclusive_lock(sys.argv[1]):\n        print('held', flush=True)\n"
               "        sys.stdin.read()\n"
               "except locks.LockHeldError as e:\n    print('refused:', e.holder_words())\n    sys.exit(3)\n")


def child_env() -> dict:
    """This process's environment (a test's ``STORAGE_EMULATOR_HOST`` included) for a child on CPU
    that imports the checkout."""
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def hold_lock(lock: str) -> subprocess.Popen:
    """A :data:`LOCK_HOLDER` child holding ``lock`` (returns once it holds it; close its stdin to end it)."""
    p = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, lock], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=child_env(), cwd=ROOT)
    assert p.stdout.readline().strip() == "held"
    return p


def probe_lock(lock: str) -> tuple[int, str]:
    """``(exit status, stdout)`` of a :data:`LOCK_HOLDER` child that takes ``lock`` and lets go at once
    (``(0, "held\\n")``), or is refused (``(3, "refused: pid N on host H\\n")``)."""
    p = subprocess.run([sys.executable, "-c", LOCK_HOLDER, lock], input="", capture_output=True, text=True,
                       env=child_env(), cwd=ROOT)
    return p.returncode, p.stdout
