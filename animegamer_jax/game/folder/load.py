"""Reading a saved game back to play on (``play --continue``, the web app's saved games): every check a
game folder must pass, each failure one :class:`layout.SavedGameError` line naming the folder and the fix."""

from __future__ import annotations

import numpy as np

from animegamer_jax.io import fileio
from animegamer_jax.io import paths
from animegamer_jax.tokenizers.mllm_tokenizer import STATE_FIELDS as STATE_FIELD_NAMES
from animegamer_jax.game import characters
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.folder import layout
from animegamer_jax.game.folder.fingerprint import game_fingerprint, same_making
from animegamer_jax.game.run import METER_NAMES
from animegamer_jax.game.turn_by_turn import TurnByTurnGame
from animegamer_jax.inference.instructions import GameScriptError, parse_instruction
from animegamer_jax.inference.turn_model import STAGES


def _refuse(game_dir: str, why: str, fix: str) -> layout.SavedGameError:
    return layout.SavedGameError(f"cannot continue {game_dir}: {why}. Fix: {fix}")


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

    Checked, each failure one :class:`layout.SavedGameError` line naming the folder and the fix: a
    game folder of this project with a readable game.json; a save format this code reads (not
    newer); the same system (checkpoint identity) and effective config as ``engine`` (the game's
    fingerprint); every kept turn's files (video, GIF, state) with their recorded sizes and sha256,
    and each state record consistent with game.json; its reference images (game.json ``characters``,
    ``characters/<NAME>.png``, sha256 checked), which the game keeps for its next turns.

    Returns:
      (the game, its game.json record); the results' ``frames`` are None (not kept in memory).
    """
    if not layout.is_finished(game_dir):
        raise _refuse(game_dir, "it is not a game folder written by animegamer_jax (no "
                      f"{layout.MARKER} and {layout.GAME_JSON})", "pass the folder play wrote, <out>/<game id>")
    try:
        rec = layout.read_json(paths.join(game_dir, layout.GAME_JSON))
        turns, files, seed, fp = rec["turns"], rec["files"], int(rec["seed"]), rec["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        raise _refuse(game_dir, f"its {layout.GAME_JSON} is missing or damaged",
                      "replay the game (play SCRIPT --overwrite)") from None
    wrong = _wrong_type(rec)
    if wrong:
        raise _refuse(game_dir, f"its {layout.GAME_JSON} is damaged ({wrong})", "replay the game (play SCRIPT --overwrite)")
    save = rec.get("save")
    if not isinstance(save, dict):
        raise _refuse(game_dir, "it was saved before games could be continued (no state record)",
                      "replay it with this version (play SCRIPT --overwrite) to make it continuable")
    if int(save.get("format", 0)) > layout.SAVE_FORMAT:
        raise _refuse(game_dir, f"it was saved by a newer animegamer_jax (save format {save.get('format')}; this "
                      f"one reads up to {layout.SAVE_FORMAT})", "continue it with that newer version")
    try:
        chars = characters.from_record(rec.get("characters", []),
                                       lambda name: fileio.read_bytes(paths.join(game_dir, name)))
    except characters.CharacterError as e:
        raise _refuse(game_dir, str(e), "replay the game (play SCRIPT --overwrite --character ...)") from None
    if chars and not engine.supports_references:
        raise _refuse(game_dir, "its characters' turns need a system with a reference adapter",
                      "pass the --checkpoint it was played with")
    want = game_fingerprint(engine.config, rec.get("instructions", []), seed,
                            engine.model.identity or engine.model.label, characters.fingerprint_part(chars))
    parts = fp.get("parts", {}) if isinstance(fp, dict) else {}
    if parts.get("system") != want["parts"]["system"]:
        raise _refuse(game_dir, f"it was played by system {parts.get('system')!r}, this command plays "
                      f"{want['parts']['system']!r}", "pass the --checkpoint (or --standin) it was played with")
    changes = same_making(fp, want)
    if changes:
        raise _refuse(game_dir, "it was played with other settings (" + "; ".join(changes[:3])
                      + (f"; {len(changes) - 3} more" if len(changes) > 3 else "") + ")",
                      "pass the --config and --config.* overrides it was played with")
    n = len(turns) if upto is None else int(upto)
    if not 0 <= n <= len(turns):
        raise _refuse(game_dir, f"--from_turn {n} is beyond its {len(turns)} turn(s)",
                      f"pass --from_turn between 0 and {len(turns)}")
    timings_path = paths.join(game_dir, layout.TIMINGS_JSON)
    try:
        old_timings = layout.read_json(timings_path).get("turns", []) if fileio.isfile(timings_path) else []
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
            st = layout.decode_turn_state(fileio.read_bytes(paths.join(game_dir, t["state"])))
            ok = (int(st["turn"]) == k and int(st["seed"]) == seed
                  and [int(v) for v in st["states"]] == [t["states"][f] for f in STATE_FIELD_NAMES]
                  and [int(v) for v in st["meters"]] == [t["meters"][m] for m in METER_NAMES])
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise _refuse(game_dir, f"turn {k + 1}'s state record {t['state']} does not match {layout.GAME_JSON}", fix)
        ids = tuple(int(v) for v in st["text_ids"])
        states = tuple(int(v) for v in st["states"])
        try:
            turn = parse_instruction(t["instruction"], f"{game_dir}/{layout.GAME_JSON} turn {k + 1}")
        except GameScriptError as e:
            raise _refuse(game_dir, str(e), fix) from None
        timing = old_timings[k] if k < len(old_timings) else dict.fromkeys((f"{s}_s" for s in STAGES), 0.0)
        game.commit(turn, ids, np.asarray(states), st["rep"].astype(np.float32), None, timing)
        if game.results[-1].meters != {m: int(v) for m, v in zip(METER_NAMES, st["meters"])}:
            raise _refuse(game_dir, f"turn {k + 1}'s meters do not follow from its states (meter step {step})", fix)
    return game, rec
