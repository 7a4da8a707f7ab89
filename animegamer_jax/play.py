"""Play one game: a script file (one instruction a line) or instructions typed on stdin.

Usage::

    python -m animegamer_jax.play data/games/bunny.txt --checkpoint=DIR   # the config saved in DIR
    python -m animegamer_jax.play data/games/bunny.txt --config=configs/tiny.py --checkpoint=DIR
    python -m animegamer_jax.play - --standin            # interactive: one instruction a line, Ctrl-D/Ctrl-C ends
    python -m animegamer_jax.play data/games/bunny.txt --standin --seed=3 --config.game.mode=reference
    python -m animegamer_jax.play data/games/bunny.txt --demo   # shipped tiny checkpoint, else random tiny

``SCRIPT`` (the one positional argument) is a game script (.txt, local or gs://), or ``-`` (the
default) for instructions typed on stdin. Flags are absl's (``--flag=value`` or ``--flag value``; booleans ``--overwrite`` / ``--nooverwrite``).
Any ``--config.a.b=value`` overrides a field of the ``--config`` file or, without one, of the config
saved in ``--checkpoint`` (unknown keys are errors). Outputs go to
``<out>/<game_id>/`` (game/writers.py); the command prints the folder, the states and meters of
every turn and the per-stage wall times, compilation apart. ``--game-id`` must be a plain folder
name; a folder of that name that this program did not write is never touched, and a finished game
of an earlier run is kept unless ``--overwrite``. Every instruction of a script is checked (fields,
token length, file:line) before the first turn. Interactive play writes the game after every turn
(same layout) and ends cleanly on Ctrl-D or Ctrl-C; messages give the input line number.

Devices: the one game runs on every device (``game.play_layout = "latency"``, the default: CFG halves
on ``data``, the DiT's sequence on ``context``, weights sharded over all devices, no filler rows;
game/engine.py ``apply_layout``). ``--config.game.play_layout=batch`` uses ``config.mesh`` as is.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence

import jax

from animegamer_jax import cli as cli_lib
from animegamer_jax import fileio, parallel, paths
from animegamer_jax.config import ConfigError
from animegamer_jax.game import writers
from animegamer_jax.game.engine import GameEngine, TurnResult, apply_layout, apply_mode, game_record
from animegamer_jax.game.script import Game, GameScriptError, load_script, parse_instruction
from animegamer_jax.game.state import InstructionTooLongError, encode_instruction, validate_games
from animegamer_jax.game.system import CheckpointError, resolve_system

#: the errors play and generate report as one line (exit status 2) instead of a traceback
CLI_ERRORS = (cli_lib.UsageError, ConfigError, GameScriptError, InstructionTooLongError, CheckpointError,
              writers.OutputError)


CONFIG_HELP = ("Config file (default: the config saved in --checkpoint, else configs/tiny.py); "
               "--config.a.b=value overrides a field, e.g. --config.game.mode=reference (unknown keys are errors).")


def common_flags(fv) -> None:
    """The absl flags shared by play, generate and the game benchmark, defined on ``fv``.

    Spellings of the argparse era keep working: ``--verify-checkpoint`` is an alias of
    ``--verify_checkpoint``.
    """
    from absl import flags

    flags.DEFINE_string("checkpoint", "", "System checkpoint directory (save_system layout), local or gs://.",
                        flag_values=fv)
    flags.DEFINE_bool("standin", False, "Play a randomly initialised stand-in system (untrained; labelled in "
                      "outputs).", flag_values=fv)
    flags.DEFINE_string("out", None, "Output folder, local or gs:// (default config.game.out_dir).", flag_values=fv)
    flags.DEFINE_enum("mode", None, ["default", "reference"], "reference = the release's behaviour (window 1, "
                      "last-226 read-out, release CFG).", flag_values=fv)
    flags.DEFINE_bool("demo", False, "Use config.game.checkpoint when it exists, else a clearly-labelled randomly "
                      "initialised system of the config's sizes.", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace a finished game of the same id from an earlier run (folders "
                      "this program did not write are never replaced).", flag_values=fv)
    flags.DEFINE_enum("verify_checkpoint", "fast", ["fast", "full"], "Checkpoint integrity check before loading: "
                      "fast = every file's size, full hash of files up to 8 MiB and sampled blocks of larger ones; "
                      "full = sha256 of every byte.", flag_values=fv)
    flags.DEFINE_alias("verify-checkpoint", "verify_checkpoint", flag_values=fv)


def checkpoint_config(checkpoint: str, verify: str = "fast"):
    """The config saved in a system checkpoint, after its integrity check (docs/design.md#one-checkpoint-directory-for-a-whole-system: a system
    checkpoint carries the config it was built with, so ``play --checkpoint DIR`` needs nothing else).

    Raises:
      ConfigError: no such folder, a damaged checkpoint, or no readable saved config (the fix named).
    """
    from animegamer_jax import system_checkpoint

    if not paths.isdir(checkpoint):
        raise ConfigError(f"checkpoint directory {checkpoint!r} not found. Fix: pass the folder "
                          f"written by save_system (or --standin for a random stand-in)")
    try:
        system_checkpoint.verify_checkpoint(checkpoint, verify)
    except system_checkpoint.SystemCheckpointError as e:
        raise ConfigError(str(e)) from None
    try:
        return system_checkpoint.load_config(checkpoint)
    except (system_checkpoint.SystemCheckpointError, OSError) as e:
        raise ConfigError(f"{e}. Fix: pass --config for this checkpoint") from None


def _config_given(argv) -> bool:
    return any(re.match(r"^--?config(=|$)", a) for a in argv[1:])


def parse_game_flags(prog: str, argv, define: Callable[[object], None] | None = None, doc: str = "",
                     exclude: Sequence[str] = ()):
    """Parses a game command line: :func:`common_flags`, ``define(fv)``'s own flags and ``--config``.

    ``--config=FILE`` (ml_collections ``config_flags.DEFINE_config_file``) loads a config file; without
    it, with ``--checkpoint DIR``, the config saved in the checkpoint is the flag's default
    (``config_flags.DEFINE_config_dict``, checked by :func:`checkpoint_config` first), else
    configs/tiny.py. ``--config.a.b=value`` overrides a field either way; ``--mode`` is applied.

    Args:
      prog: program name shown in errors; argv: the arguments after it; exclude: names of
        :func:`common_flags` the command does not take (serve: ``overwrite``).

    Returns:
      (flag values, positional arguments, config).

    Raises:
      cli_lib.UsageError: an unknown flag or config key, a bad value. ConfigError: a missing or damaged
        checkpoint whose config was to be used. SystemExit(0): ``--help`` (printed).
    """
    from absl import flags
    from ml_collections import config_flags


    argv = cli_lib.resolve_config_args([prog, *argv])

    def own(fv):
        if define is not None:
            define(fv)
        common_flags(fv)
        for name in exclude:
            delattr(fv, name)

    saved = None
    if not _config_given(argv) and not any(a in cli_lib.HELP_ARGS for a in argv[1:]):
        probe = flags.FlagValues()  # only to read --checkpoint / --verify_checkpoint before --config exists
        own(probe)
        try:
            probe(argv, known_only=True)
        except flags.Error:
            pass  # reported by the full parse below
        else:
            if probe.checkpoint:
                saved = checkpoint_config(probe.checkpoint, probe.verify_checkpoint)

    def define_all(fv, argv):
        own(fv)
        if saved is not None:
            config_flags.DEFINE_config_dict("config", saved, CONFIG_HELP, flag_values=fv, lock_config=False,
                                            sys_argv=argv)
        else:
            config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"), CONFIG_HELP,
                                            flag_values=fv, lock_config=False, sys_argv=argv)

    f, rest = cli_lib.parse_flags(argv, define_all, doc)
    config = f.config
    if f.mode:
        config.game.mode = f.mode
    return f, rest, config


def setup_jax() -> None:
    """Process-wide JAX settings of the game commands.

    ``jax_threefry_partitionable`` off: with it on (this JAX's default) every program that draws
    random numbers spends ~20 s compiling threefry on a loaded 2-core CPU instead of ~2 s. Only the
    bit stream changes; a given seed still gives identical outputs run after run.
    """
    import jax

    jax.config.update("jax_threefry_partitionable", False)


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
    record = game_record(cfg, result, engine.system.label, system_description=engine.system.description)
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
             *([f"about the system: {record['system_description']}"] if record.get("system_description") else []),
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


def define_flags(fv) -> None:
    """play's own flags (next to :func:`common_flags` and ``--config``) on ``fv``."""
    from absl import flags

    flags.DEFINE_integer("seed", None, "Game seed (default config.game.seed).", flag_values=fv)
    flags.DEFINE_string("game_id", None, "Output folder name (default: the script's file name).", flag_values=fv)
    flags.DEFINE_alias("game-id", "game_id", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """Plays the game of ``argv`` (``[SCRIPT|-] --flag ...``); returns the exit status (2 with a
    one-line message on bad input, 130 on Ctrl-C)."""
    setup_jax()
    try:
        f, rest, config = parse_game_flags("animegamer-play", sys.argv[1:] if argv is None else argv,
                                           define_flags, __doc__)
        if len(rest) > 1:
            raise cli_lib.UsageError(f"unexpected arguments {rest[1:]}; play takes one script (or - for stdin)")
        script = rest[0] if rest else "-"
        if f.game_id is not None:
            writers.check_game_id(f.game_id)
        out_dir = f.out or config.game.out_dir
        writers.check_writable(out_dir)
        game = load_script(script, f.game_id) if script != "-" else None
        game_id = game.game_id if game is not None else (f.game_id or "interactive")
        writers.check_game_id(game_id, "--game-id (default: the script's file name)")
        writers.check_target(out_dir, game_id, f.overwrite)
        # one game on every device (latency layout) unless --config.game.play_layout=batch
        layout = str(config.game.get("play_layout", "latency"))
        try:
            config = apply_layout(config, layout, jax.device_count())
        except ValueError as e:
            raise ConfigError(f"{e}. Fix: --config.game.play_layout=latency or =batch") from None
        mesh = parallel.mesh_from_config(config)
        system = resolve_system(apply_mode(config), f.checkpoint, f.standin, mesh=mesh,
                                random_fallback=f.demo, verify=f.verify_checkpoint)
        engine = GameEngine(config, system, mesh=mesh, latency=layout == "latency")
        if game is not None:
            validate_games([game], engine.spec, engine.tok)
        seed = f.seed if f.seed is not None else int(config.game.seed)
        print(f"system: {system.label}\nconfig {config.name}, mode {engine.config.game.mode}, window "
              f"{engine.spec.window}, seed {seed}", flush=True)
        if game is None:
            saved = {}

            def save(result, k):
                # the first write honours --overwrite; later ones replace this session's own folder
                saved["out"] = save_game(engine, result, out_dir, overwrite=f.overwrite or k > 0)

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
            folder, record = save_game(engine, result, out_dir, overwrite=f.overwrite)
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
