"""Game scripts: one instruction a line (paper form) or JSONL for batch generation.

Line form (docs/token_layout.md#instruction-text, the release's ``game_demo/demo.txt``)::

    Character: Qiqi; Motion: gently fly on broomstick; Background: night sky.

Blank lines and lines starting with ``#`` are skipped. Keys are case-insensitive; all three are
required, once each; the trailing period is optional.

JSONL form, one game a line::

    {"game_id": "bunny-1", "seed": 3, "turns": ["Character: ...; Motion: ...; Background: ...", ...]}

``turns`` entries may also be objects ``{"character": ..., "motion": ..., "background": ...}``.
``seed`` is optional (a signed 64-bit integer). Any other key is an error.

Text policy (every front end: script files, stdin, JSONL and the web app go through
:func:`parse_instruction`, which calls :func:`check_text`): an instruction and a game id are one line
of visible text. Refused, with the character's code point and position: control characters
(Unicode category Cc: NUL, TAB, CR, ESC, BEL, DEL, C1), lone surrogates (Cs; also what an
undecodable stdin byte becomes), line and paragraph separators (Zl, Zp) and format characters (Cf:
the bidirectional overrides and isolates, zero-width space, word joiner, soft hyphen, an inner BOM)
except ZERO WIDTH NON-JOINER and ZERO WIDTH JOINER (U+200C, U+200D), which Persian and Indic names
and emoji sequences need. A UTF-8 BOM at the start of a file or line is dropped, not refused.

Every problem raises :class:`GameScriptError` naming the file, the line and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import unicodedata
from collections.abc import Sequence

from animegamer_jax import paths

FIELDS = ("character", "motion", "background")
_KEY_ALIASES = {"character": "character", "characters": "character", "motion": "motion",
                "background": "background"}
_GAME_KEYS = {"game_id", "turns", "seed"}
#: the seeds a game may carry: what a signed 64-bit integer holds
SEED_RANGE = (-2**63, 2**63 - 1)
#: explicit bidirectional formatting characters ("Trojan Source"): they reorder how text is shown
BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
#: format characters (category Cf) that names legitimately need: ZERO WIDTH NON-JOINER / JOINER
ALLOWED_FORMAT = frozenset("\u200c\u200d")
_KINDS = {"Cc": "control character", "Cs": "lone surrogate", "Zl": "line separator", "Zp": "paragraph separator",
          "Cf": "invisible formatting character"}


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
    """A game: an id, an optional seed and its turns in order; ``characters``: its reference images
    (game/characters.py ``Character``, ``--character``), none by default."""

    game_id: str
    turns: tuple[Turn, ...]
    seed: int | None = None
    characters: tuple = ()


def refused_char(text: str) -> tuple[int, str] | None:
    """The first character of ``text`` the text policy refuses (module docstring), as (position,
    what it is: ``"control character U+001B"``), or None when ``text`` is one line of visible text."""
    for i, ch in enumerate(text):
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cs", "Zl", "Zp") or (cat == "Cf" and ch not in ALLOWED_FORMAT):
            kind = "bidirectional formatting character" if ch in BIDI else _KINDS[cat]
            what = f"{kind} U+{ord(ch):04X}"
            if 0xDC80 <= ord(ch) <= 0xDCFF:  # how an undecodable byte reads (errors="surrogateescape")
                what += f" (the byte {ord(ch) - 0xDC00:#04x}, which is not UTF-8)"
            return i, what
    return None


def check_text(text: str, where: str = "<string>") -> None:
    """Refuses text that is not one line of visible text (the text policy, module docstring).

    Raises:
      GameScriptError: ``"<where>: the text contains the control character U+001B at position 3.
        Fix: ..."`` (the character is named by code point, never echoed).
    """
    bad = refused_char(text)
    if bad is not None:
        raise GameScriptError(f"{where}: the text contains the {bad[1]} at position {bad[0]}. Fix: "
                              f"instructions and game ids are one line of plain text; remove that character")


def is_plain_name(name: object) -> bool:
    """True when ``name`` is usable as one folder name: a non-empty string without path separators,
    a leading ``.`` (so no ``.``/``..``, no hidden names), surrounding spaces or a character the
    text policy refuses (:func:`refused_char`: NUL, controls, lone surrogates, ...), at most 200 chars."""
    return (isinstance(name, str) and bool(name) and not name.startswith(".") and "/" not in name
            and "\\" not in name and refused_char(name) is None and name == name.strip() and len(name) <= 200
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
      GameScriptError: text :func:`check_text` refuses, or a missing, duplicated, empty or unknown
        field (message starts with ``where``, e.g. ``"game.txt:3"``, and ends with the fix).
    """
    text = line.lstrip("\ufeff")  # a UTF-8 BOM (Windows editors) is not part of the text
    text = text[:-1] if text.endswith("\n") else text  # the line's own end (stdin, a file's CRLF)
    check_text(text[:-1] if text.endswith("\r") else text, where)
    text = text.strip()
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
    return Game(gid, parse_lines(_lines(text), path), seed)


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
