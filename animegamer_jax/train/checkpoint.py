"""Training checkpoints: orbax ``CheckpointManager`` (async, keep N, atomic) of model + optimizer +
step + data-iterator state, restorable onto any mesh.

Layout of ``WORKDIR/checkpoints/<step>/``:
  ``state/``   the pure nested dict of ``nnx.state((model, optimizer))`` (params, LoRA factors,
               optimizer moments and counters), one orbax PyTree item, sharded as in memory;
  ``data/``    the Grain iterator state, one JSON file per process (``grain.checkpoint``);
  ``meta/``    JSON: step, last loss and the run fields a resume must match (phase, config name,
               steps, batch, grad accumulation, LR schedule, seed, dataset, batch settings;
               train/loop.py ``RUN_FIELDS``, train/pipeline.py ``run_meta``).
A step directory only appears once every item is written (orbax's atomic rename), so a run killed
mid-save resumes from the previous complete step. A preempted run's last checkpoint is an ordinary
one of this layout (train/loop.py ``fit``). Restore targets are abstract arrays carrying the
*current* mesh's shardings (from the logical annotations), so a checkpoint written on 8 devices
restores onto 1 and vice versa.
"""

from __future__ import annotations

from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from flax import nnx

from animegamer_jax import paths
from animegamer_jax.checkpoint import array_restore_args


def _pure(state: Any) -> Any:
    """The pure nested dict of an ``nnx.State`` (every Variable kind, RNG state included); other trees as they are."""
    return state.to_pure_dict() if isinstance(state, nnx.State) else state


def is_grain_iterator(it: Any) -> bool:
    """Whether :meth:`CheckpointManager.save` can store ``it``'s position (a Grain dataset / loader iterator)."""
    return isinstance(it, (grain.DatasetIterator, grain.DataLoaderIterator))


class _OrbaxManager(ocp.CheckpointManager):
    """``ocp.CheckpointManager`` that leaves jax's preemption service to the train loop.

    orbax's ``save`` (and ``should_save``) call ``multihost_utils.reached_preemption_sync_point(step)``
    with the checkpoint step; the service compares each process's latest count, so those calls would
    move it away from the count the loop's ``parallel.distributed.PreemptionGuard`` keeps (a stop
    agreed during a save could then land on a count the loop never passes). The loop asks the service
    itself and saves with ``force=True``.
    """

    def reached_preemption(self, step: int) -> bool:
        return False


class CheckpointManager:
    """Thin wrapper of ``ocp.CheckpointManager`` with the items above.

    Args:
      directory: checkpoint root (``WORKDIR/checkpoints``; a local path or a URL such as
        ``gs://bucket/run/checkpoints``); created.
      max_to_keep: newest checkpoints kept (older ones deleted after a successful save).
      async_save: write in a background thread (``wait()`` blocks until written).
    """

    def __init__(self, directory: str, max_to_keep: int = 3, async_save: bool = True):
        path = paths.as_path(directory)
        self.directory = str(path)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save)
        self._mngr = _OrbaxManager(path, options=options)

    def latest_step(self) -> int | None:
        """Newest complete checkpoint step, or None."""
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        """Every complete checkpoint step, oldest first."""
        return list(self._mngr.all_steps())

    def save(self, step: int, state: nnx.State, data_iterator: Any = None, meta: dict | None = None,
             *, force: bool = False) -> bool:
        """Starts saving ``state`` (and the iterator state, positioned at the next batch) at ``step``.

        Every process must call this. Returns whether a save was started.
        """
        items = {"state": ocp.args.PyTreeSave(_pure(state)),
                 "meta": ocp.args.JsonSave(dict(meta or {}, step=int(step)))}
        if data_iterator is not None:
            items["data"] = _iterator_save_args(data_iterator)
        return self._mngr.save(int(step), args=ocp.args.Composite(**items), force=force)

    def restore(self, step: int, abstract_state: nnx.State, data_iterator: Any = None) -> tuple[nnx.State, dict]:
        """Restores ``(state, meta)`` at ``step`` into ``abstract_state``'s shapes, dtypes and shardings.

        Args:
          step: a step from :meth:`all_steps`.
          abstract_state: ``nnx.State`` whose leaves are ``jax.ShapeDtypeStruct`` with shardings
            (:meth:`animegamer_jax.train.loop.Trainer.abstract_state`).
          data_iterator: a fresh iterator of the identically built loader; its state is set in place.
        """
        target = _pure(abstract_state)
        items = {"state": ocp.args.PyTreeRestore(item=target, restore_args=array_restore_args(target)),
                 "meta": ocp.args.JsonRestore()}
        if data_iterator is not None:
            items["data"] = _iterator_restore_args(data_iterator)
        out = self._mngr.restore(int(step), args=ocp.args.Composite(**items))
        state = jax.tree.map(lambda x: x, abstract_state)
        state.replace_by_pure_dict(out["state"])
        return state, dict(out["meta"])

    def read_meta(self, step: int) -> dict:
        """The ``meta`` item of checkpoint ``step`` alone (no arrays read): what run wrote it."""
        out = self._mngr.restore(int(step), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def wait(self) -> None:
        """Blocks until pending async saves are on disk."""
        self._mngr.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves, then releases orbax's manager (its background threads)."""
        self._mngr.wait_until_finished()
        self._mngr.close()


def _iterator_save_args(it: Any) -> Any:
    if is_grain_iterator(it):
        return grain.checkpoint.CheckpointSave(it)
    raise TypeError(f"cannot checkpoint a data iterator of type {type(it).__name__}; use a grain iterator "
                    f"(grain.MapDataset / grain.DataLoader) or pass data_iterator=None")


def _iterator_restore_args(it: Any) -> Any:
    if is_grain_iterator(it):
        return grain.checkpoint.CheckpointRestore(it)
    raise TypeError(f"cannot restore a data iterator of type {type(it).__name__}")
