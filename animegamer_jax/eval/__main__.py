"""``python -m animegamer_jax.eval``: generate every benchmark game and write the Table 1 report.

Usage::

    python -m animegamer_jax.eval --config configs/tiny.py --checkpoint DIR
    python -m animegamer_jax.eval --standin --games bunny-day          # random stand-in system, one game
    python -m animegamer_jax.eval --checkpoint DIR --clip /models/clip-vit-large-patch14 --out outputs/eval

Any ``--config.a.b=value`` overrides a config field (unknown keys are errors). Writes
``<out>/report.md``, ``<out>/report.json`` and (unless ``--no-games``) ``<out>/games/<game_id>/``.
"""

from __future__ import annotations

import argparse
import sys

from animegamer_jax.config import ConfigError, load_config
from animegamer_jax.eval.benchmark import render_markdown, run_benchmark
from animegamer_jax.eval.benchmark_file import BenchmarkError
from animegamer_jax.eval.embedders import embedder_from_flag


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/tiny.py", help="config file (default configs/tiny.py)")
    ap.add_argument("--checkpoint", default="", help="system checkpoint directory (default config.game.checkpoint)")
    ap.add_argument("--standin", action="store_true", help="evaluate the random stand-in system (pipeline check)")
    ap.add_argument("--benchmark", default=None, help="benchmark JSON (default config.eval.benchmark)")
    ap.add_argument("--out", default=None, help="report folder (default config.eval.out_dir)")
    ap.add_argument("--clip", default=None, help="local HF CLIPModel folder, or 'standin' (default config.eval.clip)")
    ap.add_argument("--dreamsim", default=None, help="local DreamSim folder (default config.eval.dreamsim)")
    ap.add_argument("--games", default="", help="comma-separated subset of game ids")
    ap.add_argument("--no-games", action="store_true", help="do not write the generated games' videos")
    ap.add_argument("--mode", choices=("default", "reference"), default=None)
    args, extra = ap.parse_known_args(argv)
    try:
        overrides = []
        for a in extra:
            if not a.startswith("--config."):
                raise ConfigError(f"unknown argument {a!r}; config overrides look like --config.eval.clip_frames=4")
            overrides.append(a[2:])
        config = load_config(args.config, overrides)
        if args.mode:
            config.game.mode = args.mode
        embedder = embedder_from_flag(args.clip if args.clip is not None else config.eval.clip)
        ds_path = args.dreamsim if args.dreamsim is not None else config.eval.dreamsim
        if ds_path:
            raise ConfigError("DreamSim scoring needs its ensemble (DINO + CLIP + OpenCLIP ViTs + LoRA), which is "
                              "not ported; leave --dreamsim empty (the column reads n/a)")
        report = run_benchmark(
            config, args.benchmark or config.eval.benchmark, args.out or config.eval.out_dir,
            checkpoint=args.checkpoint, standin=args.standin, embedder=embedder,
            games=[g for g in args.games.split(",") if g] or None,
            write_games=bool(config.eval.write_games) and not args.no_games)
    except (ConfigError, BenchmarkError, FileNotFoundError, KeyError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render_markdown(report))
    return 0


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
