"""Running training phases end to end: data -> sharded loop -> system checkpoint.

``run_phase(config, workdir)`` trains ``config.train.phase`` from the prepared dataset
(``config.data.dataset_dir``), starting from the system checkpoint ``config.train.init_checkpoint``
(converted weights or the previous phase) and resuming from ``WORKDIR/checkpoints`` when present.
At the end it writes a *system checkpoint* (``animegamer_jax.checkpoint`` layout) holding every
component of the phase's model plus the components of the init checkpoint it did not hold, so the
output of each phase is a complete system for the next one (and for the game engine).

``run_all(config, workdir)`` chains ``config.train.pipeline`` (a1 -> a2 -> b -> c; configs/tiny.py
first trains its VAE, phase "vae") in ``WORKDIR/<phase>/`` and leaves the final
system in ``config.train.system_checkpoint`` (default ``WORKDIR/system``). A phase whose system
checkpoint exists is skipped, so a killed pipeline resumes where it stopped.

SIGTERM / SIGINT (``parallel.distributed.PreemptionGuard``): a phase stops at a step every process
agrees on with its checkpoint saved (``loop.fit``), or the pipeline stops before its next phase; both
raise :class:`loop.Preempted`, and the same command resumes in that phase.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import jax
import ml_collections
from flax import nnx

from animegamer_jax import checkpoint, parallel

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.data import datasets, loader
from animegamer_jax.parallel import distributed
from animegamer_jax.train import loop, losses, optim, phases
from animegamer_jax.train.loop import status
from animegamer_jax.data.batches import REFERENCE, BatchBuilder, mined_reference_frames
from animegamer_jax.train.model import phase_trainer, training_config
from animegamer_jax.train.samples import sample_hook


def _loader_kwargs(config: ml_collections.ConfigDict, phase: str, local_batch: int) -> dict[str, Any]:
    mode = phases.phase(phase).batch.loader
    return dict(mode=mode, batch_size=local_batch, **({"include_frames": True} if mode == "turns" else {}))


def make_data(config: ml_collections.ConfigDict, phase: str, local_batch: int):
    """Endless, checkpointable Grain iterator over the prepared dataset for ``phase``
    (``config.data.dataset_dir``; phase "vae": ``config.train.vae_dataset_dir`` when set)."""
    dataset_dir = phase_dataset_dir(config, phase)
    if dataset_dir != str(config.data.dataset_dir):
        config = copy.deepcopy(config)
        config.data.dataset_dir = dataset_dir
    return iter(loader.make_loader_from_config(config, **_loader_kwargs(config, phase, local_batch)))


def phase_dataset_dir(config: ml_collections.ConfigDict, phase: str) -> str:
    """The prepared dataset ``phase`` reads: ``config.data.dataset_dir``, or the ``config.train`` field
    its batch kind's ``dataset_key`` names when set (phase "vae": ``train.vae_dataset_dir``; as given: a
    path or a URL)."""
    key = phases.phase(phase).batch.dataset_key
    if key and str(config.train.get(key, "")):
        return str(config.train[key])
    return str(config.data.dataset_dir)


def run_meta(config: ml_collections.ConfigDict, phase: str, dataset: bool = True) -> dict[str, Any]:
    """The run fields :func:`run_phase` records with every checkpoint of ``phase`` and a resume must
    agree on (``loop.RUN_FIELDS``; ``loop.fit`` adds step count, batch size and grad accumulation):

    * ``phase``, ``config`` (its name), ``learning_rate``, ``warmup_steps``, ``end_lr_factor``, ``seed``;
    * ``batch_settings``: the phase's settings of the host batches that its data stream and crops
      depend on (its record's ``run_settings``: VAE: ``train.vae_curriculum``, ``vae_windows_per_clip``,
      ``vae_max_crop_scale``; b / c: ``data.max_turns``, ``mllm.history_window``; d: the distilled
      scales and grid). Not the padding length
      (``train.max_seq_len``: raising it to fit a longer sequence may resume), nor the model's own
      settings (a changed shape fails the restore itself);
    * ``dataset`` (``dataset=True``, when the phase reads its prepared dataset rather than data the
      caller gives): ``content``, :func:`datasets.dataset_fingerprint` of :func:`phase_dataset_dir`'s
      index (a moved or copied dataset resumes; one prepared again from other films or labels does
      not), and ``shuffle_seed`` (``data.shuffle_seed``, the loader's order).

    Raises:
      datasets.DatasetError: ``dataset`` and no prepared dataset at :func:`phase_dataset_dir`.
    """
    t = config.train
    settings = phases.phase(phase).run_settings(config)
    meta = {"phase": phase, "config": str(config.name), "learning_rate": float(optim.phase_lr_and_steps(t)[0]),
            "warmup_steps": int(t.warmup_steps), "end_lr_factor": float(t.end_lr_factor), "seed": int(config.seed),
            "batch_settings": settings}
    if dataset:
        meta["dataset"] = {"content": datasets.dataset_fingerprint(datasets.read_index(phase_dataset_dir(config, phase), str(config.data.get("split", "train")))),
                           "shuffle_seed": int(config.data.get("shuffle_seed", 0))}
    return meta


def load_init_components(trainer: loop.Trainer, state: nnx.State, directory: str,
                         config: ml_collections.ConfigDict) -> nnx.State:
    """Overwrites the train state's components with those present in the system checkpoint ``directory``
    (restored straight onto the trainer's mesh; the optimizer state stays fresh)."""
    model, opt = trainer.split(state)
    held = checkpoint.read_manifest(directory)["components"]
    names = [n for n in model.component_names if n in held]
    if names:
        comps = checkpoint.load_system(directory, training_config(config), trainer.mesh,
                                              names=names, rules=trainer.rules)
        for n, m in comps.items():
            nnx.update(getattr(model, n), nnx.state(m))
    if "student" in model.component_names and "student" not in held and "dit" in names:
        # phase d's student starts as the teacher (its guidance_embed stays zero: an exact copy)
        teacher = nnx.state(model.dit, nnx.Param).to_pure_dict()
        student = nnx.state(model.student, nnx.Param)
        pure = student.to_pure_dict()
        # copies: the step donates its state, and one buffer may not be donated twice
        pure.update({k: jax.tree.map(lambda x: x.copy(), v) for k, v in teacher.items() if k in pure})
        student.replace_by_pure_dict(pure)
        nnx.update(model.student, student)
        names = names + ["student (= dit)"]
    status("initialized %s from %s", names, directory)
    return nnx.state((model, opt))


def write_system(trainer: loop.Trainer, state: nnx.State, config: ml_collections.ConfigDict, out_dir: str,
                 init_checkpoint: str = "") -> str:
    """System checkpoint of the trained model's components (+ the init checkpoint's other components)."""
    out_dir = str(paths.as_path(out_dir))
    if (fileio.exists(out_dir) and any(paths.as_path(out_dir).iterdir())
            and not fileio.exists(paths.join(out_dir, "manifest", "metadata"))):
        # a user's files are never replaced: only a system checkpoint of ours (it has a manifest)
        raise FileExistsError(f"{out_dir} exists and is not a system checkpoint (no manifest/metadata); "
                              f"it is left untouched. Fix: move it away or point "
                              f"--config.train.system_checkpoint elsewhere")
    model, _ = trainer.split(state)
    comps: dict[str, Any] = {n: getattr(model, n) for n in model.component_names}
    if init_checkpoint:
        held = checkpoint.read_manifest(init_checkpoint)["components"]
        rest = [n for n in held if n not in comps]
        changed = phases.phase(str(config.train.phase)).outputs
        if "student" in rest and "dit" in comps and "dit" in changed:  # distilled from a teacher this phase changed
            rest.remove("student")
            status("the init checkpoint's few-step student is left out (its teacher DiT is this phase's); "
                   "train phase d again for one")
        if "reference" in rest and "dit" in comps and "dit" in changed:  # trained against the old DiT
            rest.remove("reference")
            status("the init checkpoint's reference adapter is left out (trained against the DiT this phase "
                   "changed); train phase r again for one")
        if rest:
            comps.update(checkpoint.load_system(init_checkpoint, training_config(config),
                                                       trainer.mesh, names=rest, rules=trainer.rules))
    if paths.is_url(out_dir):
        # No rename on object stores: the folder is written in place, integrity.json last
        # (checkpoint.is_complete / verify_checkpoint trust nothing before it).
        checkpoint.save_system(out_dir, comps, config, force=True)
        return out_dir
    tmp = out_dir.rstrip("/") + ".tmp"
    if fileio.exists(tmp) and jax.process_index() == 0:
        fileio.rmtree(tmp)
    checkpoint.save_system(tmp, comps, config, force=True)
    if jax.process_index() == 0:
        fileio.rmtree(out_dir)
        fileio.rename(tmp, out_dir)
    return out_dir


def run_phase(config: ml_collections.ConfigDict, workdir: str, *, system_out: str = "",
              data: Any = None, compiler_options: dict | None = None, stop_after: int | None = None) -> str:
    """Trains ``config.train.phase``; returns the system checkpoint directory it wrote.

    ``workdir`` and every output path may be URLs (``gs://bucket/run``). ``data`` replaces the
    dataset loader (an iterator of host batches); ``stop_after`` returns after that micro-step
    with its checkpoint written and no system checkpoint (returns ``""``), as a kill would.

    Raises:
      loop.Preempted: SIGTERM / SIGINT stopped the phase (its checkpoint at the agreed step saved;
        the same call resumes it).
      parallel.ShardingConfigError: the micro-batch does not divide the mesh's data axes (before
        anything compiles); ValueError: ``global_batch_size`` not a multiple of ``grad_accum_steps``
        x process count; loop.ResumeMismatchError: ``workdir``'s checkpoint is of another run
        (:func:`run_meta`), unless ``train.allow_resume_mismatch``; datasets.DatasetError: no prepared
        dataset (``data`` not given).
    """
    phase = str(config.train.phase)
    rec = phases.phase(phase)
    init_ckpt = str(config.train.init_checkpoint)
    if init_ckpt and "vae" not in rec.outputs and "vae" in checkpoint.read_manifest(init_ckpt)["components"]:
        # the VAE's latent scale travels with its weights (the phase training the VAE sets it)
        config = copy.deepcopy(config)
        config.vae.scaling_factor = float(checkpoint.load_config(init_ckpt).vae.scaling_factor)
    t = config.train
    workdir = str(paths.as_path(workdir))
    mesh, rules = parallel.mesh_from_config(config), parallel.rules_from_config(config)
    accum = int(t.grad_accum_steps)
    if int(t.global_batch_size) % (accum * jax.process_count()):
        raise ValueError(f"train.global_batch_size {t.global_batch_size} is not a multiple of grad_accum_steps "
                         f"{accum} x {jax.process_count()} processes")
    micro = int(t.global_batch_size) // accum
    parallel.check_global_batch(micro, mesh, rules)
    _, steps = optim.phase_lr_and_steps(t)
    trainer = phase_trainer(config, mesh, rules, compiler_options=compiler_options)
    components = rec.components_for(config)
    trained, total = trainer.num_trainable()
    status("phase %s: %s, %d / %d parameters trained, mesh %s", phase, components, trained, total,
                 dict(mesh.shape))

    def init_state() -> nnx.State:
        state = trainer.init()
        return load_init_components(trainer, state, init_ckpt, config) if init_ckpt else state

    data_given = data is not None
    meta = run_meta(config, phase, dataset=data is None)
    if data is None:
        data = make_data(config, phase, micro // jax.process_count())
    ref_fn = None
    if rec.batch is REFERENCE and data_given is False:
        ref_fn, how = mined_reference_frames(phase_dataset_dir(config, phase), str(config.data.get("split", "train")),
                                             seed=int(config.seed))
        status("phase r references: %s", "another clip of the same character (mined over the dataset)"
               if how == "mined" else "within the batch (the dataset's clips carry no character labels)")
    builder = BatchBuilder(config, rec.batch, reference_frames=ref_fn)
    hooks = ()
    if int(t.sample_every) > 0 and rec.samples and "vae" in components:
        hooks = (sample_hook(trainer, config, workdir, int(t.sample_every)),)
    result = loop.fit(
        trainer, data, num_steps=steps * accum, workdir=workdir, global_batch_size=micro,
        checkpoint_every=int(t.checkpoint_every), keep_checkpoints=int(t.keep_checkpoints),
        async_checkpoint=bool(t.async_checkpoint), log_every=int(t.log_every), batch_fn=builder,
        init_state=init_state, progress=bool(t.progress),
        meta=meta,
        peak_tflops_per_device=float(t.peak_tflops_per_device), hooks=hooks,
        allow_resume_mismatch=bool(t.get("allow_resume_mismatch", False)), stop_after=stop_after,
        resume_step=int(t.get("resume_step", -1)))
    if result.preempted:
        raise loop.Preempted(result.preempted, phase, result.end_step, result.checkpoint_dir)
    if stop_after is not None and result.end_step < steps * accum:
        return ""  # stopped early (a simulated kill): checkpoints written, no system yet
    if "vae" in rec.outputs and bool(t.get("vae_fit_scaling_factor", True)):
        config = copy.deepcopy(config)
        model, _ = trainer.split(result.state)
        batches = [builder(next(data), step=steps * accum) for _ in range(4)]
        config.vae.scaling_factor = losses.latent_scaling_factor(model.vae, batches)
        status("vae.scaling_factor = %.6g (1 / std of the latents of 4 batches)", config.vae.scaling_factor)
    out = system_out or str(t.system_checkpoint) or paths.join(workdir, "system")
    status("writing the system checkpoint %s", out)
    return write_system(trainer, result.state, config, out, init_ckpt)


def run_all(config: ml_collections.ConfigDict, workdir: str, *, compiler_options: dict | None = None) -> str:
    """Runs ``config.train.pipeline`` (default a1 -> a2 -> b -> c), each phase starting from the previous
    phase's system checkpoint, with ``config.train.pipeline_steps`` steps and
    ``config.train.pipeline_learning_rates`` peak LRs each when given; returns the final system checkpoint.
    ``config.train.resume_step`` applies to the first phase that runs (the one that resumes); later
    phases resume from their newest intact step.

    Raises:
      ValueError: an unknown phase in the pipeline, or ``pipeline_steps`` / ``pipeline_learning_rates``
        of another length.
      loop.Preempted: SIGTERM / SIGINT stopped a phase, or the pipeline before its next phase (finished
        phases keep their system checkpoints; the same call resumes in the stopped phase).
    """
    workdir = str(paths.as_path(workdir))
    final = str(paths.as_path(str(config.train.system_checkpoint) or paths.join(workdir, "system")))
    prev = str(config.train.init_checkpoint)
    pipeline = tuple(config.train.get("pipeline", ("a1", "a2", "b", "c")))
    steps = tuple(config.train.get("pipeline_steps", ()))
    unknown = [p for p in pipeline if p not in phases.PHASES]
    if unknown or not pipeline:
        raise ValueError(f"config.train.pipeline {pipeline} has unknown phases {unknown}; use {tuple(phases.PHASES)}")
    lrs = tuple(config.train.get("pipeline_learning_rates", ()))
    for name, given in (("pipeline_steps", steps), ("pipeline_learning_rates", lrs)):
        if given and len(given) != len(pipeline):
            raise ValueError(f"config.train.{name} {given} must give one value per phase of {pipeline}")
    first_run = True
    with distributed.preemption_guard() as guard:
        for i, phase in enumerate(pipeline):
            c = copy.deepcopy(config)
            c.train.phase, c.train.init_checkpoint = phase, prev
            if steps:
                c.train.num_steps = int(steps[i])
            if lrs:
                c.train.learning_rate = float(lrs[i])
            out = final if i == len(pipeline) - 1 else paths.join(workdir, phase, "system")
            c.train.system_checkpoint = out
            if checkpoint.is_complete(out):
                status("phase %s already done (%s)", phase, out)
            else:
                if guard.stop_agreed():  # before building the phase's model and data
                    raise loop.Preempted(guard.reason, phase, 0, paths.join(workdir, phase, "checkpoints"))
                t0 = time.time()
                if not first_run:  # train.resume_step names a step of the first phase that runs
                    c.train.resume_step = -1
                first_run = False
                run_phase(c, paths.join(workdir, phase), system_out=out, compiler_options=compiler_options)
                status("phase %s done in %.0f s -> %s", phase, time.time() - t0, out)
            prev = out
    return final

