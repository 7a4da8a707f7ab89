"""Training entry point (flax-examples style).

  python -m animegamer_jax.commands.train --config=configs/tiny.py --config.train.phase=a2 --workdir=/tmp/tiny_a2
  python -m animegamer_jax.commands.train --config=configs/tiny.py --config.train.phase=all --workdir=/tmp/tiny
      # config.train.pipeline (tiny: vae -> a1 -> a2 -> b -> c), final system checkpoint in WORKDIR/system
  python -m animegamer_jax.commands.train --config=configs/tiny.py --config.train.phase=vae --workdir=/tmp/tiny_vae
  python -m animegamer_jax.commands.train toy-world [--data_dir=data/prepared] [--workdir=outputs/toy_world]
      # the toy world end to end: generate, prepare, train (train/toy_world.py; --help for its flags)

Every process of a multi-host job runs the same command (launch/); ``jax.distributed`` starts
from the environment. ``--config.train.init_checkpoint=DIR`` starts from a system checkpoint
(converted weights or an earlier phase); a rerun with the same workdir resumes from the newest intact
checkpoint (a damaged newer one is named in one line and kept aside as ``<step>.damaged-<n>``), or from
``--config.train.resume_step=N``.

SIGTERM (a preempting scheduler, on one process or all) and SIGINT (Ctrl-C) stop training at the next
step every process agrees on, after saving a checkpoint there; the command then prints one line
(``preempted: ...; resume with the same command: ...``) on every process and exits 0. A second Ctrl-C
stops at once without saving (exit 130).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable

from absl import flags
from ml_collections import config_flags

from animegamer_jax import checkpoint, parallel

from animegamer_jax.io import paths
from animegamer_jax.commands.cli import Command, define_verbosity, run, status
from animegamer_jax.data import datasets
from animegamer_jax.parallel import distributed
from animegamer_jax.checkpoint import training as train_checkpoint
from animegamer_jax.train import loop, pipeline, toy_world

PROG = "python -m animegamer_jax.commands.train"
TOY_WORLD_PROG = f"{PROG} toy-world"


def define_flags(fv: flags.FlagValues, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.commands.train`` on ``fv`` (absl)."""
    config_flags.DEFINE_config_file("config", None, "Config file (configs/tiny.py, configs/animegamer_2b_7b.py).",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("workdir", None, "Run directory: checkpoints/, tensorboard/, system/.", flag_values=fv)
    flags.DEFINE_bool("fast_compile", False, "XLA backend optimization level 0 (faster compiles on CPU, slower "
                      "steps).", flag_values=fv)
    flags.mark_flags_as_required(["config", "workdir"], flag_values=fv)
    define_verbosity(fv)


def _run(f: flags.FlagValues, argv: list[str]) -> int:
    """Trains ``config.train.phase`` (one phase, or "all": the pipeline) and prints the system checkpoint;
    on SIGTERM / SIGINT prints where it stopped and the command (``argv``) that resumes, and returns 0."""
    config = f.config
    phases = tuple(config.train.pipeline) if str(config.train.phase) == "all" else (str(config.train.phase),)
    for phase in phases:  # a missing dataset is one line before any model is built
        datasets.find(pipeline.phase_dataset_dir(config, phase))
    status("animegamer-train: phase %s, workdir %s (building the model) ...", config.train.phase, f.workdir)
    opts = {"xla_backend_optimization_level": 0} if f.fast_compile else None
    run = pipeline.run_all if str(config.train.phase) == "all" else pipeline.run_phase
    return _until_preempted(lambda: run(config, f.workdir, compiler_options=opts), f"{PROG} {shlex.join(argv)}")


def _until_preempted(train: Callable[[], str], resume: str) -> int:
    """Starts ``jax.distributed`` (before the guard: its preemption service is the guard's first choice), runs
    ``train`` under the preemption guard and prints what it returns (the system checkpoint); on SIGTERM /
    SIGINT prints where it stopped and ``resume``, the command that resumes. Returns 0."""
    parallel.initialize()
    with distributed.preemption_guard():
        try:
            out = train()
        except loop.Preempted as e:
            print(f"preempted: {e}; resume with the same command: {resume}", file=sys.stderr, flush=True)
            return 0
    print(out)
    return 0


def _toy_world_flags(fv: flags.FlagValues, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.commands.train toy-world`` on ``fv``."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/toy_world.py"), "Config file.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("data_dir", "data/prepared", "Folder of the toy world (toy/) and its prepared datasets "
                        "(toy_train/, toy_heldout/).", flag_values=fv)
    flags.DEFINE_string("workdir", "outputs/toy_world", "Run directory (one folder per phase, system/).",
                        flag_values=fv)
    define_verbosity(fv)


def _toy_world(f: flags.FlagValues, argv: list[str]) -> int:
    """Makes the toy world's data and trains its pipeline (``toy_world.run``); prints the system checkpoint, or
    on SIGTERM / SIGINT where it stopped and the command (``argv``) that resumes, and returns 0."""
    return _until_preempted(lambda: toy_world.run(f.config, f.data_dir, f.workdir),
                            f"{TOY_WORLD_PROG} {shlex.join(argv)}")


#: what is left after a second Ctrl-C
_STOPPED = "stopped at once, without saving the step in progress; rerun the same command to resume from the newest checkpoint"
_ERRORS = (loop.ResumeMismatchError, checkpoint.SystemCheckpointError, train_checkpoint.CheckpointResumeError,
           datasets.DatasetError)

#: ``train [flags]`` and ``train toy-world [flags]`` (train/toy_world.py's docstring)
COMMAND = Command(define_flags, _run, __doc__, errors=_ERRORS, interrupted=_STOPPED + " (WORKDIR/checkpoints)",
                  with_argv=True, subcommands={"toy-world": Command(
                      _toy_world_flags, _toy_world, toy_world.__doc__, errors=(*_ERRORS, FileExistsError),
                      interrupted=_STOPPED, with_argv=True)})


def main(argv: list[str] | None = None) -> int:
    """``python -m animegamer_jax.commands.train [toy-world] [flags]``; returns the exit status: 0 when trained or
    when SIGTERM / SIGINT stopped it at a saved step, 2 with one line for a bad command line, a missing prepared
    dataset, a bad ``--config.train.init_checkpoint``, a workdir of another run, no intact checkpoint to resume
    from or a missing / damaged ``--config.train.resume_step``, 130 after a second Ctrl-C."""
    return run(PROG, argv, COMMAND)


def cli() -> None:
    """Console script ``animegamer-train``."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
