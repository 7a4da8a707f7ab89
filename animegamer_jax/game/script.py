"""Game scripts: one instruction a line (paper form) or JSONL for batch generation.

Line form (the instruction grammar and the text policy: inference/instructions.py)::

    Character: Qiqi; Motion: gently fly on broomstick; Background: night sky.

Blank lines and lines starting with ``#`` are skipped. A UTF-8 BOM at the start of a file is dropped.

JSONL form, one game a line::

    {"game_id": "bunny-1", "seed": 3, "turns": ["Character: ...; Motion: ...; Background: ...", ...]}

``turns`` entries may also be objects ``{"character": ..., "motion": ..., "background": ...}``.
``seed`` is optional (a signed 64-bit integer). Any other key is an error.

Every problem raises :class:`GameScriptError` naming the file, the line and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from animegamer_jax.io import paths
from animegamer_jax.inference.instructions import (INSTRUCTION_FIX, KEY_ALIASES, SEED_RANGE, Game, GameScriptError,
                                                   Turn, check_text, is_plain_name, parse_instruction, refused_char)

_GAME_KEYS = {"game_id", "turns", "seed"}


def _where(path: str, line_no: int) -> str:
    return f"{path}:{line_no}"


def _read_text(path: str) -> str:
    p = paths.as_path(path)
    if not p.exists():
        raise GameScriptError(f"{path}: file not found. Fix: pass the path of an existing game script")
    if p.is_dir():
        raise GameScriptError(f"{path}: is a folder, not a game script. Fix: pass the path of a script file "
                              f"(one instruction a line, or .jsonl for generate)")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise GameScriptError(f"{path}: cannot be read ({e.strerror or e}). Fix: pass a readable game script") from None
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")  # accept a UTF-8 BOM
    except UnicodeDecodeError as e:
        line_no = raw[: e.start].count(b"\n") + 1
        raise GameScriptError(
            f"{_where(path, line_no)}: not valid UTF-8 (byte {raw[e.start]:#04x} at offset {e.start}). "
            f"Fix: save the file as UTF-8") from None


def _lines(text: str) -> list[str]:
    """``text``'s lines, split at ``\n`` only (and a CRLF's ``\r`` dropped): any other line break
    (VT, FF, U+2028, ...) stays in its line, where the text policy refuses it."""
    return [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]


def parse_lines(lines: Sequence[str], path: str = "<stdin>") -> tuple[Turn, ...]:
    """Parses instruction lines (``#`` comments and blank lines skipped).

    Raises:
      GameScriptError: a malformed line, or no instruction at all.
    """
    turns = []
    for i, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        turns.append(parse_instruction(line, _where(path, i)))
    if not turns:
        raise GameScriptError(f"{path}: the script has no instructions. Fix: {INSTRUCTION_FIX}")
    return tuple(turns)


def load_script(path: str, game_id: str | None = None, seed: int | None = None) -> Game:
    """Loads a one-instruction-a-line game script as a :class:`Game`.

    Args:
      path: a UTF-8 text file.
      game_id: default: the file name without extension.
      seed: optional sampling seed of the game.

    Raises:
      GameScriptError: missing file, non-UTF-8 bytes, empty script or a malformed line.
    """
    text = _read_text(path)
    gid = game_id or paths.as_path(path).stem
    return Game(gid, parse_lines(_lines(text), path), seed)


def _turn_from_json(obj: object, where: str) -> Turn:
    if isinstance(obj, str):
        return parse_instruction(obj, where)
    if isinstance(obj, dict):
        unknown = sorted(set(obj) - set(KEY_ALIASES))
        if unknown:
            raise GameScriptError(
                f"{where}: unknown turn key(s) {unknown}; use character, motion, background. "
                f"Fix: remove or rename them")
        parts = []
        for k, v in obj.items():
            if not isinstance(v, str):
                raise GameScriptError(f"{where}: turn field {k!r} must be a string, got {type(v).__name__}")
            parts.append(f"{k}: {v}")
        return parse_instruction("; ".join(parts), where)
    raise GameScriptError(
        f"{where}: a turn must be an instruction string or an object, got {type(obj).__name__}")


def load_jsonl(path: str) -> tuple[Game, ...]:
    """Loads a batch of games, one JSON object a line.

    Raises:
      GameScriptError: non-UTF-8, invalid JSON, a missing or unknown key, an empty turn list,
        a non-integer seed, a duplicated ``game_id`` or an empty file.
    """
    text = _read_text(path)
    games: list[Game] = []
    seen: dict[str, int] = {}
    for i, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        where = _where(path, i)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise GameScriptError(f"{where}: invalid JSON ({e.msg} at column {e.colno}). Fix: write one "
                                  f'object per line, e.g. {{"game_id": "g1", "turns": ["..."]}}') from None
        if not isinstance(obj, dict):
            raise GameScriptError(f"{where}: each line must be a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - _GAME_KEYS)
        if unknown:
            raise GameScriptError(f"{where}: unknown key(s) {unknown}; allowed: game_id, turns, seed. "
                                  f"Fix: remove or rename them")
        for key in ("game_id", "turns"):
            if key not in obj:
                raise GameScriptError(f"{where}: missing key {key!r}. Fix: add it to the object")
        gid = obj["game_id"]
        if isinstance(gid, str) and refused_char(gid) is not None:
            check_text(gid, f"{where}: game_id")
        if not is_plain_name(gid):
            raise GameScriptError(f"{where}: game_id must be a plain folder name (no '/', '\\\\', leading '.', "
                                  f"'..' or surrounding spaces), got {gid!r}. Fix: use e.g. 'bunny-1'")
        if gid in seen:
            raise GameScriptError(f"{where}: game_id {gid!r} already used on line {seen[gid]}. Fix: make ids unique")
        seen[gid] = i
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise GameScriptError(f"{where}: 'turns' must be a non-empty list of instructions")
        seed = obj.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                                 or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
            raise GameScriptError(f"{where}: 'seed' must be an integer from -2**63 to 2**63 - 1, got {seed!r}")
        parsed = tuple(_turn_from_json(t, f"{where} turn {j}") for j, t in enumerate(turns))
        games.append(Game(gid, parsed, seed))
    if not games:
        raise GameScriptError(f'{path}: no games in the file. Fix: write one JSON object per line, e.g. '
                              f'{{"game_id": "g1", "turns": ["Character: ...; Motion: ...; Background: ..."]}}')
    return tuple(games)


def load_games(path: str) -> tuple[Game, ...]:
    """Loads ``.jsonl`` files with :func:`load_jsonl`, anything else as one line-form game."""
    if path.endswith(".jsonl"):
        return load_jsonl(path)
    return (load_script(path),)
