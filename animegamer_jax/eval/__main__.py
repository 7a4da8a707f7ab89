"""``python -m animegamer_jax.eval``: generate every benchmark game and write the Table 1 report.

Usage::

    python -m animegamer_jax.eval --config=configs/tiny.py --checkpoint=DIR
    python -m animegamer_jax.eval --standin --games=bunny-day          # random stand-in system, one game
    python -m animegamer_jax.eval --checkpoint=DIR --clip=/models/clip-vit-large-patch14 --out=outputs/eval

Any ``--config.a.b=value`` overrides a config field (unknown keys are errors). Writes
``<out>/report.md``, ``<out>/report.json`` and (unless ``--nowrite_games``) ``<out>/games/<game_id>/``.
"""

from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags

from animegamer_jax import cli as cli_lib
from animegamer_jax import paths
from animegamer_jax.config import ConfigError
from animegamer_jax.eval.embedders import embedder_from_flag
from animegamer_jax.eval.table1 import render_markdown, run_benchmark
from animegamer_jax.eval.table1_games import BenchmarkError


def define_flags(fv, argv: list[str]) -> None:
    """The flags of ``animegamer-eval`` on ``fv`` (absl + ml_collections config_flags)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"),
                                    "Config file; --config.a.b=value overrides a field.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("checkpoint", "", "System checkpoint directory (default config.game.checkpoint).",
                        flag_values=fv)
    flags.DEFINE_bool("standin", False, "Evaluate the random stand-in system (pipeline check).", flag_values=fv)
    flags.DEFINE_string("benchmark", None, "Benchmark JSON (default config.eval.benchmark).", flag_values=fv)
    flags.DEFINE_string("out", None, "Report folder, local or gs:// (default config.eval.out_dir).", flag_values=fv)
    flags.DEFINE_string("clip", None, "Local HF CLIPModel folder, or 'standin' (default config.eval.clip).",
                        flag_values=fv)
    flags.DEFINE_string("dreamsim", None, "Local DreamSim folder (default config.eval.dreamsim).", flag_values=fv)
    flags.DEFINE_list("games", [], "Comma-separated subset of game ids (default: all).", flag_values=fv)
    flags.DEFINE_bool("write_games", True, "Write the generated games' videos (--nowrite_games: report only; "
                      "config.eval.write_games must also be on).", flag_values=fv)
    flags.DEFINE_enum("mode", None, ["default", "reference"], "reference = the release's behaviour.", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns the exit status (2 with a message on bad input)."""
    return cli_lib.run_command("animegamer-eval", argv, define_flags, __doc__, (), _run,
                               (ConfigError, BenchmarkError, FileNotFoundError, KeyError, ValueError, OSError))


def _run(f) -> int:
    """The body of :func:`main` on parsed flags ``f``."""
    config = f.config
    if f.mode:
        config.game.mode = f.mode
    embedder = embedder_from_flag(f.clip if f.clip is not None else config.eval.clip)
    dreamsim_path = f.dreamsim if f.dreamsim is not None else config.eval.dreamsim
    if dreamsim_path:
        raise ConfigError("DreamSim scoring needs its ensemble (DINO + CLIP + OpenCLIP ViTs + LoRA), which is "
                          "not ported; leave --dreamsim empty (the column reads n/a)")
    report = run_benchmark(
        config, f.benchmark or config.eval.benchmark, f.out or config.eval.out_dir,
        checkpoint=f.checkpoint, standin=f.standin, embedder=embedder, games=list(f.games) or None,
        write_games=bool(config.eval.write_games) and f.write_games)
    print(render_markdown(report))
    return 0


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
