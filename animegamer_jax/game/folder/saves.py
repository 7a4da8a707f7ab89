"""Saving played games: game.json's record of a game (:func:`game_record`), a whole game or a turn at a time,
a turn dropped, a branch; which games of a batch still need playing; play's summary lines. Each takes the
config and the identity of the system that played (a TurnModel's label, identity and description)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from animegamer_jax.io import fileio
from animegamer_jax.io import paths
from animegamer_jax.tokenizers.mllm_tokenizer import STATE_FIELDS as STATE_FIELD_NAMES
from animegamer_jax.game import characters
from animegamer_jax.game.folder import atomic, layout
from animegamer_jax.game.folder.fingerprint import game_fingerprint
from animegamer_jax.game.run import METER_NAMES
from animegamer_jax.game.turn_by_turn import TurnByTurnGame
from animegamer_jax.inference.clip_sampler import turn_key
from animegamer_jax.inference.instructions import Game
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import TurnRecord
from animegamer_jax.inference.turn_model import STAGES

#: what a turn's state record (``turn_NNN.state.npz``) holds, as game.json ``save.state`` says it
STATE_FIELDS = ("turn: int64 k; seed: int64 game seed; text_ids: int32 instruction ids; states: int32 [4] "
                "(ML, SC, ET, ST); rep: float32 [Q, D] s_a; meters: int32 [3] (social, entertainment, stamina) "
                "after the turn; key: uint32 [2] turn k's sampler key; next_key: turn k+1's")


class SystemIdentity(Protocol):
    """What a game folder records of the system that played it (inference/turn_model.py ``TurnModel``
    has these): ``label`` (shown), ``identity`` (the weights' digest for fingerprints; "" = the label),
    ``description`` (shown; "" when none)."""

    label: str
    identity: str
    description: str


def game_record(config, system: SystemIdentity, result: dict, write_s: float | None = None) -> dict:
    """The game.json content of a played game (atomic.py writes it): ``result`` is one game's
    ``GameEngine.play`` result (or ``TurnByTurnGame.result()``), ``config`` the config that played it."""
    game: Game = result["game"]
    turns = []
    for k, (turn, tr, tm) in enumerate(zip(game.turns, result["turns"], result["timings"])):
        turns.append({
            "turn": k,
            "instruction": turn.text,
            "states": dict(zip(STATE_FIELD_NAMES, tr.states)),
            "meters": tr.meters,
            "turn_seed": {"game_seed": result["seed"], "turn": k,
                          "key": [int(v) for v in turn_key(result["seed"], k)]},
            "timings_s": tm,
        })
    cfg = apply_mode(config)
    totals = {s: float(sum(t[f"{s}_s"] for t in result["timings"])) for s in STAGES}
    if write_s is not None:
        totals["writing"] = write_s
    record = {
        "game_id": game.game_id,
        "config": cfg.name,
        "mode": cfg.game.mode,
        "history_window": cfg.mllm.history_window,
        "readout": cfg.mllm.readout,
        "cfg_schedule": cfg.diffusion.cfg_schedule,
        "system": system.label,
        "system_description": system.description,
        "seed": result["seed"],
        "fps": cfg.game.fps,
        "meter_start": int(cfg.game.meter_start),
        "instructions": [t.text for t in game.turns],
        "states": [list(tr.states) for tr in result["turns"]],
        "meters": [tr.meters for tr in result["turns"]],
        "turns": turns,
        "timings_s": {"run": totals, "compile": result.get("compile_s", {})},
    }
    if str(cfg.game.get("decoder", "full")) != "full":  # only the preview modes: "full" games as before
        record["decoder"] = str(cfg.game.decoder)
    if game.characters:  # only games with --character: the others' game.json is as before
        record["characters"] = characters.record_entries(game.characters)
        for t, turn in zip(turns, game.turns):
            c = characters.named(game.characters, turn.character)
            if c is not None:
                t["reference"] = c.file
    return record


def fingerprint_of(config, system: SystemIdentity, game: Game, seed: int) -> dict:
    """What makes ``game``'s outputs when ``system`` plays it with ``config`` and ``seed``
    (fingerprint.py ``game_fingerprint``): stored in game.json, compared when a game is continued or
    generate resumes."""
    return game_fingerprint(config, [t.text for t in game.turns], seed, system.identity or system.label,
                            characters.fingerprint_part(game.characters))


def turn_state(rec: TurnRecord, meters: dict, seed: int, k: int) -> bytes:
    """The state record of turn ``k`` (layout.py ``encode_turn_state`` bytes; :data:`STATE_FIELDS`):
    everything the next turn needs besides the earlier turns' records."""
    return layout.encode_turn_state({
        "turn": np.asarray(k, np.int64), "seed": np.asarray(seed, np.int64),
        "text_ids": np.asarray(rec.text_ids, np.int32), "states": np.asarray(rec.states, np.int32),
        "rep": np.asarray(rec.rep, np.float32), "meters": np.asarray([meters[m] for m in METER_NAMES], np.int32),
        "key": turn_key(seed, k), "next_key": turn_key(seed, k + 1)})


def _record(config, system: SystemIdentity, result: dict, frame_size) -> dict:
    record = game_record(config, system, result)
    record["save"] = {"format": layout.SAVE_FORMAT, "state": STATE_FIELDS, "frame_size": [int(v) for v in frame_size]}
    return record


def save_game(config, system: SystemIdentity, result: dict, out_dir: str, overwrite: bool = False) -> tuple[str, dict]:
    """Writes a played game atomically; returns (folder, record with ``timings_s``, writing included).

    The write is a :func:`fileio.signals_held` section: a Ctrl-C or SIGTERM that arrives while it runs
    waits for it, so a game whose save has begun is on disk before the command stops.

    Args:
      config: the config that played it.
      system: the system that played it (its label, identity, description: :class:`SystemIdentity`).
      result: one game's ``GameEngine.play`` result (or ``TurnByTurnGame.result()``): its ``text_ids``
        (each turn's instruction ids) go to the state records.
      out_dir: parent folder of the game folder ``<out_dir>/<game_id>/``.
      overwrite: replace a finished game of this project already there.

    Raises:
      layout.OutputError: the target is not ours, or holds an earlier game and not ``overwrite``.
    """
    frames = [tr.frames for tr in result["turns"]]
    record = _record(config, system, result, np.shape(frames[0])[1:3])
    records = [TurnRecord(tuple(ids), tr.states, np.asarray(tr.rep, np.float32))
               for ids, tr in zip(result["text_ids"], result["turns"])]
    states = [turn_state(rec, tr.meters, result["seed"], k) for k, (rec, tr) in enumerate(zip(records, result["turns"]))]
    with fileio.signals_held():
        folder = atomic.write_game(out_dir, result["game"].game_id, record, frames, config.game.fps,
                                   config.game.write_gif, config.game.contact_sheet_columns, overwrite=overwrite,
                                   fingerprint=fingerprint_of(config, system, result["game"], result["seed"]),
                                   turn_states=states, extra_files=characters.files_of(result["game"].characters))
    timings = layout.read_json(paths.join(folder, layout.TIMINGS_JSON))
    record["timings_s"]["run"]["writing"] = timings["run"]["writing"]
    return folder, record


def save_turn(config, system: SystemIdentity, game: TurnByTurnGame, out_dir: str, new_folder: bool,
              overwrite: bool = False) -> tuple[str, dict]:
    """Saves ``game``'s last turn; returns (folder, record).

    ``new_folder``: the folder does not hold this game yet: the whole game (every turn's frames in
    ``game.results``) is written as :func:`save_game` does (``overwrite`` as there). Else the folder
    holds every turn before the last, and only the last turn's files and the index are written
    (atomic.py ``append_turn``). Call it inside a ``fileio.signals_held`` section.
    """
    result = game.result()
    if new_folder:
        return save_game(config, system, result, out_dir, overwrite=overwrite)
    folder = paths.join(out_dir, game.game_id)
    k = len(game) - 1
    tr = game.results[k]
    record = _record(config, system, result, np.shape(tr.frames)[1:3])
    state = turn_state(game.run.history[k], tr.meters, game.seed, k)
    atomic.append_turn(folder, record, tr.frames, state, config.game.fps, config.game.write_gif,
                       fingerprint=fingerprint_of(config, system, result["game"], game.seed))
    return folder, record


def drop_turn(config, system: SystemIdentity, game: TurnByTurnGame, out_dir: str) -> str:
    """Removes from ``game``'s save the turn after its last (``game`` was just undone in memory and
    keeps at least one turn): atomic.py ``drop_last_turn``, the cost not growing with the game. Call
    it inside a ``fileio.signals_held`` section. Returns the folder."""
    folder = paths.join(out_dir, game.game_id)
    old = layout.read_json(paths.join(folder, layout.GAME_JSON))
    result = game.result()
    record = _record(config, system, result, old["save"]["frame_size"])
    atomic.drop_last_turn(folder, record, fingerprint=fingerprint_of(config, system, result["game"], game.seed))
    return folder


def finish_session(config, folder: str) -> dict:
    """Remakes the game video, contact sheet and gallery of a game saved turn by turn
    (atomic.py ``write_derived``, at ``config``'s fps and contact sheet columns: once, when a play
    session ends); returns its game.json with the session's timings (timings.json) as ``timings_s``."""
    atomic.write_derived(folder, config.game.fps, config.game.contact_sheet_columns)
    record = layout.read_json(paths.join(folder, layout.GAME_JSON))
    timings_path = paths.join(folder, layout.TIMINGS_JSON)
    record["timings_s"] = layout.read_json(timings_path) if fileio.isfile(timings_path) else {"run": {}, "compile": {}}
    record["timings_s"].setdefault("run", {})
    record["timings_s"].setdefault("compile", {})
    return record


def branch_game(config, system: SystemIdentity, src_dir: str, game: TurnByTurnGame, out_dir: str) -> str:
    """Starts a new game folder ``<out_dir>/<game.game_id>`` holding ``game``'s turns, which are the
    first turns of the saved game ``src_dir`` (load.py ``load_game`` with ``upto``): their files are
    copied, ``src_dir`` is only read. Atomic (a temp folder renamed into place). Returns the folder.

    Raises:
      layout.OutputError: the target exists (a branch never replaces a game) or is not writable.
    """
    result = game.result()
    src = layout.read_json(paths.join(src_dir, layout.GAME_JSON))
    record = game_record(config, system, result)
    record["save"] = dict(src["save"], derived={"turns": 0})
    with fileio.signals_held():
        return atomic.copy_turns(src_dir, out_dir, game.game_id, record,
                                 fingerprint_of(config, system, result["game"], game.seed))


def pending_games(games: Sequence[Game], out_dir: str, process_index: int = 0, process_count: int = 1,
                  fingerprint: Callable[[Game], dict] | None = None,
                  overwrite: bool = False) -> tuple[list[Game], int, dict[str, str]]:
    """This process's share of the games that still need playing.

    A game is kept (skipped) only when its folder is a finished game of this project whose
    fingerprint equals ``fingerprint(game)`` (:func:`fingerprint_of`) and whose files are all present
    with their recorded sizes and hashes (layout.py ``verify_game``); otherwise it is replayed. Temp
    folders a killed run left for these games are removed.

    Returns:
      (games to play, number kept as finished, ``{game_id: why it is replayed}`` for games whose
      folder exists but cannot be kept).

    Raises:
      layout.OutputError: a game's folder exists and was not written by this program (nothing is
        played then: the user's folder survives).
    """
    mine = list(games[process_index::process_count])
    todo, replay = [], {}
    for g in mine:
        atomic.clean_stale_temp(out_dir, g.game_id)
        folder = paths.join(out_dir, g.game_id)
        if not fileio.exists(folder) or (fileio.isdir(folder) and not fileio.listdir(folder)):
            todo.append(g)
            continue
        if not layout.is_game_folder(folder):
            layout.check_target(out_dir, g.game_id, overwrite=True)  # raises, naming the folder
        why = "--overwrite" if overwrite else layout.verify_game(
            folder, fingerprint(g) if fingerprint is not None else None)
        if why is not None:
            todo.append(g)
            replay[g.game_id] = why
    return todo, len(mine) - len(todo), replay


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
