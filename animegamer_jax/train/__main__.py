"""Training entry point (flax-examples style).

  python -m animegamer_jax.train --config=configs/tiny.py --config.train.phase=a2 --workdir=/tmp/tiny_a2
  python -m animegamer_jax.train --config=configs/tiny.py --config.train.phase=all --workdir=/tmp/tiny
      # config.train.pipeline (tiny: vae -> a1 -> a2 -> b -> c), final system checkpoint in WORKDIR/system
  python -m animegamer_jax.train --config=configs/tiny.py --config.train.phase=vae --workdir=/work/runs/vae

Every process of a multi-host job runs the same command (launch/); ``jax.distributed`` starts
from the environment. ``--config.train.init_checkpoint=DIR`` starts from a system checkpoint
(converted weights or an earlier phase); a rerun with the same workdir resumes.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from animegamer_jax import parallel

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (configs/tiny.py, configs/animegamer_2b_7b.py).",
                                lock_config=False)
flags.DEFINE_string("workdir", None, "Run directory: checkpoints/, tensorboard/, system/.")
flags.DEFINE_bool("fast_compile", False, "XLA backend optimization level 0 (CPU: ~4x faster compiles, slower steps).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    from animegamer_jax.cli import status

    status("animegamer-train: phase %s, workdir %s (importing, then building the model) ...",
           FLAGS.config.train.phase, FLAGS.workdir)
    parallel.initialize()
    from animegamer_jax.train import pipeline

    from animegamer_jax import system_checkpoint
    from animegamer_jax.train import loop

    config = FLAGS.config
    opts = {"xla_backend_optimization_level": 0} if FLAGS.fast_compile else None
    try:
        if str(config.train.phase) == "all":
            out = pipeline.run_all(config, FLAGS.workdir, compiler_options=opts)
        else:
            out = pipeline.run_phase(config, FLAGS.workdir, compiler_options=opts)
    except (loop.ResumeMismatchError, system_checkpoint.SystemCheckpointError) as e:
        # a bad --config.train.init_checkpoint or a workdir of another run: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(out)


def cli() -> None:
    """Console script ``animegamer-train``."""
    from animegamer_jax import cli as cli_lib

    cli_lib.run(main)


if __name__ == "__main__":
    cli()
