"""Multi-host smoke test: ``python -m animegamer_jax.commands.check`` on every process of a launch.

Starts ``jax.distributed`` from the environment, all-gathers every process's index across hosts (a
real collective; parallel/check.py), and prints one JSON line per process::

    {"process": 0, "processes": 2, "local_devices": 1, "devices": 2, "gathered": [0, 1], "backend": "cpu"}

Run it through a launcher before an expensive job (``MODULE=animegamer_jax.commands.check
launch/multinode_gpu.sh``); it fails loudly when a process cannot reach the coordinator or the
collective does not see every process. Exit status 1 when the collective misses a process, 2 for
a bad command line.
"""

from __future__ import annotations

import json
import sys

from animegamer_jax.commands.cli import Command, no_flags, run
from animegamer_jax.parallel.check import gather_processes

PROG = "python -m animegamer_jax.commands.check"


def _check(f) -> int:
    """Runs the check; prints one JSON line; 1 when the collective missed a process."""
    out = gather_processes()
    print(json.dumps(out), flush=True)
    if out["gathered"] != list(range(out["processes"])):
        print(f"collective saw processes {out['gathered']}, expected 0..{out['processes'] - 1}", file=sys.stderr)
        return 1
    return 0


#: ``check`` (no flags of its own)
COMMAND = Command(no_flags, _check, __doc__)


def main(argv: list[str] | None = None) -> int:
    """Runs the check; returns the exit status (arguments: exit status 2 with one line)."""
    return run(PROG, argv, COMMAND)


if __name__ == "__main__":
    sys.exit(main())
