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


def run_processes(code: str, workdir: str, n: int = 2, devices: int = 1, timeout: int = 300) -> list[dict]:
    """Runs ``code`` as ``n`` jax.distributed processes on a free local port, each called with
    ``argv = [process_id, port, workdir]`` and ``devices`` fake CPU devices; returns the JSON object
    each prints on its last stdout line, sorted by its ``"pid"`` field.

    Raises AssertionError with a child's stderr when it exits non-zero.
    """
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(port), str(workdir)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for i in range(n)]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (_, e) in zip(procs, outs):
        assert p.returncode == 0, e[-4000:]
    return sorted((json.loads(o.strip().splitlines()[-1]) for o, _ in outs), key=lambda r: r["pid"])
