"""Training entry point (flax-examples style).

  python -m animegamer_jax.train --config=configs/tiny.py --config.train.phase=a2 --workdir=/tmp/tiny_a2
  python -m animegamer_jax.train --config=configs/tiny.py --config.train.phase=all --workdir=/tmp/tiny
      # config.train.pipeline (tiny: vae -> a1 -> a2 -> b -> c), final system checkpoint in WORKDIR/system
  python -m animegamer_jax.train --config=configs/tiny.py --config.train.phase=vae --workdir=/tmp/tiny_vae

Every process of a multi-host job runs the same command (launch/); ``jax.distributed`` starts
from the environment. ``--config.train.init_checkpoint=DIR`` starts from a system checkpoint
(converted weights or an earlier phase); a rerun with the same workdir resumes.
"""

from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags

from animegamer_jax import checkpoint, parallel
from animegamer_jax.cli import define_verbosity, run_command, status
from animegamer_jax.train import loop, pipeline


def define_flags(fv: flags.FlagValues, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.train`` on ``fv`` (absl)."""
    config_flags.DEFINE_config_file("config", None, "Config file (configs/tiny.py, configs/animegamer_2b_7b.py).",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("workdir", None, "Run directory: checkpoints/, tensorboard/, system/.", flag_values=fv)
    flags.DEFINE_bool("fast_compile", False, "XLA backend optimization level 0 (faster compiles on CPU, slower "
                      "steps).", flag_values=fv)
    flags.mark_flags_as_required(["config", "workdir"], flag_values=fv)
    define_verbosity(fv)


def _run(f: flags.FlagValues) -> int:
    """Trains ``config.train.phase`` (one phase, or "all": the pipeline) and prints the system checkpoint."""
    config = f.config
    status("animegamer-train: phase %s, workdir %s (building the model) ...", config.train.phase, f.workdir)
    parallel.initialize()
    opts = {"xla_backend_optimization_level": 0} if f.fast_compile else None
    if str(config.train.phase) == "all":
        out = pipeline.run_all(config, f.workdir, compiler_options=opts)
    else:
        out = pipeline.run_phase(config, f.workdir, compiler_options=opts)
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m animegamer_jax.train [flags]``; returns the exit status (2 with one line for a bad
    command line, a bad ``--config.train.init_checkpoint`` or a workdir of another run)."""
    return run_command("python -m animegamer_jax.train", argv, define_flags, __doc__, (), _run,
                       errors=(loop.ResumeMismatchError, checkpoint.SystemCheckpointError))


def cli() -> None:
    """Console script ``animegamer-train``."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
