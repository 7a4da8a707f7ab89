"""Named rematerialization (gradient checkpointing) policies for every scanned layer stack.

One config field per stack (``dit.remat``, ``mllm.remat``, ``clip.remat``, ``t5.remat``; ``train.remat``
overrides them all in training) names what the backward pass may keep from the forward pass of
each scanned block; the rest is recomputed. The names follow maxdiffusion's ``GradientCheckpointType``:

  ``"none"``          no rematerialization: every intermediate is stored (fastest, most memory).
  ``"full"``          store only each block's input, recompute the whole block in the backward pass.
  ``"save_dots"``     keep the results of matmuls without batch dimensions (the projections; not
                      the attention scores), recompute the rest
                      (``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``).
  ``"offload_dots"``  as ``save_dots`` but the kept matmul results are moved to pinned host memory
                      (``offload_dot_with_no_batch_dims("device", "pinned_host")``); needs a backend
                      with a ``pinned_host`` memory space (GPU, TPU), ValueError elsewhere (CPU).

Booleans (in configs and checkpoints) are accepted: True -> "full", False -> "none".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from animegamer_jax.parallel import target

REMAT_POLICIES: tuple[str, ...] = ("none", "full", "save_dots", "offload_dots")


def policy_name(value: Any) -> str:
    """Normalizes a config value (policy name, bool, None) to one of :data:`REMAT_POLICIES`.

    Raises:
      ValueError: an unknown name (the message lists the known ones).
    """
    if value is None or value is False:
        return "none"
    if value is True:
        return "full"
    name = str(value).strip().lower()
    if name not in REMAT_POLICIES:
        raise ValueError(f"unknown remat policy {value!r}; use one of {REMAT_POLICIES}")
    return name


def _has_pinned_host() -> bool:
    """Whether the target (the active mesh's devices, parallel.target.current) has pinned host memory:
    TPU and GPU do; elsewhere the default device's memories say."""
    if target.current().platform in ("tpu", "gpu"):
        return True
    try:
        return any(m.kind == "pinned_host" for m in jax.devices()[0].addressable_memories())
    except Exception:  # backends without the memories API
        return False


def checkpoint_policy(name: Any) -> Callable[..., bool] | None:
    """The ``jax.checkpoint`` policy of a named remat setting (None for "full": save nothing).

    Raises:
      ValueError: unknown name; "none" (there is nothing to checkpoint); "offload_dots" on a
        backend without pinned host memory.
    """
    name = policy_name(name)
    if name == "none":
        raise ValueError("remat policy 'none' has no checkpoint policy (the function is not rematerialized)")
    if name == "full":
        return None
    if name == "save_dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    if not _has_pinned_host():
        raise ValueError(f"remat policy 'offload_dots' needs a target with pinned host memory; "
                         f"{target.current().platform!r} has none. Fix: use 'save_dots' or 'full'")
    return jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")


def remat(fn: Callable[..., Any], name: Any) -> Callable[..., Any]:
    """Wraps a scan body (a function of pytrees, e.g. split NNX state) with the named policy.

    Args:
      fn: the per-block function the stack scans.
      name: a policy name of :data:`REMAT_POLICIES` (or a bool, see :func:`policy_name`).

    Returns:
      ``fn`` itself for "none", else ``jax.checkpoint(fn, policy=..., prevent_cse=False)``
      (``prevent_cse=False`` is safe under ``scan``, as the JAX docs say).
    """
    name = policy_name(name)
    if name == "none":
        return fn
    return jax.checkpoint(fn, policy=checkpoint_policy(name), prevent_cse=False)
