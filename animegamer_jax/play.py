"""Play one game: a script file (one instruction a line) or instructions typed on stdin.

Usage::

    python -m animegamer_jax.play data/games/bunny.txt --config configs/tiny.py --checkpoint DIR
    python -m animegamer_jax.play - --standin            # interactive: one instruction a line, Ctrl-D/Ctrl-C ends
    python -m animegamer_jax.play data/games/bunny.txt --standin --seed 3 --config.game.mode=reference
    python -m animegamer_jax.play data/games/bunny.txt --demo   # shipped tiny checkpoint, else random tiny

Any ``--config.a.b=value`` overrides a config field (unknown keys are errors). Outputs go to
``<out>/<game_id>/`` (game/writers.py); the command prints the folder, the states and meters of
every turn and the per-stage wall times, compilation apart. ``--game-id`` must be a plain folder
name; a folder of that name that this program did not write is never touched, and a finished game
of an earlier run is kept unless ``--overwrite``. Every instruction of a script is checked (fields,
token length, file:line) before the first turn. Interactive play writes the game after every turn
(same layout) and ends cleanly on Ctrl-D or Ctrl-C; messages give the input line number.
"""

from __future__ import annotations

import argparse
import sys

from animegamer_jax import fileio, parallel, paths
from animegamer_jax.config import ConfigError, apply_overrides, load_config
from animegamer_jax.game import writers
from animegamer_jax.game.engine import GameEngine, TurnResult, apply_mode, game_record
from animegamer_jax.game.script import Game, GameScriptError, load_script, parse_instruction
from animegamer_jax.game.state import InstructionTooLongError, encode_instruction, validate_games
from animegamer_jax.game.system import CheckpointError, resolve_system

#: the errors play and generate report as one line (exit status 2) instead of a traceback
CLI_ERRORS = (ConfigError, GameScriptError, InstructionTooLongError, CheckpointError, writers.OutputError)


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
    ap.add_argument("--overwrite", action="store_true",
                    help="replace a finished game of the same id from an earlier run (folders this "
                         "program did not write are never replaced)")
    ap.add_argument("--verify-checkpoint", choices=("fast", "full"), default="fast",
                    help="checkpoint integrity check before loading: fast = every file's size, full hash "
                         "of files up to 8 MiB and sampled blocks of larger ones; full = sha256 of every byte")


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
            system_checkpoint.verify_checkpoint(args.checkpoint, getattr(args, "verify_checkpoint", "fast"))
        except system_checkpoint.SystemCheckpointError as e:
            raise ConfigError(str(e)) from None
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


def fingerprint(engine: GameEngine, game: Game, seed: int) -> dict:
    """What makes ``game``'s outputs (writers.game_fingerprint): compared when generate resumes."""
    return writers.game_fingerprint(engine.config, [t.text for t in game.turns], seed,
                                    engine.system.identity or engine.system.label)


def save_game(engine: GameEngine, result: dict, out_dir: str, overwrite: bool = False) -> tuple[str, dict]:
    """Writes a played game atomically; returns (folder, record with ``timings_s``, writing included).

    Raises:
      writers.OutputError: the target is not ours, or holds an earlier game and not ``overwrite``.
    """
    cfg = engine.config
    record = game_record(cfg, result, engine.system.label)
    frames = [tr.frames for tr in result["turns"]]
    folder = writers.write_game(out_dir, result["game"].game_id, record, frames, cfg.game.fps,
                                cfg.game.write_gif, cfg.game.contact_sheet_columns, overwrite=overwrite,
                                fingerprint=fingerprint(engine, result["game"], result["seed"]))
    timings = writers.read_json(fileio.join(folder, writers.TIMINGS_JSON))
    record["timings_s"]["run"]["writing"] = timings["run"]["writing"]
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


def _interactive(engine: GameEngine, game_id: str, seed: int, save) -> dict | None:
    """Plays instructions typed on stdin, one a line; ``save(result)`` writes the game after every turn.

    Ctrl-D (EOF) or Ctrl-C ends the game; a turn interrupted mid-way is dropped, every finished
    turn is already saved. Returns the result of the turns played (None if none).
    """
    run = engine.new_run()
    turns, results, timings = [], [], []
    b = engine.batch_size
    prompt = sys.stdin.isatty()
    k = line_no = 0
    result = None
    try:
        while True:
            if prompt:
                print("instruction> ", end="", flush=True)
            line = sys.stdin.readline()
            if not line:
                break
            line_no += 1
            if not line.strip() or line.lstrip("\ufeff").lstrip().startswith("#"):
                continue
            try:
                turn = parse_instruction(line, f"<stdin>:{line_no}")
                ids = encode_instruction(turn.text, engine.spec, engine.tok, where=f"<stdin>:{line_no}")
            except (GameScriptError, InstructionTooLongError) as e:
                print(f"error: {e}", file=sys.stderr, flush=True)
                continue
            states, rep, frames, timing = engine.step([run] * b, [seed] * b, [ids] * b, [k] * b)
            st = tuple(int(v) for v in states[0])
            meters = run.finish_turn(ids, st, rep[0], int(engine.config.game.meter_step))
            tr = TurnResult(st, rep[0], frames[0], meters.as_dict())
            print_turn(k, turn.text, tr, timing)
            candidate = {"game": Game(game_id, tuple(turns + [turn]), seed), "seed": seed,
                         "turns": results + [tr], "timings": timings + [timing],
                         "compile_s": dict(engine.compile_s)}
            save(candidate, k)
            turns.append(turn)
            results.append(tr)
            timings.append(timing)
            result = candidate
            k += 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: {k} turn(s) played and saved", file=sys.stderr, flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script", nargs="?", default="-", help="game script (.txt), or - for stdin")
    ap.add_argument("--seed", type=int, default=None, help="game seed (default config.game.seed)")
    ap.add_argument("--game-id", default=None, help="output folder name (default: script name)")
    common_args(ap)
    args, extra = ap.parse_known_args(argv)
    setup_jax()
    try:
        if args.game_id is not None:
            writers.check_game_id(args.game_id)
        config = config_from_args(args, extra)
        out_dir = args.out or config.game.out_dir
        writers.check_writable(out_dir)
        game = load_script(args.script, args.game_id) if args.script != "-" else None
        game_id = game.game_id if game is not None else (args.game_id or "interactive")
        writers.check_game_id(game_id, "--game-id (default: the script's file name)")
        writers.check_target(out_dir, game_id, args.overwrite)
        mesh = parallel.mesh_from_config(config)
        system = resolve_system(apply_mode(config), args.checkpoint, args.standin, mesh=mesh,
                                random_fallback=args.demo, verify=args.verify_checkpoint)
        engine = GameEngine(config, system, mesh=mesh)
        if game is not None:
            validate_games([game], engine.spec, engine.tok)
        seed = args.seed if args.seed is not None else int(config.game.seed)
        print(f"system: {system.label}\nconfig {config.name}, mode {engine.config.game.mode}, window "
              f"{engine.spec.window}, seed {seed}", flush=True)
        if game is None:
            saved = {}

            def save(result, k):
                # the first write honours --overwrite; later ones replace this session's own folder
                saved["out"] = save_game(engine, result, out_dir, overwrite=args.overwrite or k > 0)

            if _interactive(engine, game_id, seed, save) is None:
                raise GameScriptError("<stdin>: no instructions given. Fix: type one 'Character: ...; "
                                      "Motion: ...; Background: ...' line per turn, then end with Ctrl-D")
            folder, record = saved["out"]
        else:
            game = Game(game.game_id, game.turns, seed)

            def on_turn(k, results):
                r = results[0]
                if k < len(r["turns"]):
                    print_turn(k, game.turns[k].text, r["turns"][k], r["timings"][k])

            result = engine.play([game], on_turn=on_turn)[0]
            folder, record = save_game(engine, result, out_dir, overwrite=args.overwrite)
    except CLI_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing written for this game (a script's game is written when it ends)",
              file=sys.stderr)
        return 130
    print(summary(folder, record))
    return 0


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
