"""Read-only access to a training run's checkpoints (``WORKDIR/checkpoints``, written by checkpoint/training.py).

A training checkpoint is an orbax composite of items ``state`` (the pure dict of the train state, the
``(model, optimizer)`` pair: key ``0`` the model's components by name, ``1`` the optimizer), ``meta``
and ``data``. :func:`load_train_component` reads one component's weights out of the newest complete
step without the optimizer state, the loop or the data pipeline (orbax partial restore), so a
running job can be looked at from another process without knowing its optimizer.
"""

from __future__ import annotations

import logging
import os

import jax
import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

from animegamer_jax import parallel

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.checkpoint.store import abstract_component, array_restore_args

#: the orbax item of a training checkpoint holding the train state
STATE_ITEM = "state"


def load_train_component(workdir: str, name: str, config: ml_collections.ConfigDict) -> tuple[nnx.Module, int]:
    """Component ``name`` (e.g. ``"vae"``) of the newest complete checkpoint in ``WORKDIR/checkpoints``,
    built from ``config`` the way training builds it (``models.registry``) and placed on this process's
    first device; returns ``(module, step)``.

    Raises:
      FileNotFoundError: no checkpoint folder or no complete checkpoint there. ValueError: the component
        in the checkpoint does not fit ``config`` (other widths or blocks): the message names the step and
        says to pass the run's own config and overrides.
    """
    root = paths.join(workdir if paths.is_url(workdir) else os.path.abspath(workdir), "checkpoints")
    if not fileio.isdir(root):
        raise FileNotFoundError(f"{root}: no training checkpoints (is {workdir} a train --workdir?)")
    mesh = parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1])
    graphdef, target, _ = abstract_component(name, config, mesh)
    pure = {0: {name: target.to_pure_dict()}}  # the model half of the (model, optimizer) pair
    mngr = ocp.CheckpointManager(paths.as_path(root), options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        step = mngr.latest_step()
        if step is None:
            raise FileNotFoundError(f"{root}: no complete training checkpoint yet")
        args = ocp.args.PyTreeRestore(item=pure, restore_args=array_restore_args(pure), partial_restore=True)
        try:
            out = mngr.restore(int(step), args=ocp.args.Composite(**{STATE_ITEM: args}))
        except (ValueError, KeyError, TypeError) as e:  # orbax: a tree or shape that is not this config's
            # orbax's failed reads also end as unretrieved asyncio tasks, each logged with its traceback
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise ValueError(f"{root} step {step} does not match this --config ({first} ...): pass the run's "
                             f"own config and overrides, e.g. --config.vae.block_out_channels=...") from None
    finally:
        mngr.close()
    state = jax.tree.map(lambda x: x, target)
    state.replace_by_pure_dict(out[STATE_ITEM][0][name])
    return nnx.merge(graphdef, state), int(step)
