"""Saving played games and reporting them: what play, generate, the web app and the game benchmark share.

* :func:`save_game` writes a :meth:`GameEngine.play` result in the game/writers.py layout (the
  game.json record from ``engine.game_record``, the :func:`fingerprint` of what made it);
* :func:`pending_games` picks the games of a batch run that still need playing (resume);
* :func:`print_turn` and :func:`summary` are the console lines of one turn and of a saved game.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from animegamer_jax import cli, fileio, paths
from animegamer_jax.game import writers
from animegamer_jax.game.api import TurnResult
from animegamer_jax.game.engine import GameEngine, game_record
from animegamer_jax.game.script import Game


def fingerprint(engine: GameEngine, game: Game, seed: int) -> dict:
    """What makes ``game``'s outputs when ``engine`` plays it with ``seed``
    (``writers.game_fingerprint``): stored in game.json, compared when generate resumes."""
    return writers.game_fingerprint(engine.config, [t.text for t in game.turns], seed,
                                    engine.system.identity or engine.system.label)


def save_game(engine: GameEngine, result: dict, out_dir: str, overwrite: bool = False) -> tuple[str, dict]:
    """Writes a played game atomically; returns (folder, record with ``timings_s``, writing included).

    The write is a :func:`cli.signals_held` section: a Ctrl-C or SIGTERM that arrives while it runs
    waits for it, so a game whose save has begun is on disk before the command stops.

    Args:
      engine: the engine that played it (config, system label and identity).
      result: one game's :meth:`GameEngine.play` result (or ``TurnByTurnGame.result()``).
      out_dir: parent folder of the game folder ``<out_dir>/<game_id>/``.
      overwrite: replace a finished game of this project already there.

    Raises:
      writers.OutputError: the target is not ours, or holds an earlier game and not ``overwrite``.
    """
    cfg = engine.config
    record = game_record(cfg, result, engine.system.label, system_description=engine.system.description)
    frames = [tr.frames for tr in result["turns"]]
    with cli.signals_held():
        folder = writers.write_game(out_dir, result["game"].game_id, record, frames, cfg.game.fps,
                                    cfg.game.write_gif, cfg.game.contact_sheet_columns, overwrite=overwrite,
                                    fingerprint=fingerprint(engine, result["game"], result["seed"]))
    timings = writers.read_json(paths.join(folder, writers.TIMINGS_JSON))
    record["timings_s"]["run"]["writing"] = timings["run"]["writing"]
    return folder, record


def pending_games(games: Sequence[Game], out_dir: str, process_index: int = 0, process_count: int = 1,
                  fingerprint_of: Callable[[Game], dict] | None = None,
                  overwrite: bool = False) -> tuple[list[Game], int, dict[str, str]]:
    """This process's share of the games that still need playing.

    A game is kept (skipped) only when its folder is a finished game of this project whose
    fingerprint equals ``fingerprint_of(game)`` and whose files are all present with their recorded
    sizes and hashes (writers.verify_game); otherwise it is replayed. Temp folders a killed run left
    for these games are removed.

    Returns:
      (games to play, number kept as finished, ``{game_id: why it is replayed}`` for games whose
      folder exists but cannot be kept).

    Raises:
      writers.OutputError: a game's folder exists and was not written by this program (nothing is
        played then: the user's folder survives).
    """
    mine = list(games[process_index::process_count])
    todo, replay = [], {}
    for g in mine:
        writers.clean_stale_temp(out_dir, g.game_id)
        folder = paths.join(out_dir, g.game_id)
        if not fileio.exists(folder) or (fileio.isdir(folder) and not fileio.listdir(folder)):
            todo.append(g)
            continue
        if not writers.is_game_folder(folder):
            writers.check_target(out_dir, g.game_id, overwrite=True)  # raises, naming the folder
        why = "--overwrite" if overwrite else writers.verify_game(
            folder, fingerprint_of(g) if fingerprint_of is not None else None)
        if why is not None:
            todo.append(g)
            replay[g.game_id] = why
    return todo, len(mine) - len(todo), replay


def print_turn(k: int, text: str, tr: TurnResult, timing: dict) -> None:
    """Prints turn ``k``'s instruction, states, meters, stage wall times and the time to first frame /
    turn time from the turn's start, compiles included (two lines, stdout)."""
    ml, sc, et, st = tr.states
    m = tr.meters
    print(f"turn {k + 1}: {text}\n  states ML={ml} SC={sc:+d} ET={et:+d} ST={st:+d} | social {m['social']} "
          f"entertainment {m['entertainment']} stamina {m['stamina']} | mllm {timing['mllm_s']:.2f}s "
          f"sampling {timing['sampling_s']:.2f}s vae {timing['vae_s']:.2f}s"
          + (f" | first frame {timing['ttff_s']:.2f}s turn {timing['turn_s']:.2f}s" if "ttff_s" in timing else ""),
          flush=True)


def summary(folder: str, record: dict) -> str:
    """The lines play prints after saving a game: its files, system and stage wall times."""
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
