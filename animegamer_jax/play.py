"""Play one game: a script file (one instruction a line) or instructions typed on stdin.

Usage::

    python -m animegamer_jax.play data/games/bunny.txt --checkpoint=DIR   # the config saved in DIR
    python -m animegamer_jax.play data/games/bunny.txt --config=configs/tiny.py --checkpoint=DIR
    python -m animegamer_jax.play - --standin            # interactive: one instruction a line, Ctrl-D/Ctrl-C ends
    python -m animegamer_jax.play data/games/bunny.txt --standin --seed=3 --config.game.mode=reference
    python -m animegamer_jax.play data/games/bunny.txt --demo   # shipped tiny checkpoint, else random tiny

``SCRIPT`` (the one positional argument) is a game script (.txt, local or gs://), or ``-`` (the
default) for instructions typed on stdin. Flags are absl's (``--flag=value`` or ``--flag value``;
booleans ``--overwrite`` / ``--nooverwrite``); the shared ones are game/flags.py's. Any
``--config.a.b=value`` overrides a field of the ``--config`` file or, without one, of the config
saved in ``--checkpoint`` (unknown keys are errors). Outputs go to ``<out>/<game_id>/``
(game/saving.py, game/writers.py); the command prints the folder, the states and meters of every
turn and the per-stage wall times, compilation apart. ``--game-id`` must be a plain folder name;
a folder of that name that this program did not write is never touched, and a finished game of an
earlier run is kept unless ``--overwrite``. Every instruction of a script is checked (fields, token
length, file:line) before the first turn. Interactive play writes the game after every turn
(same layout), saving each turn before printing it, and ends cleanly on Ctrl-D or Ctrl-C (SIGTERM alike):
``interrupted: N turn(s) saved in <folder>``, exit 130; messages give the input line number.

Devices: the one game runs on every device (``game.play_layout = "latency"``, the default: CFG halves
on ``data``, the DiT's sequence on ``context``, weights sharded over all devices, no filler rows;
game/engine.py ``apply_layout``). ``--config.game.play_layout=batch`` uses ``config.mesh`` as is.
"""

from __future__ import annotations

import contextlib
import sys

import jax
from absl import flags

from animegamer_jax import parallel
from animegamer_jax.cli import UsageError, interrupt_exit, signals_held
from animegamer_jax.config import ConfigError
from animegamer_jax.game import writers
from animegamer_jax.game.api import TurnResult
from animegamer_jax.game.engine import GameEngine, apply_layout
from animegamer_jax.game.flags import run_game_command, setup_jax
from animegamer_jax.game.loading import resolve_system
from animegamer_jax.game.saving import print_turn, save_game, summary
from animegamer_jax.game.script import SEED_RANGE, Game, GameScriptError, load_script, parse_instruction
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import InstructionTooLongError, encode_instruction, validate_games


def _interactive(engine: GameEngine, game_id: str, seed: int, save) -> tuple[dict | None, KeyboardInterrupt | None]:
    """Plays instructions typed on stdin, one a line; ``save(result, k)`` writes the game after every turn.

    Each turn is saved before it is printed, and the save with its bookkeeping is a
    ``cli.signals_held`` section: every turn printed is on disk, and a Ctrl-C (or SIGTERM) during a
    save takes effect once that turn is saved. Ctrl-D (EOF) or Ctrl-C ends the game; a turn interrupted
    before its save began is dropped.

    A line that is not UTF-8 or that the text policy refuses (game/script.py ``check_text``; an
    undecodable byte is read as a lone surrogate, ``errors="surrogateescape"``) gets one ``error:``
    line on stderr, like any bad instruction, and play goes on with the next line.

    Returns:
      (the result of the turns saved, None if none; the interruption that ended the game, None at EOF).
    """
    with _stdin_errors("surrogateescape"):
        return _play_lines(engine, game_id, seed, save)


@contextlib.contextmanager
def _stdin_errors(errors: str):
    """Inside, ``sys.stdin`` decodes with ``errors`` (a text stream that cannot be reconfigured is left as is)."""
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    previous = getattr(sys.stdin, "errors", None)
    if reconfigure is None or previous is None:
        yield
        return
    reconfigure(errors=errors)
    try:
        yield
    finally:
        reconfigure(errors=previous)


def _play_lines(engine: GameEngine, game_id: str, seed: int, save) -> tuple[dict | None, KeyboardInterrupt | None]:
    """:func:`_interactive`'s loop over the lines of stdin."""
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
            candidate = {"game": Game(game_id, tuple(turns + [turn]), seed), "seed": seed,
                         "turns": results + [tr], "timings": timings + [timing],
                         "compile_s": dict(engine.compile_s)}
            with signals_held():
                save(candidate, k)
                turns.append(turn)
                results.append(tr)
                timings.append(timing)
                result = candidate
                k += 1
            print_turn(k - 1, turn.text, tr, timing)
    except KeyboardInterrupt as e:
        return result, e
    return result, None


def define_flags(fv) -> None:
    """play's own flags (next to game/flags.py's ``common_flags`` and ``--config``) on ``fv``."""
    flags.DEFINE_integer("seed", None, "Game seed (default config.game.seed).", lower_bound=SEED_RANGE[0],
                         upper_bound=SEED_RANGE[1], flag_values=fv)
    flags.DEFINE_string("game_id", None, "Output folder name (default: the script's file name).", flag_values=fv)
    flags.DEFINE_alias("game-id", "game_id", flag_values=fv)


def _play(f, config, *rest: str) -> int:
    """Plays the game of the parsed command line (``f``: flag values, ``rest``: ``[SCRIPT|-]``).

    Returns:
      0, or 130 on Ctrl-C (143 on SIGTERM): interactive play then prints how many turns are saved
      where (or that none was played), a script says nothing was written.

    Raises:
      UsageError: more than one positional argument; any of game/flags.py's ``CLI_ERRORS``.
    """
    if len(rest) > 1:
        raise UsageError(f"unexpected arguments {list(rest[1:])}; play takes one script (or - for stdin)")
    script = rest[0] if rest else "-"
    try:
        if f.game_id is not None:
            writers.check_game_id(f.game_id)
        out_dir = f.out or config.game.out_dir
        writers.check_writable(out_dir, keep=False)  # created when a game is written
        game = load_script(script, f.game_id) if script != "-" else None
        game_id = game.game_id if game is not None else (f.game_id or "interactive")
        writers.check_game_id(game_id, "--game-id (default: the script's file name)")
        writers.clean_stale_temp(out_dir, game_id)  # a killed rewrite's game is put back before the check
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

            result, stop = _interactive(engine, game_id, seed, save)
            if stop is not None:
                if result is None:
                    print("\ninterrupted: no turn was played; nothing written", file=sys.stderr, flush=True)
                    return interrupt_exit(stop)
                print(summary(*saved["out"]))
                print(f"interrupted: {len(result['turns'])} turn(s) saved in {saved['out'][0]}", file=sys.stderr,
                      flush=True)
                return interrupt_exit(stop)
            if result is None:
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
    except KeyboardInterrupt as e:
        print("interrupted: nothing written for this game" + (" (a script's game is written when it ends)"
                                                              if script != "-" else ""), file=sys.stderr)
        return interrupt_exit(e)
    print(summary(folder, record))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Plays the game of ``argv`` (``[SCRIPT|-] --flag ...``); returns the exit status (2 with a
    one-line message on bad input, 130 on Ctrl-C, 143 on SIGTERM, which stops play like Ctrl-C)."""
    setup_jax()
    return run_game_command("animegamer-play", argv, define_flags, __doc__, _play,
                            interrupted="nothing written for this game")


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
