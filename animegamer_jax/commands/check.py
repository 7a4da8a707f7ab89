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

from animegamer_jax.parallel.check import gather_processes


def main(argv: list[str] | None = None) -> int:
    """Runs the check; returns the exit status. It takes no flags (arguments: exit status 2)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print(f"error: unexpected arguments {argv}; python -m animegamer_jax.commands.check takes none",
              file=sys.stderr)
        return 2
    out = gather_processes()
    print(json.dumps(out), flush=True)
    if out["gathered"] != list(range(out["processes"])):
        print(f"collective saw processes {out['gathered']}, expected 0..{out['processes'] - 1}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
