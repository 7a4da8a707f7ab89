"""Generic sharded, resumable training loop (knows no model; train/model.py's phase specs plug the models in).

:class:`Trainer` owns one jitted train step: ``(state, batch, step) -> (state, metrics)`` where
``state = nnx.state((model, nnx.Optimizer(model, tx, wrt=trainable)))``. Only the ``trainable``
filter's variables get gradients and optimizer moments; frozen weights pass through the step
unchanged (donated, so no copy). In/out shardings come from the logical annotations
(``parallel.param_shardings``), the batch is split over the data axes (``act_batch``), metrics are
replicated scalars. Parameters are born sharded (jitted init with ``out_shardings``).

:func:`fit` runs the step with orbax checkpoints (model + optimizer + step + Grain iterator state),
resumes from the newest intact one (a damaged newer one is kept aside:
``CheckpointManager.resume_step``), stops on a non-finite loss keeping the last good checkpoint, stops
early on SIGTERM / SIGINT at a step every process agrees on after saving a normal checkpoint there
(``parallel.distributed.PreemptionGuard``), and writes TensorBoard summaries (loss, lr, grad norm,
throughput, MFU) and a tqdm progress bar with ETA. Determinism: the step's PRNG key is ``fold_in(key(seed), step)``, so a resumed run draws the
same noise as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging as std_logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm

from animegamer_jax import parallel

from animegamer_jax.io import paths
from animegamer_jax.parallel import distributed
from animegamer_jax.checkpoint import training as ckpt_lib
from animegamer_jax.train import metrics as metrics_lib
from animegamer_jax.train import model_flops

#: a stage line (``status("compiling the train step ...")``): an INFO record of the logger
#: ``animegamer_jax.status``, which the commands print on stderr at their default verbosity (cli.STATUS_LOGGER)
status = std_logging.getLogger("animegamer_jax.status").info

LossFn = Callable[[nnx.Module, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]


class ResumeMismatchError(ValueError):
    """The workdir's checkpoint was written by a run with another phase, batch, schedule, config, seed,
    dataset or batch settings (:data:`RUN_FIELDS`)."""


#: fields of a run that a resume must agree on (checked against the newest checkpoint's meta): the
#: schedule, and what shapes the batches (seed, dataset, the phase's batch settings: a resume that
#: changed them would go on with another data stream than the one its checkpoint was trained on);
#: a dict-valued field (dataset, batch_settings) is compared key by key
RUN_FIELDS = ("phase", "config", "num_steps", "global_batch_size", "grad_accum_steps", "learning_rate",
              "warmup_steps", "end_lr_factor", "seed", "dataset", "batch_settings")


def check_resume(saved: Mapping[str, Any], run: Mapping[str, Any], where: str) -> list[str]:
    """Differences between the saved run fields and this run's, as ``"phase 'a1' -> 'a2'"`` strings
    (``"batch_settings.max_turns 5 -> 3"`` inside a dict-valued field).

    Only :data:`RUN_FIELDS`, and keys of dict-valued ones, present on both sides are compared (older
    checkpoints lack some; a field recorded later never refuses their resume).
    """
    diffs = []
    for k in RUN_FIELDS:
        if k not in saved or k not in run:
            continue
        a, b = saved[k], run[k]
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            diffs += [f"{k}.{j} {a[j]!r} -> {b[j]!r}" for j in a if j in b and a[j] != b[j]]
        elif a != b:
            diffs.append(f"{k} {a!r} -> {b!r}")
    return diffs


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or inf; the message names the step and the last good checkpoint."""


class Preempted(Exception):
    """Training stopped early on a stop every process agreed on (SIGTERM, SIGINT or jax's preemption
    notice; :class:`FitResult` ``preempted``); the message says what stopped it and what is saved.

    Attributes:
      reason: ``"SIGTERM"``, ``"SIGINT"``, or the notice that came from another process.
      phase: the phase that stopped ("" for a bare :func:`fit`).
      step: the step its checkpoint is saved at (0: stopped before its first step in this run).
      checkpoint_dir: its checkpoint directory.
    """

    def __init__(self, reason: str, phase: str, step: int, checkpoint_dir: str):
        self.reason, self.phase, self.step, self.checkpoint_dir = reason, phase, int(step), checkpoint_dir
        what = f"phase {phase}" if phase else "training"
        where = (f"{what} saved at step {self.step} in {checkpoint_dir}" if self.step
                 else f"{what} stopped before its first step in this run (nothing new to save)")
        super().__init__(f"stopped by {reason}: {where}")


def _abstract(x: Any, sharding: Any) -> Any:
    if isinstance(x, nnx.Variable):
        raw = x.get_raw_value()
        return x.replace(jax.ShapeDtypeStruct(raw.shape, raw.dtype, sharding=sharding))
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)


class Trainer:
    """One phase's jitted, sharded train step.

    Args:
      model_fn: builds the (possibly composite) model, e.g. ``lambda: PhaseModel(cfg, rngs=nnx.Rngs(0))``.
      loss_fn: ``loss_fn(model, batch, rng) -> (scalar loss, {name: scalar})``, traced inside jit;
        ``batch`` holds device arrays with a leading global-batch dimension.
      tx: optax transformation (``optim.make_optimizer``).
      trainable: NNX filter selecting trained variables (e.g. ``nnx.All(nnx.Param, lora_filter)``).
      mesh, rules: device mesh and logical axis rules.
      schedule: LR schedule, only for the ``lr`` metric (evaluated at the optimizer-update count).
      grad_accum_steps: micro-batches per optimizer update (the tx must be ``optax.MultiSteps``).
      seed: base of the per-step PRNG keys.
      compiler_options: XLA options for the init and step compiles, e.g.
        ``{"xla_backend_optimization_level": 0}`` (CPU: faster compiles, slower steps; tests).
    """

    def __init__(self, model_fn: Callable[[], nnx.Module], loss_fn: LossFn, tx: optax.GradientTransformation,
                 trainable: Any, mesh: Mesh, rules: parallel.mesh.LogicalRules = parallel.DEFAULT_RULES, *,
                 schedule: optax.Schedule | None = None, grad_accum_steps: int = 1, seed: int = 0,
                 compiler_options: dict[str, Any] | None = None):
        self.model_fn, self.loss_fn, self.tx, self.trainable = model_fn, loss_fn, tx, trainable
        self.mesh, self.rules = mesh, tuple(rules)
        self.schedule, self.grad_accum_steps, self.seed = schedule, int(grad_accum_steps), int(seed)
        self.compiler_options = dict(compiler_options or {}) or None

        def init_fn() -> tuple[nnx.Module, nnx.Optimizer]:
            model = model_fn()
            return model, nnx.Optimizer(model, tx, wrt=trainable)

        self._init_fn = init_fn
        with parallel.sharding_context(mesh, self.rules):
            abstract = nnx.eval_shape(init_fn)
        self.graphdef, abs_state = nnx.split(abstract)
        self.state_shardings = parallel.param_shardings(abs_state, mesh, self.rules)
        self._abstract_state = jax.tree.map(_abstract, abs_state, self.state_shardings,
                                            is_leaf=lambda x: isinstance(x, nnx.Variable))
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self._compiled: dict[Any, Any] = {}
        self._init_jit: Any = None
        self.flops_per_step: float | None = None  # model FLOPs per device of one micro-step (train/model_flops.py)

    # ---- state ----
    def abstract_state(self) -> nnx.State:
        """``nnx.State`` of ShapeDtypeStructs with the target shardings (orbax restore target)."""
        return self._abstract_state

    def init(self) -> nnx.State:
        """Fresh sharded train state (model init + zero optimizer state), every array born sharded."""
        with parallel.sharding_context(self.mesh, self.rules):
            if self._init_jit is None:
                jitted = jax.jit(lambda: nnx.state(self._init_fn()), out_shardings=self.state_shardings)
                self._init_jit = jitted.lower().compile(compiler_options=self.compiler_options)
            return self._init_jit()

    def split(self, state: nnx.State) -> tuple[nnx.Module, nnx.Optimizer]:
        """``(model, optimizer)`` views of a train state."""
        return nnx.merge(self.graphdef, state)

    def model_state(self, state: nnx.State) -> nnx.State:
        """The model part of a train state (index 0 of the ``(model, optimizer)`` pair)."""
        return state[0]

    def num_trainable(self) -> tuple[int, int]:
        """(trainable, total) parameter counts of the model."""
        model_state = self._abstract_state[0]
        total = sum(math.prod(x.shape) for x in jax.tree.leaves(model_state))
        trained = nnx.filter_state(model_state, self.trainable)
        return sum(math.prod(x.shape) for x in jax.tree.leaves(trained)), total

    # ---- batch placement ----
    def batch_shardings(self, batch: Any) -> Any:
        return jax.tree.map(
            lambda x: parallel.batch_sharding(self.mesh, np.ndim(x), self.rules) if np.ndim(x) else self.replicated,
            batch)

    def put_batch(self, batch: Mapping[str, Any]) -> Any:
        """Host batch -> global device arrays split over the data axes.

        One process: ``batch`` is the global batch. Several processes: each passes its local rows
        (global / process_count) and they are stitched with ``make_array_from_process_local_data``.

        Raises:
          parallel.ShardingConfigError: the global batch does not divide the data-parallel shards.
        """
        if jax.process_count() == 1:
            return parallel.shard_batch(batch, self.mesh, self.rules)
        n = jax.process_count()

        def put(x: Any) -> jax.Array:
            x = np.asarray(x)
            if x.ndim == 0:
                return jax.make_array_from_process_local_data(self.replicated, x)
            global_shape = (x.shape[0] * n,) + x.shape[1:]
            parallel.check_global_batch(global_shape[0], self.mesh, self.rules)
            return jax.make_array_from_process_local_data(
                parallel.batch_sharding(self.mesh, x.ndim, self.rules), x, global_shape)

        return jax.tree.map(put, batch)

    # ---- the step ----
    def _step_fn(self, state: nnx.State, batch: Any, step: jax.Array) -> tuple[nnx.State, dict]:
        model, opt = nnx.merge(self.graphdef, state)
        rng = jax.random.fold_in(jax.random.key(self.seed), step)

        def loss_of(m: nnx.Module) -> tuple[jax.Array, Mapping[str, jax.Array]]:
            return self.loss_fn(m, batch, rng)

        (loss, aux), grads = nnx.value_and_grad(loss_of, argnums=nnx.DiffState(0, self.trainable),
                                                has_aux=True)(model)
        grad_norm = optax.global_norm(grads)
        opt.update(model, grads)
        metrics = {"loss": loss.astype(jnp.float32), "grad_norm": grad_norm.astype(jnp.float32)}
        if self.schedule is not None:
            metrics["lr"] = jnp.asarray(self.schedule(step // self.grad_accum_steps), jnp.float32)
        metrics.update({k: jnp.asarray(v, jnp.float32) for k, v in aux.items()})
        return nnx.state((model, opt)), metrics

    def lower(self, state: Any, batch: Any, step: Any = None) -> Any:
        """``jax.jit(...).lower`` of the step on (possibly abstract) ``state`` and ``batch``."""
        step = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated) if step is None else step
        jitted = jax.jit(self._step_fn, in_shardings=(self.state_shardings, self.batch_shardings(batch),
                                                      self.replicated),
                         out_shardings=(self.state_shardings, self.replicated), donate_argnums=(0,))
        with parallel.sharding_context(self.mesh, self.rules):
            return jitted.lower(state, batch, step)

    def step(self, state: nnx.State, batch: Any, step: int) -> tuple[nnx.State, dict]:
        """Runs one micro-step (compiles on first use per batch shape). ``state`` is donated."""
        key = tuple((k, x.shape, x.dtype) for k, x in sorted(batch.items()))
        if key not in self._compiled:
            compiled = self.lower(self._abstract_state, batch).compile(compiler_options=self.compiler_options)
            self._compiled[key] = compiled
            abstract = {k: jax.ShapeDtypeStruct(x.shape, x.dtype) for k, x in batch.items()}
            counted = model_flops.train_flops(self.model_fn, self.loss_fn, self.trainable, abstract)
            self.flops_per_step = counted.model / self.mesh.size  # model FLOPs per device of one micro-step
        step_arr = jax.device_put(jnp.asarray(step, jnp.int32), self.replicated)
        with parallel.sharding_context(self.mesh, self.rules):
            return self._compiled[key](state, batch, step_arr)


@dataclasses.dataclass
class FitResult:
    """What :func:`fit` hands back: the final state, per-step losses and the steps it ran.

    ``preempted``: what stopped the run before ``num_steps`` (``"SIGTERM"``, ``"SIGINT"``, a notice from
    another process), with a checkpoint at ``end_step``; "" when it ran to its end (or ``stop_after``).
    """

    state: nnx.State
    losses: dict[int, float]
    start_step: int
    end_step: int
    checkpoint_dir: str
    preempted: str = ""


def fit(
    trainer: Trainer,
    data: Iterator[Mapping[str, Any]],
    *,
    num_steps: int,
    workdir: str,
    global_batch_size: int,
    checkpoint_every: int = 1000,
    keep_checkpoints: int = 3,
    async_checkpoint: bool = True,
    log_every: int = 50,
    batch_fn: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    init_state: Callable[[], nnx.State] | None = None,
    meta: Mapping[str, Any] | None = None,
    stop_after: int | None = None,
    progress: bool = True,
    peak_tflops_per_device: float = 0.0,
    hooks: tuple[Callable[[int, nnx.State, Any], None], ...] = (),
    allow_resume_mismatch: bool = False,
    resume_step: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> FitResult:
    """Trains ``num_steps`` micro-steps, resuming from ``WORKDIR/checkpoints`` when it holds one.

    SIGTERM and SIGINT (and jax.distributed's preemption notice) stop the run at a step boundary that
    every process agrees on (``parallel.distributed.preemption_guard``; the command's guard when one is
    active, else one for this call): the checkpoint of that step is saved like a periodic one (model,
    optimizer, data-iterator position, meta), so resuming gives the losses of an uninterrupted run, and
    the result says ``preempted``. A stop agreed before the first step saves nothing (nothing new).

    Args:
      trainer: the phase's :class:`Trainer`.
      data: an endless iterator of host batches (process-local rows); a Grain iterator is
        checkpointed and restored with the model.
      num_steps: total micro-steps (optimizer updates x grad_accum_steps).
      workdir: run directory (``checkpoints/``, ``tensorboard/``).
      global_batch_size: examples per micro-step across all processes; checked against the mesh
        before anything is compiled.
      checkpoint_every: save every N steps (and at the end).
      log_every: write averaged metrics every N steps, with the window's ``steps_per_second``,
        ``examples_per_second``, ``mfu`` and the shares of its wall time (first step, which compiles,
        left out) spent outside the step: ``data_wait_share`` (the next batch: the loader's iterator,
        ``batch_fn``, the host-to-device put) and ``checkpoint_wait_share`` (blocked in a save: with
        ``async_checkpoint`` only the device-to-host copy).
      batch_fn: host-side transform of each batch (e.g. dropping string fields); one with a ``step``
        parameter is called as ``batch_fn(batch, step=step)`` (0-based step of the batch, e.g. a size
        curriculum or per-step random crops that a resumed run must repeat).
      init_state: builds the fresh state when there is no checkpoint (default ``trainer.init``).
      meta: JSON-able fields saved with every checkpoint.
      stop_after: return after this step (a simulated kill; the checkpoint at it is written).
      hooks: ``hook(step, state, device_batch)`` called after every step (e.g. periodic sample videos).
      allow_resume_mismatch: resume even when the checkpoint's run fields (:data:`RUN_FIELDS`:
        ``meta`` (JSON-able) plus ``num_steps``, ``global_batch_size``, grad accumulation) differ from this
        run's; the differences are logged (``--config.train.allow_resume_mismatch=True``).
      resume_step: the checkpoint step to resume from; None or negative: the newest intact one
        (``CheckpointManager.resume_step``: a damaged newer step is named in one line on stderr and
        kept aside as ``<step>.damaged-<n>``; a step without an integrity record is restored unverified).
      clock: seconds, monotonic (``time.perf_counter``); the log's rates and shares read it.

    Returns:
      :class:`FitResult`.

    Raises:
      parallel.ShardingConfigError: ``global_batch_size`` does not divide the data axes.
      NonFiniteLossError: NaN/inf loss; no checkpoint is written for that step, so the newest
        checkpoint on disk is the last good one.
      ResumeMismatchError: the workdir's checkpoint comes from a run with another phase, config,
        step count, batch, learning-rate schedule, seed, dataset or batch settings (one line naming
        each difference), unless
        ``allow_resume_mismatch``; nothing is restored or written then.
      checkpoint.CheckpointResumeError: every checkpoint step is damaged, or ``resume_step`` is missing
        or damaged (one line listing the steps; nothing moved, restored or written).
    """
    parallel.check_global_batch(global_batch_size, trainer.mesh, trainer.rules)
    ckpt_dir = str(paths.as_path(paths.join(workdir, "checkpoints")))  # absolute, as messages and FitResult show it
    mngr = ckpt_lib.CheckpointManager(ckpt_dir, max_to_keep=keep_checkpoints, async_save=async_checkpoint)
    checkpointable = ckpt_lib.is_grain_iterator(data)
    writer = metrics_lib.SummaryWriter(paths.join(workdir, "tensorboard"))
    losses: dict[int, float] = {}
    preempted = ""
    stack = contextlib.ExitStack()
    # as the checkpoint's JSON meta stores it (tuples become lists), so that a resume compares like with like
    run = json.loads(json.dumps(dict(meta or {}, num_steps=int(num_steps), global_batch_size=int(global_batch_size),
                                     grad_accum_steps=int(trainer.grad_accum_steps))))
    try:
        guard = stack.enter_context(distributed.preemption_guard())  # closed in finally, handlers put back
        latest = mngr.resume_step(resume_step)
        if latest is not None:
            diffs = check_resume(mngr.read_meta(latest), run, ckpt_dir)
            if diffs and not allow_resume_mismatch:
                raise ResumeMismatchError(
                    f"{ckpt_dir} (step {latest}) was written by another run: {'; '.join(diffs)} (saved -> now). "
                    f"Fix: use a new --workdir for a new run, or resume it anyway with "
                    f"--config.train.allow_resume_mismatch=True")
            if diffs:
                logging.warning("resuming %s despite: %s", ckpt_dir, "; ".join(diffs))
            state, _ = mngr.restore(latest, trainer.abstract_state(), data if checkpointable else None)
            start = int(latest)
            status("resumed from %s at step %d", ckpt_dir, start)
        else:
            status("initializing parameters and optimizer state (compiling the init) ...")
            t0 = time.perf_counter()
            state = (init_state or trainer.init)()
            status("initialized in %.1f s", time.perf_counter() - t0)
            start = 0
        end = num_steps if stop_after is None else min(num_steps, int(stop_after))
        if start < end and guard.stop_agreed():  # before compiling the step: nothing new to save
            preempted, end = guard.reason, start
        averager = metrics_lib.MetricAverager()
        peak = metrics_lib.peak_flops_per_device(peak_tflops_per_device, trainer.mesh.devices.flat[0])
        bar = None  # created after the first step, so the stage lines above it stay readable
        t_last, steps_since = None, 0
        waited = {"data": 0.0, "checkpoint": 0.0}  # seconds of this log window spent outside the step
        takes_step = batch_fn is not None and "step" in inspect.signature(batch_fn).parameters
        for step in range(start, end):
            t_data = clock()
            batch = next(data)
            if batch_fn is not None:
                batch = batch_fn(batch, step=step) if takes_step else batch_fn(batch)
            batch = trainer.put_batch(batch)
            waited["data"] += clock() - t_data
            first = step == start
            if first:
                status("compiling the train step (XLA; minutes at full size) ...")
                t_compile = time.perf_counter()
            state, m = trainer.step(state, batch, step)
            m = jax.device_get(m)
            if first:
                status("compiled and ran step %d in %.1f s; training", step + 1, time.perf_counter() - t_compile)
                bar = _progress(progress, num_steps, start)
            loss = float(m["loss"])
            if not math.isfinite(loss):
                mngr.wait()
                raise NonFiniteLossError(
                    f"loss is {loss} at step {step + 1}; stopped without saving it. The last good "
                    f"checkpoint is step {mngr.latest_step()} in {ckpt_dir}; restart resumes from it "
                    f"(lower train.learning_rate or check the data).")
            losses[step + 1] = loss
            notice = guard.take_notice()
            if notice:
                status("%s received: saving a checkpoint at the next step every process agrees on, then "
                       "stopping (a second Ctrl-C stops without saving)", notice)
            stop = step + 1 < end and guard.stop_agreed()
            averager.update(m)
            now = clock()
            if t_last is None:  # the first step of a run includes compilation
                t_last, steps_since = now, 0
                waited = dict.fromkeys(waited, 0.0)
            else:
                steps_since += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
            if (step + 1) % log_every == 0 or step + 1 == end or stop:
                scalars = averager.compute_and_reset()
                if steps_since:
                    dt = (now - t_last) / steps_since
                    scalars["steps_per_second"] = 1.0 / dt
                    scalars["examples_per_second"] = global_batch_size / dt
                    if trainer.flops_per_step and peak:
                        scalars["mfu"] = trainer.flops_per_step / (dt * peak)
                    window = now - t_last
                    if window > 0:
                        scalars["data_wait_share"] = waited["data"] / window
                        scalars["checkpoint_wait_share"] = waited["checkpoint"] / window
                    t_last, steps_since = now, 0
                    waited = dict.fromkeys(waited, 0.0)
                writer.write_scalars(step + 1, scalars)
                logging.info("step %d: %s", step + 1, ", ".join(f"{k}={v:.4g}" for k, v in sorted(scalars.items())))
            for hook in hooks:
                hook(step + 1, state, batch)
            if (step + 1) % checkpoint_every == 0 or step + 1 == end or stop:
                t_save = clock()
                mngr.save(step + 1, state, data if checkpointable else None,
                          dict(run, loss=loss), force=True)
                waited["checkpoint"] += clock() - t_save
            if stop:
                preempted, end = guard.reason, step + 1
                break
        if bar is not None:
            bar.close()
        mngr.wait()
        return FitResult(state=state, losses=losses, start_step=start, end_step=end, checkpoint_dir=ckpt_dir,
                         preempted=preempted)
    finally:
        try:
            mngr.close()  # waits for a pending save with the signal handlers still in place
            writer.close()
        finally:
            stack.close()


def _progress(enabled: bool, total: int, initial: int) -> Any:
    if not enabled or jax.process_index() != 0:
        return None
    return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)
