"""Multi-host start: ``jax.distributed.initialize`` when launched multi-process, skipped otherwise.

Launchers (``launch/``) set either the standard JAX variables (``JAX_COORDINATOR_ADDRESS``,
``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), SLURM's (``SLURM_NTASKS`` > 1, auto-detected by JAX),
or run on a Cloud TPU VM slice (auto-detected by JAX). A single process does nothing.
"""

from __future__ import annotations

import os

import jax
from absl import logging

_initialized = False


def is_multiprocess_launch(environ: dict[str, str] | None = None) -> bool:
    """True when the environment says this process is one of several."""
    env = os.environ if environ is None else environ
    if int(env.get("JAX_NUM_PROCESSES", "1") or 1) > 1:
        return True
    if int(env.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_PROCID" in env:
        return True
    # Cloud TPU VM pod slices: one worker per host, JAX finds the peers itself.
    if "," in env.get("TPU_WORKER_HOSTNAMES", ""):
        return True
    return False


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Calls ``jax.distributed.initialize`` once when needed; returns whether it did.

    Explicit arguments win over the environment (``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``). Must run before any other JAX call.
    """
    global _initialized
    if _initialized:
        return True
    env = os.environ
    coordinator_address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
    if num_processes is None and env.get("JAX_NUM_PROCESSES"):
        num_processes = int(env["JAX_NUM_PROCESSES"])
    if process_id is None and env.get("JAX_PROCESS_ID"):
        process_id = int(env["JAX_PROCESS_ID"])
    explicit = num_processes is not None and num_processes > 1
    if not explicit and not is_multiprocess_launch():
        return False
    kwargs = {}
    if coordinator_address:
        kwargs["coordinator_address"] = coordinator_address
    if num_processes is not None:
        kwargs["num_processes"] = num_processes
    if process_id is not None:
        kwargs["process_id"] = process_id
    jax.distributed.initialize(**kwargs)
    _initialized = True
    logging.info("jax.distributed: process %d of %d, %d global devices",
                 jax.process_index(), jax.process_count(), jax.device_count())
    return True
