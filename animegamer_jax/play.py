"""Play one game: a script file (one instruction a line) or instructions typed on stdin.

Usage::

    python -m animegamer_jax.play data/games/bunny.txt --config configs/tiny.py --checkpoint DIR
    python -m animegamer_jax.play - --standin            # interactive: one instruction a line, EOF ends
    python -m animegamer_jax.play data/games/bunny.txt --standin --seed 3 --config.game.mode=reference
    python -m animegamer_jax.play data/games/bunny.txt --demo   # shipped tiny checkpoint, else random tiny

Any ``--config.a.b=value`` overrides a config field (unknown keys are errors). Outputs go to
``<out>/<game_id>/`` (game/writers.py); the command prints the folder, the states and meters of
every turn and the per-stage wall times, compilation apart.
"""

from __future__ import annotations

import argparse
import sys
import time

from animegamer_jax import parallel, paths
from animegamer_jax.config import ConfigError, apply_overrides, load_config
from animegamer_jax.game import writers
from animegamer_jax.game.engine import GameEngine, TurnResult, apply_mode, game_record
from animegamer_jax.game.script import Game, GameScriptError, load_script, parse_instruction
from animegamer_jax.game.state import InstructionTooLongError, encode_instruction
from animegamer_jax.game.system import CheckpointError, resolve_system


def common_args(ap: argparse.ArgumentParser) -> None:
    """Flags shared by play and generate."""
    ap.add_argument("--config", default=None,
                    help="config file (default: the config saved in --checkpoint, else configs/tiny.py)")
    ap.add_argument("--checkpoint", default="", help="system checkpoint directory (save_system layout)")
    ap.add_argument("--standin", action="store_true",
                    help="play a randomly initialised stand-in system (untrained; labelled in outputs)")
    ap.add_argument("--out", default=None, help="output folder (default config.game.out_dir)")
    ap.add_argument("--mode", choices=("default", "reference"), default=None,
                    help="reference = the release's behaviour (window 1, last-226 read-out, release CFG)")
    ap.add_argument("--demo", action="store_true",
                    help="use config.game.checkpoint when it exists, else a clearly-labelled randomly "
                         "initialised system of the config's sizes")


def setup_jax() -> None:
    """Process-wide JAX settings of the game commands.

    ``jax_threefry_partitionable`` off: with it on (this JAX's default) every program that draws
    random numbers spends ~20 s compiling threefry on a loaded 2-core CPU instead of ~2 s. Only the
    bit stream changes; a given seed still gives identical outputs run after run.
    """
    import jax

    jax.config.update("jax_threefry_partitionable", False)


def config_from_args(args, extra: list[str]):
    """Loads the config and applies ``--config.x.y=v`` overrides and ``--mode``.

    Raises:
      ConfigError: unknown key, bad value, or an argument that is not an override.
    """
    overrides = []
    for a in extra:
        if not a.startswith("--config."):
            raise ConfigError(f"unknown argument {a!r}; config overrides look like --config.game.seed=3")
        overrides.append(a[len("--"):])
    if args.config is None and args.checkpoint:
        # design.md: a system checkpoint carries the config it was built with, so
        # `play --checkpoint DIR` needs nothing else.
        from animegamer_jax import system_checkpoint

        if not paths.isdir(args.checkpoint):
            raise ConfigError(f"checkpoint directory {args.checkpoint!r} not found. Fix: pass the folder "
                              f"written by save_system (or --standin for a random stand-in)")
        try:
            config = apply_overrides(system_checkpoint.load_config(args.checkpoint), overrides, args.checkpoint)
        except (system_checkpoint.SystemCheckpointError, OSError) as e:
            raise ConfigError(f"{e}. Fix: pass --config for this checkpoint") from None
    else:
        config = load_config(args.config or "configs/tiny.py", overrides)
    if args.mode:
        config.game.mode = args.mode
    return config


def print_turn(k: int, text: str, tr: TurnResult, timing: dict) -> None:
    ml, sc, et, st = tr.states
    m = tr.meters
    print(f"turn {k + 1}: {text}\n  states ML={ml} SC={sc:+d} ET={et:+d} ST={st:+d} | social {m['social']} "
          f"entertainment {m['entertainment']} stamina {m['stamina']} | mllm {timing['mllm_s']:.2f}s "
          f"sampling {timing['sampling_s']:.2f}s vae {timing['vae_s']:.2f}s", flush=True)


def save_game(engine: GameEngine, result: dict, out_dir: str) -> tuple[str, dict]:
    """Writes a played game atomically; returns (folder, game.json record)."""
    cfg = engine.config
    t0 = time.perf_counter()
    record = game_record(cfg, result, engine.system.label)
    frames = [tr.frames for tr in result["turns"]]
    folder = writers.write_game(out_dir, result["game"].game_id, record, frames, cfg.game.fps,
                                cfg.game.write_gif, cfg.game.contact_sheet_columns)
    write_s = time.perf_counter() - t0
    # the writing time is known only now: store it in the finished record too (atomic replace)
    record["timings_s"]["run"]["writing"] = write_s
    writers.update_json(folder, record)
    return folder, record


def summary(folder: str, record: dict) -> str:
    run, comp = record["timings_s"]["run"], record["timings_s"]["compile"]
    n = len(record["turns"])
    lines = [f"outputs: {folder}/ (index.html gallery, game.mp4, turn_*.mp4/gif, game.json)",
             f"contact sheet: {folder}/contact_sheet.png",
             f"system: {record['system']}",
             "wall time per stage over {} turns (run, compile excluded): ".format(n)
             + ", ".join(f"{k} {v:.2f}s" for k, v in run.items()),
             "compilation: " + ", ".join(f"{k} {v:.2f}s" for k, v in comp.items())]
    return "\n".join(lines)


def _interactive(engine: GameEngine, game_id: str, seed: int) -> dict:
    run = engine.new_run()
    turns, results, timings = [], [], []
    b = engine.batch_size
    prompt = sys.stdin.isatty()
    k = 0
    while True:
        if prompt:
            print("instruction> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            turn = parse_instruction(line, f"<stdin>:{k + 1}")
            ids = encode_instruction(turn.text, engine.spec, engine.tok)
        except (GameScriptError, InstructionTooLongError) as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            continue
        states, rep, frames, timing = engine.step([run] * b, [seed] * b, [ids] * b, [k] * b)
        st = tuple(int(v) for v in states[0])
        meters = run.finish_turn(ids, st, rep[0], int(engine.config.game.meter_step))
        tr = TurnResult(st, rep[0], frames[0], meters.as_dict())
        turns.append(turn)
        results.append(tr)
        timings.append(timing)
        print_turn(k, turn.text, tr, timing)
        k += 1
    if not turns:
        raise GameScriptError("<stdin>: no instructions given. Fix: type one 'Character: ...; Motion: ...; "
                              "Background: ...' line per turn, then end with Ctrl-D")
    return {"game": Game(game_id, tuple(turns), seed), "seed": seed, "turns": results, "timings": timings,
            "compile_s": dict(engine.compile_s)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script", nargs="?", default="-", help="game script (.txt), or - for stdin")
    ap.add_argument("--seed", type=int, default=None, help="game seed (default config.game.seed)")
    ap.add_argument("--game-id", default=None, help="output folder name (default: script name)")
    common_args(ap)
    args, extra = ap.parse_known_args(argv)
    setup_jax()
    try:
        config = config_from_args(args, extra)
        out_dir = args.out or config.game.out_dir
        writers.check_writable(out_dir)
        game = load_script(args.script, args.game_id) if args.script != "-" else None
        mesh = parallel.mesh_from_config(config)
        system = resolve_system(apply_mode(config), args.checkpoint, args.standin, mesh=mesh,
                                random_fallback=args.demo)
        engine = GameEngine(config, system, mesh=mesh)
        seed = args.seed if args.seed is not None else int(config.game.seed)
        print(f"system: {system.label}\nconfig {config.name}, mode {engine.config.game.mode}, window "
              f"{engine.spec.window}, seed {seed}", flush=True)
        if game is None:
            result = _interactive(engine, args.game_id or "interactive", seed)
        else:
            game = Game(game.game_id, game.turns, seed)

            def on_turn(k, results):
                r = results[0]
                if k < len(r["turns"]):
                    print_turn(k, game.turns[k].text, r["turns"][k], r["timings"][k])

            result = engine.play([game], on_turn=on_turn)[0]
        folder, record = save_game(engine, result, out_dir)
    except (ConfigError, GameScriptError, InstructionTooLongError, CheckpointError, writers.OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summary(folder, record))
    return 0


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
