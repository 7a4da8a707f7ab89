"""Training checkpoints: orbax ``CheckpointManager`` (async, keep N, atomic) of model + optimizer +
step + data-iterator state, restorable onto any mesh.

Layout of ``WORKDIR/checkpoints/<step>/``:
  ``state/``   the pure nested dict of ``nnx.state((model, optimizer))`` (params, LoRA factors,
               optimizer moments and counters), one orbax PyTree item, sharded as in memory;
  ``data/``    the Grain iterator state, one JSON file per process (``grain.checkpoint``);
  ``meta/``    JSON: step, last loss and the run fields a resume must match (phase, config name,
               steps, batch, grad accumulation, LR schedule, seed, dataset, batch settings;
               train/loop.py ``RUN_FIELDS``, train/pipeline.py ``run_meta``);
  ``integrity.json``  every file's size and sha256 (``checkpoint.integrity``, the system checkpoint's
               record), except orbax's ``_CHECKPOINT_METADATA`` and ``commit_success.txt``, which
               orbax writes after it.
A step directory only appears once every item is written (orbax's atomic rename), so a run killed
mid-save resumes from the previous complete step. A preempted run's last checkpoint is an ordinary
one of this layout (train/loop.py ``fit``). Restore targets are abstract arrays carrying the
*current* mesh's shardings (from the logical annotations), so a checkpoint written on 8 devices
restores onto 1 and vice versa.

Integrity (:func:`_integrity_path_class`): ``integrity.json`` is written inside orbax's commit, by the
step's temporary path's ``finalize``, just before the rename of ``<step>.orbax-checkpoint-tmp-*`` to
``<step>`` (local disks) or the ``commit_success.txt`` marker (gs://): a step folder at its final path
always has its record, and a kill while hashing leaves only a temp folder. orbax runs that ``finalize``
on process 0 only, after the barrier at which every process has written its shards (in the background
thread for async saves), so process 0 hashes every process's files once and writes the one record:
no merge of per-process records, and no file is written after it but orbax's two above. The cost is
one streamed read of the whole checkpoint on process 0 per save (sha256 at roughly 0.5-1 GB/s on one
core: seconds at tiny size, minutes for a 7B model with its optimizer state), off the training thread
when saves are async. Before a resume, :meth:`CheckpointManager.resume_step` checks the chosen step
(sizes, small files hashed, large ones by sampled blocks: ``verify_checkpoint``'s fast mode); a
damaged step is renamed ``<step>.damaged-<n>`` (kept, never deleted; orbax lists only folders named
by a bare step number, so neither ``latest_step`` nor ``max_to_keep`` sees it again, and a later save
of that step does not collide) and the newest intact step is used. Steps written before this record
existed have no ``integrity.json``; they are restored unverified.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.checkpoint import (INTEGRITY_FILE, CheckpointIntegrityError, array_restore_args, verify_checkpoint,
                                       write_integrity)

#: files of a step folder that orbax writes after the integrity record (left out of it)
ORBAX_LATE_FILES = ("_CHECKPOINT_METADATA", ocp.path.atomicity.COMMIT_SUCCESS_FILE)
#: ``<step>.damaged-<n>``: a damaged step kept aside; ``<step>.skipped-<n>``: a step newer than an
#: explicit ``resume_step``, kept aside so that the resumed run's saves do not meet it
DAMAGED, SKIPPED = "damaged", "skipped"


class CheckpointResumeError(ValueError):
    """No intact checkpoint to resume from, or a ``resume_step`` that is missing or damaged (one line
    naming the steps there and the fix; nothing is moved or deleted)."""


def _integrity_path_class(root: str) -> type:
    """orbax's default temporary-path class for ``root`` (atomic rename locally, a commit file on
    gs://), whose ``finalize`` of a step folder (a direct child of ``root``; not the items inside it,
    which use the same class) first writes the step's ``integrity.json`` (module doc)."""
    base = ocp.path.atomicity_defaults.get_default_temporary_path_class(paths.as_path(root))
    root_key = os.fspath(paths.as_path(root)).rstrip("/")

    async def finalize(self: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(self.get_final().parent).rstrip("/") == root_key:
            await asyncio.to_thread(write_integrity, os.fspath(self.get()), ORBAX_LATE_FILES)
        await base.finalize(self, *args, **kwargs)

    return type(f"Integrity{base.__name__}", (base,), {"finalize": finalize, "__module__": __name__})


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
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save,
            temporary_path_class=_integrity_path_class(self.directory))
        self._mngr = _OrbaxManager(path, options=options)

    def step_dir(self, step: int) -> str:
        """The folder of checkpoint ``step``."""
        return paths.join(self.directory, str(int(step)))

    def check_step(self, step: int) -> bool:
        """Checks checkpoint ``step``'s files against its ``integrity.json`` (sizes; files up to 8 MiB
        hashed whole, larger ones by sampled blocks).

        Returns:
          True when checked; False when the step has no ``integrity.json`` (written before training
          checkpoints carried one): unverified.

        Raises:
          CheckpointIntegrityError: a file missing, truncated or damaged, or a damaged record; the
            message names the file and what is wrong, and no fix.
        """
        d = self.step_dir(step)
        if not fileio.isfile(paths.join(d, INTEGRITY_FILE)):
            return False
        verify_checkpoint(d, "fast", fix="")
        return True

    def resume_step(self, requested: int | None = None, log: Callable[[str], None] | None = None) -> int | None:
        """The step to resume from, checked; damaged newer steps are kept aside first.

        ``requested`` None (or negative): the newest step that is intact (or has no record: restored
        unverified, with a note); every newer damaged step gets one line (which file, what is wrong,
        where it is kept) and is renamed ``<step>.damaged-<n>``. ``requested`` N: step N, which must
        exist and be intact; steps newer than N are renamed ``<step>.skipped-<n>`` (one line), so the
        resumed run's saves and later resumes do not meet them.

        Every process checks (reads only); process 0 renames, between barriers, and every process
        reloads orbax's list of steps. Lines go to ``log`` (default: stderr on process 0).

        Returns:
          The step, or None when there is no checkpoint and none was requested (a fresh start).

        Raises:
          CheckpointResumeError: every step is damaged, or ``requested`` is missing or damaged; one
            line listing the steps and the fix, and nothing is renamed.
        """
        log = log or _stderr_line
        steps = sorted(self.all_steps())
        listed = ", ".join(map(str, steps)) or "none"
        if requested is not None and int(requested) >= 0:
            step = int(requested)
            if step not in steps:
                raise CheckpointResumeError(
                    f"resume_step {step}: no checkpoint {step} in {self.directory} (steps there: {listed}). "
                    f"Fix: pass one of them as --config.train.resume_step, or -1 for the newest intact one")
            try:
                verified = self.check_step(step)
            except CheckpointIntegrityError as e:
                raise CheckpointResumeError(
                    f"resume_step {step}: checkpoint {self.step_dir(step)} is damaged: {self._problem(e, step)} "
                    f"(steps there: {listed}). Fix: pass another step as --config.train.resume_step, or -1 for "
                    f"the newest intact one") from None
            newer = [s for s in steps if s > step]
            moved = self._set_aside(newer, SKIPPED)
            if newer:
                log(f"resume_step {step}: newer checkpoint(s) {', '.join(map(str, newer))} kept aside as "
                    f"{', '.join(moved)} (restore one by renaming it back)")
            if not verified:
                log(_unverified(self.step_dir(step)))
            return step
        damaged: list[tuple[int, str]] = []
        for step in reversed(steps):
            try:
                verified = self.check_step(step)
            except CheckpointIntegrityError as e:
                damaged.append((step, self._problem(e, step)))
                continue
            for (s, why), moved in zip(damaged, self._set_aside([s for s, _ in damaged], DAMAGED)):
                log(f"checkpoint {self.step_dir(s)} is damaged: {why}; kept aside as {moved}; resuming from "
                    f"step {step}")
            if not verified:
                log(_unverified(self.step_dir(step)))
            return step
        if not steps:
            return None
        raise CheckpointResumeError(
            f"no intact checkpoint in {self.directory}: "
            + "; ".join(f"step {s}: {why}" for s, why in damaged)
            + ". Nothing was moved or deleted. Fix: start fresh with a new --workdir, or pass "
              "--config.train.resume_step=N to name a step (after putting its files back)")

    def _problem(self, e: CheckpointIntegrityError, step: int) -> str:
        """The integrity message without its leading step folder: ``"file X is truncated (...)"``."""
        msg, d = str(e).rstrip(". "), self.step_dir(step)
        if msg.startswith(d + ": "):
            return msg[len(d) + 2:]
        return "file " + msg[len(d) + 1:] if msg.startswith(d + "/") else msg

    def _set_aside(self, steps: list[int], why: str) -> list[str]:
        """Renames each step folder to ``<step>.<why>-<n>`` (n: the first unused, from 1) on process 0,
        between barriers, then reloads orbax's list of steps; returns the new folders."""
        if not steps:
            return []
        names = set(fileio.listdir(self.directory))
        moved = []
        for step in steps:
            n = 1
            while f"{step}.{why}-{n}" in names:
                n += 1
            names.add(f"{step}.{why}-{n}")
            moved.append(paths.join(self.directory, f"{step}.{why}-{n}"))
        many = jax.process_count() > 1
        if many:
            multihost_utils.sync_global_processes("animegamer_train_ckpt_aside:before")
        if jax.process_index() == 0:
            for step, dst in zip(steps, moved):
                fileio.rename(self.step_dir(step), dst)
        if many:
            multihost_utils.sync_global_processes("animegamer_train_ckpt_aside:after")
            fileio.forget_listings(self.directory)  # process 0's renames, on an object store
        self._mngr.reload()
        return moved

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

        Raises:
          CheckpointResumeError: a step without ``integrity.json`` (saved before training checkpoints
            carried one) failed to restore: one line naming it, the error and an older step to use.
        """
        target = _pure(abstract_state)
        items = {"state": ocp.args.PyTreeRestore(item=target, restore_args=array_restore_args(target)),
                 "meta": ocp.args.JsonRestore()}
        if data_iterator is not None:
            items["data"] = _iterator_restore_args(data_iterator)
        try:
            out = self._mngr.restore(int(step), args=ocp.args.Composite(**items))
        except Exception as e:  # orbax / tensorstore / grain raise many kinds for a damaged file
            if fileio.isfile(paths.join(self.step_dir(step), INTEGRITY_FILE)):
                raise  # verified intact: not a damaged file, a real error
            older = [s for s in self.all_steps() if s < int(step)]
            fix = (f"resume from an older step with --config.train.resume_step={older[-1]} (steps here: "
                   f"{', '.join(map(str, self.all_steps()))})" if older else "start again in a new --workdir")
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise CheckpointResumeError(
                f"checkpoint {self.step_dir(step)} (saved without {INTEGRITY_FILE}, so unverified) could not be "
                f"restored, it may be damaged: {type(e).__name__}: {first}. Fix: {fix}") from e
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


def _stderr_line(line: str) -> None:
    if jax.process_index() == 0:
        print(line, file=sys.stderr, flush=True)


def _unverified(step_dir: str) -> str:
    return (f"note: checkpoint {step_dir} has no {INTEGRITY_FILE} (saved before training checkpoints carried "
            f"one): restoring it unverified")


def _iterator_save_args(it: Any) -> Any:
    if is_grain_iterator(it):
        return grain.checkpoint.CheckpointSave(it)
    raise TypeError(f"cannot checkpoint a data iterator of type {type(it).__name__}; use a grain iterator "
                    f"(grain.MapDataset / grain.DataLoader) or pass data_iterator=None")


def _iterator_restore_args(it: Any) -> Any:
    if is_grain_iterator(it):
        return grain.checkpoint.CheckpointRestore(it)
    raise TypeError(f"cannot restore a data iterator of type {type(it).__name__}")
