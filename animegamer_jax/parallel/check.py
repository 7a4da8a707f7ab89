"""Multi-host smoke test: ``python -m animegamer_jax.parallel.check`` on every process of a launch.

Starts ``jax.distributed`` from the environment (parallel/distributed.py), all-gathers every
process's index across hosts (a real collective), and prints one JSON line per process::

    {"process": 0, "processes": 2, "local_devices": 1, "devices": 2, "gathered": [0, 1], "backend": "cpu"}

Run it through a launcher before an expensive job (``MODULE=animegamer_jax.parallel.check
launch/multinode_gpu.sh``); it fails loudly when a process cannot reach the coordinator or the
collective does not see every process. Exit status 1 when the collective misses a process, 2 for
a bad command line.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

from animegamer_jax.parallel import distributed


def main(argv: list[str] | None = None) -> int:
    """Runs the check; returns the exit status. It takes no flags: the bottom layer (parallel) does not
    import ``animegamer_jax.cli``, so the one command line check is done here."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print(f"error: unexpected arguments {argv}; python -m animegamer_jax.parallel.check takes none",
              file=sys.stderr)
        return 2
    distributed.initialize()
    gathered = multihost_utils.process_allgather(np.asarray([jax.process_index()], np.int32), tiled=True)
    out = {"process": jax.process_index(), "processes": jax.process_count(),
           "local_devices": jax.local_device_count(), "devices": jax.device_count(),
           "gathered": [int(v) for v in np.asarray(gathered).ravel()], "backend": jax.default_backend()}
    print(json.dumps(out), flush=True)
    if out["gathered"] != list(range(jax.process_count())):
        print(f"collective saw processes {out['gathered']}, expected 0..{jax.process_count() - 1}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
