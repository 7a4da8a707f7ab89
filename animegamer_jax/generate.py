"""Generate many games offline from a JSONL file (one game a line, game/script.py ``load_jsonl``).

Usage::

    python -m animegamer_jax.generate data/games/demo.jsonl --config configs/tiny.py --checkpoint DIR --out outputs/games
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m animegamer_jax.generate games.jsonl --standin

Games are played ``B`` at a time, B = the data-parallel size of the mesh (one game per data
shard), games with equal turn counts grouped together. Under a multi-process launch
(``JAX_NUM_PROCESSES`` etc., parallel/distributed.py) process p takes games p, p + P, ... and plays
them on a mesh of its local devices, so processes never wait for each other. Resumable: a game whose
folder holds ``game.json`` is skipped; a partial one (killed before the atomic rename) is redone.
A tqdm bar shows games done and the ETA.
"""

from __future__ import annotations

import argparse
import glob
import sys

import jax
from tqdm import tqdm

from animegamer_jax import parallel, paths
from animegamer_jax.config import ConfigError
from animegamer_jax.game import writers
from animegamer_jax.game.engine import GameEngine, apply_mode
from animegamer_jax.game.script import Game, GameScriptError, load_jsonl
from animegamer_jax.game.state import InstructionTooLongError
from animegamer_jax.game.system import CheckpointError, resolve_system
from animegamer_jax.parallel import distributed
from animegamer_jax.play import common_args, config_from_args, save_game, setup_jax


def pending_games(games: tuple[Game, ...], out_dir: str, process_index: int = 0,
                  process_count: int = 1) -> tuple[list[Game], int]:
    """This process's share of the games that still need playing, and how many are already done.

    Also removes temp folders left by a killed run for those games.
    """
    mine = list(games[process_index::process_count])
    todo = []
    out = paths.as_path(out_dir)
    for g in mine:
        for stale in (out.glob(f".tmp-{glob.escape(g.game_id)}-*") if out.exists() else ()):
            paths.rmtree(stale)
        if not writers.is_finished(paths.join(out_dir, g.game_id)):
            todo.append(g)
    return todo, len(mine) - len(todo)


def batches(games: list[Game], size: int) -> list[list[Game]]:
    """Groups games with equal turn counts (stable order), ``size`` at a time."""
    order = sorted(range(len(games)), key=lambda i: (len(games[i].turns), i))
    ordered = [games[i] for i in order]
    out: list[list[Game]] = []
    for g in ordered:
        if out and len(out[-1]) < size and len(out[-1][0].turns) == len(g.turns):
            out[-1].append(g)
        else:
            out.append([g])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("games", help="JSONL file of games")
    ap.add_argument("--limit", type=int, default=0, help="stop after this many games (0 = all)")
    common_args(ap)
    args, extra = ap.parse_known_args(argv)
    distributed.initialize()
    setup_jax()
    try:
        config = config_from_args(args, extra)
        out_dir = args.out or config.game.out_dir
        writers.check_writable(out_dir)
        games = load_jsonl(args.games)
        todo, done = pending_games(games, out_dir, jax.process_index(), jax.process_count())
        if args.limit:
            todo = todo[: args.limit]
        mesh = parallel.mesh_from_config(config, devices=jax.local_devices())
        system = resolve_system(apply_mode(config), args.checkpoint, args.standin, mesh=mesh,
                                random_fallback=args.demo)
        engine = GameEngine(config, system, mesh=mesh)
        print(f"system: {system.label}\nprocess {jax.process_index()}/{jax.process_count()}: "
              f"{len(todo)} games to play, {done} already finished, batch {engine.batch_size} on "
              f"mesh {dict(mesh.shape)}", flush=True)
        with tqdm(total=len(todo), unit="game", desc="games", file=sys.stdout) as bar:
            for group in batches(todo, engine.batch_size):
                for result in engine.play(group):
                    save_game(engine, result, out_dir)
                    bar.update(1)
    except (ConfigError, GameScriptError, InstructionTooLongError, CheckpointError, writers.OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"outputs: {out_dir}/<game_id>/ ({len(todo)} played, {done} skipped as finished); "
          f"compilation {', '.join(f'{k} {v:.2f}s' for k, v in engine.compile_s.items())}")
    return 0


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
