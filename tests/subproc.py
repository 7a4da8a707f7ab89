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
