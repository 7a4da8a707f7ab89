"""Game scripts: one instruction a line (paper form) or JSONL for batch generation.

Line form (docs/token_layout.md#instruction-text, the release's ``game_demo/demo.txt``)::

    Character: Qiqi; Motion: gently fly on broomstick; Background: night sky.

Blank lines and lines starting with ``#`` are skipped. Keys are case-insensitive; all three are
required, once each; the trailing period is optional.

JSONL form, one game a line::

    {"game_id": "bunny-1", "seed": 3, "turns": ["Character: ...; Motion: ...; Background: ...", ...]}

``turns`` entries may also be objects ``{"character": ..., "motion": ..., "background": ...}``.
``seed`` is optional. Any other key is an error.

Every problem raises :class:`GameScriptError` naming the file, the line and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence

from animegamer_jax import paths

FIELDS = ("character", "motion", "background")
_KEY_ALIASES = {"character": "character", "characters": "character", "motion": "motion",
                "background": "background"}
_GAME_KEYS = {"game_id", "turns", "seed"}


class GameScriptError(ValueError):
    """A malformed game script; the message names the file, the line and the fix."""


@dataclasses.dataclass(frozen=True)
class Turn:
    """One player instruction.

    Attributes:
      characters: character names, e.g. ``("Qiqi",)``; "A and B" / "A, B" give two names.
      motion: the movement description, e.g. ``"gently fly on broomstick"``.
      background: the environment, e.g. ``"night sky"``.
    """

    characters: tuple[str, ...]
    motion: str
    background: str
    #: where it was read (``"game.txt:3"``, ``"games.jsonl:2 turn 1"``); not part of equality
    where: str = dataclasses.field(default="", compare=False)

    @property
    def text(self) -> str:
        """The canonical instruction string fed to the MLLM (format: docs/token_layout.md#instruction-text)."""
        return f"Character: {' and '.join(self.characters)}; Motion: {self.motion}; Background: {self.background}."

    @property
    def character(self) -> str:
        """The characters as one string (``"Qiqi"`` or ``"Qiqi and Jiji"``)."""
        return " and ".join(self.characters)


@dataclasses.dataclass(frozen=True)
class Game:
    """A game: an id, an optional seed and its turns in order."""

    game_id: str
    turns: tuple[Turn, ...]
    seed: int | None = None


def is_plain_name(name: object) -> bool:
    """True when ``name`` is usable as one folder name: a non-empty string without path separators,
    NUL, a leading ``.`` (so no ``.``/``..``, no hidden names) or surrounding spaces, at most 200 chars."""
    return (isinstance(name, str) and bool(name) and not name.startswith(".") and "/" not in name
            and "\\" not in name and "\0" not in name and name == name.strip() and len(name) <= 200
            and not os.path.isabs(name))


def _where(path: str, line_no: int) -> str:
    return f"{path}:{line_no}"


_FIX = ('write one instruction per line as "Character: <names>; Motion: <movement>; '
        'Background: <environment>."')


def _split_characters(value: str) -> tuple[str, ...]:
    names = [n.strip() for n in re.split(r",|\band\b|&", value) if n.strip()]
    return tuple(names)


def parse_instruction(line: str, where: str = "<string>") -> Turn:
    """Parses one instruction line into a :class:`Turn`.

    Raises:
      GameScriptError: a missing, duplicated, empty or unknown field (message starts with
        ``where``, e.g. ``"game.txt:3"``, and ends with the fix).
    """
    text = line.lstrip("\ufeff").strip()  # a UTF-8 BOM (Windows editors) is not part of the text
    if text.endswith("."):
        text = text[:-1]
    values: dict[str, str] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        if ":" not in part:
            raise GameScriptError(f"{where}: {part.strip()!r} is not a 'Key: value' field. Fix: {_FIX}")
        key, value = part.split(":", 1)
        norm = _KEY_ALIASES.get(key.strip().lower())
        if norm is None:
            raise GameScriptError(
                f"{where}: unknown field {key.strip()!r}; the fields are Character, Motion and "
                f"Background. Fix: {_FIX}")
        if norm in values:
            raise GameScriptError(f"{where}: field {key.strip()!r} appears twice. Fix: {_FIX}")
        if not value.strip():
            raise GameScriptError(f"{where}: field {key.strip()!r} is empty. Fix: {_FIX}")
        values[norm] = " ".join(value.split())
    missing = [f.capitalize() for f in FIELDS if f not in values]
    if missing:
        raise GameScriptError(f"{where}: missing field(s) {', '.join(missing)}. Fix: {_FIX}")
    characters = _split_characters(values["character"])
    if not characters:
        raise GameScriptError(f"{where}: no character name given. Fix: {_FIX}")
    return Turn(characters, values["motion"], values["background"],
                where="" if where == "<string>" else where)


def _read_text(path: str) -> str:
    p = paths.as_path(path)
    if not p.exists():
        raise GameScriptError(f"{path}: file not found. Fix: pass the path of an existing game script")
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")  # accept a UTF-8 BOM
    except UnicodeDecodeError as e:
        line_no = raw[: e.start].count(b"\n") + 1
        raise GameScriptError(
            f"{_where(path, line_no)}: not valid UTF-8 (byte {raw[e.start]:#04x} at offset {e.start}). "
            f"Fix: save the file as UTF-8") from None


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
        raise GameScriptError(f"{path}: the script has no instructions. Fix: {_FIX}")
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
    return Game(gid, parse_lines(text.splitlines(), path), seed)


def _turn_from_json(obj: object, where: str) -> Turn:
    if isinstance(obj, str):
        return parse_instruction(obj, where)
    if isinstance(obj, dict):
        unknown = sorted(set(obj) - set(_KEY_ALIASES))
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
    for i, line in enumerate(text.splitlines(), start=1):
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
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise GameScriptError(f"{where}: 'seed' must be an integer, got {seed!r}")
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
