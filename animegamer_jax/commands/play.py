"""Play one game: a script file (one instruction a line) or instructions typed on stdin.

Usage::

    python -m animegamer_jax.commands.play data/games/bunny.txt --checkpoint=DIR   # the config saved in DIR
    python -m animegamer_jax.commands.play data/games/bunny.txt --config=configs/tiny.py --checkpoint=DIR
    python -m animegamer_jax.commands.play - --standin            # interactive: one instruction a line, Ctrl-D/Ctrl-C ends
    python -m animegamer_jax.commands.play data/games/bunny.txt --standin --config.game.seed=3 --config.game.mode=reference
    python -m animegamer_jax.commands.play data/games/bunny.txt --demo   # shipped tiny checkpoint (its saved config), else random tiny
    python -m animegamer_jax.commands.play data/games/bunny.txt --demo --character Bunny=me.png  # Bunny's turns look like me.png

``SCRIPT`` (the one positional argument) is a game script (.txt, local or gs://), or ``-`` (the
default) for instructions typed on stdin. Flags are absl's (``--flag=value`` or ``--flag value``;
booleans ``--overwrite`` / ``--nooverwrite``); the shared ones are game_flags.py's. Any
``--config.a.b=value`` overrides a field of the ``--config`` file or, without one, of the config
saved in ``--checkpoint`` (unknown keys are errors; the game seed is ``--config.game.seed``, the
mode ``--config.game.mode``). Outputs go to ``<out>/<game_id>/`` (``--out``, default outputs/games)
(game/folder/); the command prints the folder, the states and meters of every
turn and the per-stage wall times, compilation apart. ``--game-id`` must be a plain folder name;
a folder of that name that this program did not write is never touched, and a finished game of an
earlier run is kept unless ``--overwrite``. Every instruction of a script is checked (fields, token
length, file:line) before the first turn. Interactive play writes the game after every turn
(same layout), saving each turn before printing it, and ends cleanly on Ctrl-D or Ctrl-C (SIGTERM alike):
``interrupted: N turn(s) saved in <folder>``, exit 130; messages give the input line number.

Devices: the one game runs on every device (``game.play_layout = "latency"``, the default: CFG halves
on ``data``, the DiT's sequence on ``context``, weights sharded over all devices, no filler rows;
inference/layout.py ``apply_layout``). ``--config.game.play_layout=batch`` uses ``config.mesh`` as is.

``--character NAME=IMAGE`` (repeatable; game/characters.py): the turns whose Character field is NAME
are decoded with IMAGE as the reference (a system with phase r's adapter); the game folder keeps
the image (``characters/<NAME>.png``, game.json ``characters``) and ``--continue`` reuses it. A NAME
that no turn of the script names is refused (one line); typed games (``-``) are not checked.

One writer per game folder: play holds the game folder's lock (game/folder/layout.py ``game_lock``) from
before the system loads to the end of the session; while another process writes that folder, play
is refused with one line naming its pid and host (exit 2) before anything is played.
"""

from __future__ import annotations

import contextlib
import sys

import jax
from absl import flags

from animegamer_jax import parallel

from animegamer_jax.io import paths
from animegamer_jax.io.fileio import signals_held
from animegamer_jax.commands.cli import UsageError, exit_finished, interrupt_exit, run
from animegamer_jax.config import ConfigError
from animegamer_jax.game.folder import atomic, layout
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.characters import check_used, load_characters
from animegamer_jax.commands.game_flags import character_flag, config_overrides, game_command
from animegamer_jax.game.loading import resolve_system
from animegamer_jax.game.folder.load import load_game
from animegamer_jax.game.folder.saves import branch_game, finish_session, save_game, save_turn, summary
from animegamer_jax.game.run import print_turn
from animegamer_jax.game.script import load_script
from animegamer_jax.inference.instructions import Game, GameScriptError, parse_instruction
from animegamer_jax.inference.layout import apply_layout, setup_jax
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.game.turn_by_turn import TurnByTurnGame
from animegamer_jax.inference.turn_inputs import InstructionTooLongError, encode_instruction, validate_games


def _interactive(engine: GameEngine, game: TurnByTurnGame, save) -> KeyboardInterrupt | None:
    """Plays instructions typed on stdin, one a line, onto ``game``; ``save(game)`` saves its new
    last turn (:func:`_play_turns`).

    A line that is not UTF-8 or that the text policy refuses (inference/instructions.py ``check_text``; an
    undecodable byte is read as a lone surrogate, ``errors="surrogateescape"``) gets one ``error:``
    line on stderr, like any bad instruction, and play goes on with the next line.

    Returns:
      the interruption that ended the game, None at EOF.
    """
    with _stdin_errors("surrogateescape"):
        return _play_turns(engine, game, save, _stdin_turns(engine))


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
        try:
            reconfigure(errors=previous)
        except (OSError, ValueError):  # a read cut short (Ctrl-C in readline) left decoded text pending
            pass


def _stdin_turns(engine: GameEngine):
    """Yields ``(turn, ids)`` of each instruction line of stdin (a prompt on a terminal); a bad line
    gets one ``error:`` line on stderr and is skipped."""
    prompt = sys.stdin.isatty()
    line_no = 0
    while True:
        if prompt:
            print("instruction> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        line_no += 1
        if not line.strip() or line.lstrip("\ufeff").lstrip().startswith("#"):
            continue
        try:
            turn = parse_instruction(line, f"<stdin>:{line_no}")
            ids = encode_instruction(turn.text, engine.spec, engine.tok, where=f"<stdin>:{line_no}")
        except (GameScriptError, InstructionTooLongError) as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            continue
        yield turn, ids


def _play_turns(engine: GameEngine, game: TurnByTurnGame, save, turns) -> KeyboardInterrupt | None:
    """Plays ``turns`` (``(Turn, ids)`` pairs) onto ``game``, one at a time; ``save(game)`` saves the
    new last turn.

    Each turn is saved before it is printed, and the save with its bookkeeping is a
    ``fileio.signals_held`` section: every turn printed is on disk, and a Ctrl-C (or SIGTERM) during a
    save takes effect once that turn is saved. A turn interrupted before its save began is dropped;
    a save that fails drops its turn and raises.

    Returns:
      the interruption that ended the game, None when ``turns`` ran out.
    """
    b = engine.batch_size
    try:
        for turn, ids in turns:
            run, seed, ids, k = game.row(ids)
            states, rep, frames, timing = engine.step([run] * b, [seed] * b, [ids] * b, [k] * b,
                                                      references=[game.reference(turn)] * b,
                                                      characters=[engine.character_index(turn.character)] * b)
            with signals_held():
                tr = game.commit(turn, ids, states[0], rep[0], frames[0], timing)
                try:
                    save(game)
                except BaseException:
                    game.undo()
                    raise
            print_turn(k, turn.text, tr, timing)
    except KeyboardInterrupt as e:
        return e
    return None


def define_flags(fv) -> None:
    """play's own flags (next to game_flags.py's ``common_flags`` and ``--config``) on ``fv``."""
    flags.DEFINE_string("game_id", None, "Output folder name (default: the script's file name).", flag_values=fv)
    flags.DEFINE_alias("game-id", "game_id", flag_values=fv)
    flags.DEFINE_string("continue", None, "A saved game folder to play on: SCRIPT's instructions (or those typed "
                        "on stdin) become its next turns, saved into that folder (or, with --from_turn, into a "
                        "new game folder).", flag_values=fv)
    flags.DEFINE_integer("from_turn", None, "With --continue SOURCE: start a NEW game (--out/--game-id, default id "
                         "<source id>-from<N>) from the first N turns of SOURCE, which is left untouched; a game "
                         "already at the new id is never replaced (--overwrite neither).",
                         lower_bound=0, flag_values=fv)
    flags.DEFINE_alias("from-turn", "from_turn", flag_values=fv)
    character_flag(fv)


def _play(f, config, *rest: str) -> int:
    """Plays the game of the parsed command line (``f``: flag values, ``rest``: ``[SCRIPT|-]``).

    Returns:
      0, or 130 on Ctrl-C (143 on SIGTERM): a game saved turn by turn (interactive, ``--continue``)
      then prints how many turns are saved where (or that none was played), a script says nothing
      was written.

    Raises:
      UsageError: more than one positional argument, ``--from_turn`` without ``--continue``,
        ``--game-id`` with a plain ``--continue``, a ``--config.game.seed`` override other than the
        continued game's seed; any of game_flags.py's
        ``CLI_ERRORS`` (a saved game that cannot be continued: ``layout.SavedGameError``).
    """
    if len(rest) > 1:
        raise UsageError(f"unexpected arguments {list(rest[1:])}; play takes one script (or - for stdin)")
    script = rest[0] if rest else "-"
    source, from_turn = f["continue"].value, f.from_turn
    if from_turn is not None and source is None:
        raise UsageError("--from_turn needs the game to start from. Fix: play --continue SOURCE_GAME_DIR "
                         f"--from_turn {from_turn} [SCRIPT] --out DIR")
    if source is not None and from_turn is None and f.game_id is not None:
        raise UsageError("--game-id does not apply to --continue (the game goes on in its own folder). Fix: drop "
                         "--game-id, or add --from_turn N to start a new game of that id")
    try:
        if f.game_id is not None:
            layout.check_game_id(f.game_id)
        out_dir = f.out
        if source is None or from_turn is not None:
            layout.check_writable(out_dir, keep=False)  # created when a game is written
        game = load_script(script, f.game_id) if script != "-" else None
        characters = load_characters(f.character)
        if characters and source is not None:
            raise UsageError("--character does not apply to --continue: a continued game keeps the characters it "
                             "was played with (its folder's characters/). Fix: drop --character")
        if characters and game is not None:  # typed games (-) cannot be checked before they are played
            check_used(characters, game.turns, script)
        if source is None:
            game_id = game.game_id if game is not None else (f.game_id or "interactive")
        elif from_turn is None:
            game_id = source.rstrip("/").rsplit("/", 1)[-1]
        else:
            game_id = f.game_id or f"{source.rstrip('/').rsplit('/', 1)[-1]}-from{from_turn}"
        layout.check_game_id(game_id, "--game-id (default: the script's file name)")
        # one writer per game folder: another process writing it refuses this one here, before anything plays
        target = paths.join(out_dir, game_id) if source is None or from_turn is not None else source.rstrip("/")
        with layout.game_lock(target):
            folder, record = _play_locked(f, config, script, game, characters, source, from_turn, game_id, out_dir)
            if record is None:
                return folder
    except KeyboardInterrupt as e:
        print("interrupted: nothing written for this game" + (" (a script's game is written when it ends)"
                                                              if script != "-" else ""), file=sys.stderr)
        return interrupt_exit(e)
    print(summary(folder, record))
    return 0


def _play_locked(f, config, script: str, game: Game | None, characters, source: str | None, from_turn: int | None,
                 game_id: str, out_dir: str) -> tuple:
    """The part of :func:`_play` run holding the game folder's lock (``layout.game_lock``): loads the
    system and plays. Returns ``(folder, record)`` of a script's game saved whole, or ``(exit status,
    None)`` of a game saved turn by turn (interactive, ``--continue``), which printed its own summary."""
    if source is None or from_turn is not None:
        atomic.clean_stale_temp(out_dir, game_id)  # a killed rewrite's game is put back before the check
        if source is None:
            layout.check_target(out_dir, game_id, f.overwrite)
        else:
            layout.check_branch_target(out_dir, game_id)  # never replaced, --overwrite or not
    # one game on every device (latency layout) unless --config.game.play_layout=batch
    play_layout = str(config.game.get("play_layout", "latency"))
    try:
        config = apply_layout(config, play_layout, jax.device_count())
    except ValueError as e:
        raise ConfigError(f"{e}. Fix: --config.game.play_layout=latency or =batch") from None
    mesh = parallel.mesh_from_config(config)
    system = resolve_system(apply_mode(config), f.checkpoint, f.standin, mesh=mesh,
                            random_fallback=f.demo, verify=f.verify_checkpoint,
                            need_references=bool(characters))
    engine = GameEngine(config, system, mesh=mesh, latency=play_layout == "latency")
    if game is not None:
        validate_games([game], engine.spec, engine.tok)
    if source is not None:
        return _continue(engine, f, source, from_turn, game_id, out_dir, game), None
    seed = int(config.game.seed)
    print(f"system: {system.label}\nconfig {config.name}, mode {engine.config.game.mode}, window "
          f"{engine.spec.window}, seed {seed}", flush=True)
    if game is None:
        tbt = TurnByTurnGame(engine, game_id, seed, characters=characters)

        def save(g):
            # the first write honours --overwrite; later ones add a turn to this session's own folder
            save_turn(engine.config, engine.model, g, out_dir, new_folder=len(g) == 1, overwrite=f.overwrite)

        return _session_end(engine, tbt, paths.join(out_dir, game_id), _interactive(engine, tbt, save),
                            played=0), None
    game = Game(game.game_id, game.turns, seed, characters)

    def on_turn(k, results):
        r = results[0]
        if k < len(r["turns"]):
            print_turn(k, game.turns[k].text, r["turns"][k], r["timings"][k])

    result = engine.play([game], on_turn=on_turn)[0]
    return save_game(engine.config, engine.model, result, out_dir, overwrite=f.overwrite)


def _continue(engine: GameEngine, f, source: str, from_turn: int | None, game_id: str, out_dir: str,
              script: Game | None) -> int:
    """``--continue SOURCE`` (``--from_turn N``: a new game ``<out_dir>/<game_id>`` from SOURCE's
    first N turns): plays ``script``'s turns, or stdin's, onto the saved game, each saved before it is
    printed. Returns the exit status (:func:`_session_end`)."""
    tbt, _ = load_game(engine, source, upto=from_turn, game_id=game_id)
    seed = config_overrides(f).get("game.seed")
    if seed is not None and int(seed) != tbt.seed:
        raise UsageError(f"--config.game.seed={seed}: {source} was played with seed {tbt.seed}, and a continued "
                         f"game keeps its seed. Fix: drop --config.game.seed")
    if from_turn is None:
        folder = source.rstrip("/")
        out_dir = folder.rsplit("/", 1)[0] if "/" in folder else "."
    else:
        folder = branch_game(engine.config, engine.model, source, tbt, out_dir)
    played = len(tbt)
    print(f"system: {engine.model.label}\nconfig {engine.config.name}, mode {engine.config.game.mode}, window "
          f"{engine.spec.window}, seed {tbt.seed}\n"
          f"{'continuing' if from_turn is None else f'new game {folder} from'} {source} after turn {played}",
          flush=True)

    def save(g):
        save_turn(engine.config, engine.model, g, out_dir, new_folder=False)

    if script is not None:
        turns = [(t, encode_instruction(t.text, engine.spec, engine.tok)) for t in script.turns]
        stop = _play_turns(engine, tbt, save, turns)
    else:
        stop = _interactive(engine, tbt, save)
    return _session_end(engine, tbt, folder, stop, played=played, keep=from_turn is not None)


def _session_end(engine: GameEngine, game: TurnByTurnGame, folder: str, stop: KeyboardInterrupt | None,
                 played: int, keep: bool = False) -> int:
    """Ends a game saved turn by turn: remakes its game video and contact sheet (``finish_session``),
    prints its summary and, after an interruption, how many turns are saved; returns the exit status.

    Args:
      played: the game's turns before this session; keep: the folder exists even without a new turn.

    Raises:
      GameScriptError: stdin ended before any turn of a new game.
    """
    if len(game) == played and not keep:
        if stop is not None:
            print("\ninterrupted: no turn was played; nothing written", file=sys.stderr, flush=True)
            return interrupt_exit(stop)
        if played == 0:
            raise GameScriptError("<stdin>: no instructions given. Fix: type one 'Character: ...; "
                                  "Motion: ...; Background: ...' line per turn, then end with Ctrl-D")
    record = None
    try:
        with signals_held():  # a Ctrl-C now ends the command once the files are made
            record = finish_session(engine.config, folder)
    except KeyboardInterrupt as e:
        stop = stop or e
    if record is not None:
        print(summary(folder, record))
    if stop is not None:
        print(f"interrupted: {len(game)} turn(s) saved in {folder}", file=sys.stderr, flush=True)
        return interrupt_exit(stop)
    return 0


#: ``play [SCRIPT|-] --flag ...``
COMMAND = game_command(define_flags, _play, __doc__, interrupted="nothing written for this game", setup=setup_jax)


def main(argv: list[str] | None = None) -> int:
    """Plays the game of ``argv`` (``[SCRIPT|-] --flag ...``); returns the exit status (2 with a
    one-line message on bad input, 130 on Ctrl-C, 143 on SIGTERM, which stops play like Ctrl-C)."""
    return run("animegamer-play", argv, COMMAND)


def cli() -> None:
    """Console script (pyproject.toml); a Ctrl-C after the command returned exits 130 at once
    (``cli.exit_finished``)."""
    exit_finished(main())


if __name__ == "__main__":
    cli()
