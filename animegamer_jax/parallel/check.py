"""Multi-host smoke test: every process of a launch all-gathers its index across hosts.

:func:`gather_processes` starts ``jax.distributed`` from the environment (parallel/distributed.py),
runs a real collective (every process's index, all-gathered) and returns what this process saw.
The command, ``python -m animegamer_jax.commands.check`` (commands/check.py), prints it as one JSON
line per process and fails when the collective misses a process.
"""

from __future__ import annotations


import jax
import numpy as np
from jax.experimental import multihost_utils

from animegamer_jax.parallel import distributed


def gather_processes() -> dict:
    """Initializes ``jax.distributed`` (a no-op for a single process) and all-gathers every process's
    index.

    Returns:
      ``{"process": int, "processes": int, "local_devices": int, "devices": int, "gathered": [int, ...],
      "backend": str}``; ``gathered`` is every process's index in order, ``list(range(processes))``
      when the collective reached every process.
    """
    distributed.initialize()
    gathered = multihost_utils.process_allgather(np.asarray([jax.process_index()], np.int32), tiled=True)
    return {"process": jax.process_index(), "processes": jax.process_count(),
            "local_devices": jax.local_device_count(), "devices": jax.device_count(),
            "gathered": [int(v) for v in np.asarray(gathered).ravel()], "backend": jax.default_backend()}
