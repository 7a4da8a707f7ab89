"""Saving played games and reporting them: what play, generate, the web app and the game benchmark share.

* :func:`save_game` writes a :meth:`GameEngine.play` result in the game/writers.py layout (the
  game.json record, :func:`game_record`; the :func:`fingerprint` of what made it);
* :func:`save_turn` saves a game played a turn at a time (a new folder on its first turn, then
  ``writers.append_turn``: the cost of a save does not grow with the game), :func:`finish_session`
  remakes its game video and contact sheet when a play session ends;
* :func:`load_game` reads a saved game back (checked: the save format, the system and config that
  played it, every turn's files) as a :class:`TurnByTurnGame` to play on (``play --continue``),
  :func:`branch_game` starts a new game folder from the first turns of another;
* :func:`pending_games` picks the games of a batch run that still need playing (resume);
* :func:`print_turn` and :func:`summary` are the console lines of one turn and of a saved game.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.tokenizers.mllm_tokenizer import STATE_FIELDS as STATE_FIELD_NAMES
from animegamer_jax.game import characters, writers
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.run import METER_NAMES, TurnResult
from animegamer_jax.game.turn_by_turn import TurnByTurnGame
from animegamer_jax.inference.clip_sampler import turn_key
from animegamer_jax.inference.instructions import Game, GameScriptError, parse_instruction
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import TurnRecord, encode_instruction
from animegamer_jax.inference.turn_model import STAGES

#: what a turn's state record (``turn_NNN.state.npz``) holds, as game.json ``save.state`` says it
STATE_FIELDS = ("turn: int64 k; seed: int64 game seed; text_ids: int32 instruction ids; states: int32 [4] "
                "(ML, SC, ET, ST); rep: float32 [Q, D] s_a; meters: int32 [3] (social, entertainment, stamina) "
                "after the turn; key: uint32 [2] turn k's sampler key; next_key: turn k+1's")


def game_record(config, result: dict, system_label: str, write_s: float | None = None,
                system_description: str = "") -> dict:
    """The game.json content of a played game (game/writers.py writes it); ``system_description``
    is the turn model's ``description`` (inference/turn_model.py)."""
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
        "system": system_label,
        "system_description": system_description,
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


def fingerprint(engine: GameEngine, game: Game, seed: int) -> dict:
    """What makes ``game``'s outputs when ``engine`` plays it with ``seed``
    (``writers.game_fingerprint``): stored in game.json, compared when generate resumes."""
    return writers.game_fingerprint(engine.config, [t.text for t in game.turns], seed,
                                    engine.model.identity or engine.model.label,
                                    characters.fingerprint_part(game.characters))


def turn_state(rec: TurnRecord, meters: dict, seed: int, k: int) -> bytes:
    """The state record of turn ``k`` (``writers.encode_turn_state`` bytes; :data:`STATE_FIELDS`):
    everything the next turn needs besides the earlier turns' records."""
    return writers.encode_turn_state({
        "turn": np.asarray(k, np.int64), "seed": np.asarray(seed, np.int64),
        "text_ids": np.asarray(rec.text_ids, np.int32), "states": np.asarray(rec.states, np.int32),
        "rep": np.asarray(rec.rep, np.float32), "meters": np.asarray([meters[m] for m in METER_NAMES], np.int32),
        "key": turn_key(seed, k), "next_key": turn_key(seed, k + 1)})


def _records(engine: GameEngine, result: dict) -> list[TurnRecord]:
    """The window records of a result's turns (its instructions' ids, states, s_a)."""
    ids = result.get("text_ids") or [encode_instruction(t.text, engine.spec, engine.tok) for t in result["game"].turns]
    return [TurnRecord(tuple(i), tr.states, np.asarray(tr.rep, np.float32)) for i, tr in zip(ids, result["turns"])]


def _record(engine: GameEngine, result: dict, frame_size) -> dict:
    record = game_record(engine.config, result, engine.model.label, system_description=engine.model.description)
    record["save"] = {"format": writers.SAVE_FORMAT, "state": STATE_FIELDS, "frame_size": [int(v) for v in frame_size]}
    return record


def save_game(engine: GameEngine, result: dict, out_dir: str, overwrite: bool = False) -> tuple[str, dict]:
    """Writes a played game atomically; returns (folder, record with ``timings_s``, writing included).

    The write is a :func:`fileio.signals_held` section: a Ctrl-C or SIGTERM that arrives while it runs
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
    frames = [tr.frames for tr in result["turns"]]
    record = _record(engine, result, np.shape(frames[0])[1:3])
    states = [turn_state(rec, tr.meters, result["seed"], k)
              for k, (rec, tr) in enumerate(zip(_records(engine, result), result["turns"]))]
    with fileio.signals_held():
        folder = writers.write_game(out_dir, result["game"].game_id, record, frames, cfg.game.fps,
                                    cfg.game.write_gif, cfg.game.contact_sheet_columns, overwrite=overwrite,
                                    fingerprint=fingerprint(engine, result["game"], result["seed"]),
                                    turn_states=states, extra_files=characters.files_of(result["game"].characters))
    timings = writers.read_json(paths.join(folder, writers.TIMINGS_JSON))
    record["timings_s"]["run"]["writing"] = timings["run"]["writing"]
    return folder, record


def save_turn(engine: GameEngine, game: TurnByTurnGame, out_dir: str, new_folder: bool,
              overwrite: bool = False) -> tuple[str, dict]:
    """Saves ``game``'s last turn; returns (folder, record).

    ``new_folder``: the folder does not hold this game yet: the whole game (every turn's frames in
    ``game.results``) is written as :func:`save_game` does (``overwrite`` as there). Else the folder
    holds every turn before the last, and only the last turn's files and the index are written
    (``writers.append_turn``). Call it inside a ``fileio.signals_held`` section.
    """
    result = game.result()
    if new_folder:
        return save_game(engine, result, out_dir, overwrite=overwrite)
    folder = paths.join(out_dir, game.game_id)
    k = len(game) - 1
    tr = game.results[k]
    record = _record(engine, result, np.shape(tr.frames)[1:3])
    state = turn_state(game.run.history[k], tr.meters, game.seed, k)
    cfg = engine.config
    writers.append_turn(folder, record, tr.frames, state, cfg.game.fps, cfg.game.write_gif,
                        fingerprint=fingerprint(engine, result["game"], game.seed))
    return folder, record


def drop_turn(engine: GameEngine, game: TurnByTurnGame, out_dir: str) -> str:
    """Removes from ``game``'s save the turn after its last (``game`` was just undone in memory and
    keeps at least one turn): ``writers.drop_last_turn``, the cost not growing with the game. Call
    it inside a ``fileio.signals_held`` section. Returns the folder."""
    folder = paths.join(out_dir, game.game_id)
    old = writers.read_json(paths.join(folder, writers.GAME_JSON))
    result = game.result()
    record = _record(engine, result, old["save"]["frame_size"])
    writers.drop_last_turn(folder, record, fingerprint=fingerprint(engine, result["game"], game.seed))
    return folder


def finish_session(engine: GameEngine, folder: str) -> dict:
    """Remakes the game video, contact sheet and gallery of a game saved turn by turn
    (``writers.write_derived``: once, when a play session ends); returns its game.json with the
    session's timings (timings.json) as ``timings_s``."""
    writers.write_derived(folder, engine.config.game.fps, engine.config.game.contact_sheet_columns)
    record = writers.read_json(paths.join(folder, writers.GAME_JSON))
    timings_path = paths.join(folder, writers.TIMINGS_JSON)
    record["timings_s"] = writers.read_json(timings_path) if fileio.isfile(timings_path) else {"run": {}, "compile": {}}
    record["timings_s"].setdefault("run", {})
    record["timings_s"].setdefault("compile", {})
    return record


def _refuse(game_dir: str, why: str, fix: str) -> writers.SavedGameError:
    return writers.SavedGameError(f"cannot continue {game_dir}: {why}. Fix: {fix}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _wrong_type(rec: dict) -> str | None:
    """What of a game.json (valid JSON) :func:`load_game` reads has the wrong type, as ``"turns[1].states
    is not an object"``, or None when every field it reads is of its type."""
    def kinds(value, want, name):
        return None if isinstance(value, want) else f"{name} is not {_KIND_WORDS[want]}"

    checks = [kinds(rec.get("turns"), list, "turns"), kinds(rec.get("files"), dict, "files"),
              None if _is_int(rec.get("seed")) else "seed is not an integer",
              kinds(rec.get("instructions", []), list, "instructions"),
              kinds(rec.get("characters", []), list, "characters"),
              None if rec.get("fingerprint") is None or isinstance(rec["fingerprint"], dict)
              else "fingerprint is not an object"]
    save = rec.get("save")
    if isinstance(save, dict) and "format" in save and not _is_int(save["format"]):
        checks.append("save.format is not an integer")
    if isinstance(rec.get("instructions"), list):
        checks += [kinds(v, str, f"instructions[{i}]") for i, v in enumerate(rec["instructions"])]
    if isinstance(rec.get("characters"), list):
        for i, c in enumerate(rec["characters"]):
            checks.append(kinds(c, dict, f"characters[{i}]") or next(
                (f"characters[{i}].{k} is not a string" for k in ("name", "image", "sha256")
                 if not isinstance(c.get(k), str)), None))
    if isinstance(rec.get("files"), dict):
        for name, e in rec["files"].items():
            checks.append(kinds(e, dict, f"files[{name!r}]") or (
                None if _is_int(e.get("size")) and isinstance(e.get("sha256"), str)
                else f"files[{name!r}] has no integer size and string sha256"))
    if isinstance(rec.get("turns"), list):
        for k, t in enumerate(rec["turns"]):
            where = f"turns[{k}]"
            checks.append(kinds(t, dict, where))
            if not isinstance(t, dict):
                continue
            checks.append(kinds(t.get("instruction"), str, f"{where}.instruction"))
            checks += [kinds(t[key], str, f"{where}.{key}") for key in ("video", "gif", "state")
                       if t.get(key) is not None]
            for key, fields in (("states", STATE_FIELD_NAMES), ("meters", METER_NAMES)):
                v = t.get(key)
                checks.append(kinds(v, dict, f"{where}.{key}") or next(
                    (f"{where}.{key}.{f} is not an integer" for f in fields if not _is_int(v.get(f))), None))
    return next((c for c in checks if c), None)


_KIND_WORDS = {list: "a list", dict: "an object", str: "a string"}


def load_game(engine: GameEngine, game_dir: str, upto: int | None = None,
              game_id: str | None = None) -> tuple[TurnByTurnGame, dict]:
    """The saved game in ``game_dir`` as a :class:`TurnByTurnGame` holding its first ``upto`` turns
    (default: all), ready to play on: the MLLM window rebuilt exactly from the turns' state records
    (ids, states, s_a), the meters, the seed and turn count. Nothing is written.

    Checked, each failure one :class:`writers.SavedGameError` line naming the folder and the fix: a
    game folder of this project with a readable game.json; a save format this code reads (not
    newer); the same system (checkpoint identity) and effective config as ``engine`` (the game's
    fingerprint); every kept turn's files (video, GIF, state) with their recorded sizes and sha256,
    and each state record consistent with game.json; its reference images (game.json ``characters``,
    ``characters/<NAME>.png``, sha256 checked), which the game keeps for its next turns.

    Returns:
      (the game, its game.json record); the results' ``frames`` are None (not kept in memory).
    """
    if not writers.is_finished(game_dir):
        raise _refuse(game_dir, "it is not a game folder written by animegamer_jax (no "
                      f"{writers.MARKER} and {writers.GAME_JSON})", "pass the folder play wrote, <out>/<game id>")
    try:
        rec = writers.read_json(paths.join(game_dir, writers.GAME_JSON))
        turns, files, seed, fp = rec["turns"], rec["files"], int(rec["seed"]), rec["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        raise _refuse(game_dir, f"its {writers.GAME_JSON} is missing or damaged",
                      "replay the game (play SCRIPT --overwrite)") from None
    wrong = _wrong_type(rec)
    if wrong:
        raise _refuse(game_dir, f"its {writers.GAME_JSON} is damaged ({wrong})", "replay the game (play SCRIPT --overwrite)")
    save = rec.get("save")
    if not isinstance(save, dict):
        raise _refuse(game_dir, "it was saved before games could be continued (no state record)",
                      "replay it with this version (play SCRIPT --overwrite) to make it continuable")
    if int(save.get("format", 0)) > writers.SAVE_FORMAT:
        raise _refuse(game_dir, f"it was saved by a newer animegamer_jax (save format {save.get('format')}; this "
                      f"one reads up to {writers.SAVE_FORMAT})", "continue it with that newer version")
    try:
        chars = characters.from_record(rec.get("characters", []),
                                       lambda name: fileio.read_bytes(paths.join(game_dir, name)))
    except characters.CharacterError as e:
        raise _refuse(game_dir, str(e), "replay the game (play SCRIPT --overwrite --character ...)") from None
    if chars and not engine.supports_references:
        raise _refuse(game_dir, "its characters' turns need a system with a reference adapter",
                      "pass the --checkpoint it was played with")
    want = writers.game_fingerprint(engine.config, rec.get("instructions", []), seed,
                                    engine.model.identity or engine.model.label,
                                    characters.fingerprint_part(chars))
    parts = fp.get("parts", {}) if isinstance(fp, dict) else {}
    if parts.get("system") != want["parts"]["system"]:
        raise _refuse(game_dir, f"it was played by system {parts.get('system')!r}, this command plays "
                      f"{want['parts']['system']!r}", "pass the --checkpoint (or --standin) it was played with")
    changes = writers.same_making(fp, want)
    if changes:
        raise _refuse(game_dir, "it was played with other settings (" + "; ".join(changes[:3])
                      + (f"; {len(changes) - 3} more" if len(changes) > 3 else "") + ")",
                      "pass the --config and --config.* overrides it was played with")
    n = len(turns) if upto is None else int(upto)
    if not 0 <= n <= len(turns):
        raise _refuse(game_dir, f"--from_turn {n} is beyond its {len(turns)} turn(s)",
                      f"pass --from_turn between 0 and {len(turns)}")
    timings_path = paths.join(game_dir, writers.TIMINGS_JSON)
    try:
        old_timings = writers.read_json(timings_path).get("turns", []) if fileio.isfile(timings_path) else []
    except (OSError, ValueError):
        old_timings = []
    game = TurnByTurnGame(engine, game_id or game_dir.rstrip("/").rsplit("/", 1)[-1], seed, characters=chars)
    step = int(engine.config.game.meter_step)
    for k in range(n):
        t = turns[k]
        fix = (f"branch from the intact turns: play --continue {game_dir} --from_turn {k} --out ELSEWHERE"
               if k else "replay the game (play SCRIPT --overwrite)")
        for key in ("video", "gif", "state"):
            name = t.get(key)
            if key == "state" and not name:
                raise _refuse(game_dir, f"turn {k + 1} has no state record", fix)
            if name is None:
                continue
            path, entry = paths.join(game_dir, name), files.get(name)
            if entry is None or not fileio.isfile(path) or fileio.size(path) != entry["size"] \
                    or fileio.sha256_file(path) != entry["sha256"]:
                raise _refuse(game_dir, f"turn {k + 1}'s file {name} is missing or damaged", fix)
        try:
            st = writers.decode_turn_state(fileio.read_bytes(paths.join(game_dir, t["state"])))
            ok = (int(st["turn"]) == k and int(st["seed"]) == seed
                  and [int(v) for v in st["states"]] == [t["states"][f] for f in STATE_FIELD_NAMES]
                  and [int(v) for v in st["meters"]] == [t["meters"][m] for m in METER_NAMES])
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise _refuse(game_dir, f"turn {k + 1}'s state record {t['state']} does not match {writers.GAME_JSON}", fix)
        ids = tuple(int(v) for v in st["text_ids"])
        states = tuple(int(v) for v in st["states"])
        try:
            turn = parse_instruction(t["instruction"], f"{game_dir}/{writers.GAME_JSON} turn {k + 1}")
        except GameScriptError as e:
            raise _refuse(game_dir, str(e), fix) from None
        timing = old_timings[k] if k < len(old_timings) else dict.fromkeys((f"{s}_s" for s in STAGES), 0.0)
        game.commit(turn, ids, np.asarray(states), st["rep"].astype(np.float32), None, timing)
        if game.results[-1].meters != {m: int(v) for m, v in zip(METER_NAMES, st["meters"])}:
            raise _refuse(game_dir, f"turn {k + 1}'s meters do not follow from its states (meter step {step})", fix)
    return game, rec


def branch_game(src_dir: str, game: TurnByTurnGame, engine: GameEngine, out_dir: str) -> str:
    """Starts a new game folder ``<out_dir>/<game.game_id>`` holding ``game``'s turns, which are the
    first turns of the saved game ``src_dir`` (:func:`load_game` with ``upto``): their files are
    copied, ``src_dir`` is only read. Atomic (a temp folder renamed into place). Returns the folder.

    Raises:
      writers.OutputError: the target exists (a branch never replaces a game) or is not writable.
    """
    result = game.result()
    src = writers.read_json(paths.join(src_dir, writers.GAME_JSON))
    record = game_record(engine.config, result, engine.model.label, system_description=engine.model.description)
    record["save"] = dict(src["save"], derived={"turns": 0})
    with fileio.signals_held():
        return writers.copy_turns(src_dir, out_dir, game.game_id, record,
                                  fingerprint(engine, result["game"], game.seed))


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
          + (f" (preview {timing['preview_s']:.2f}s)" if "preview_s" in timing else "")
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
