"""The instruction grammar: one turn's input text, a game's inputs and the text policy.

An instruction (docs/token_layout.md#instruction-text, the release's ``game_demo/demo.txt``)::

    Character: Qiqi; Motion: gently fly on broomstick; Background: night sky.

Keys are case-insensitive; all three are required, once each; the trailing period is optional.
:func:`parse_instruction` turns one into a :class:`Turn`; a :class:`Game` is an id, an optional seed
(:data:`SEED_RANGE`) and its turns. The file formats that hold games are game/script.py's.

Text policy (every front end: script files, stdin, JSONL, benchmark files and the web app go through
:func:`parse_instruction`, which calls :func:`check_text`): an instruction and a game id are one line
of visible text. Refused, with the character's code point and position: control characters
(Unicode category Cc: NUL, TAB, CR, ESC, BEL, DEL, C1), lone surrogates (Cs; also what an
undecodable stdin byte becomes), line and paragraph separators (Zl, Zp) and format characters (Cf:
the bidirectional overrides and isolates, zero-width space, word joiner, soft hyphen, an inner BOM)
except ZERO WIDTH NON-JOINER and ZERO WIDTH JOINER (U+200C, U+200D), which Persian and Indic names
and emoji sequences need. A UTF-8 BOM at the start of a line is dropped, not refused.

Every problem raises :class:`GameScriptError` naming the place (``where``) and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import re
import unicodedata

FIELDS = ("character", "motion", "background")
KEY_ALIASES = {"character": "character", "characters": "character", "motion": "motion",
                "background": "background"}
#: the seeds a game may carry: what a signed 64-bit integer holds
SEED_RANGE = (-2**63, 2**63 - 1)
#: explicit bidirectional formatting characters ("Trojan Source"): they reorder how text is shown
BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
#: format characters (category Cf) that names legitimately need: ZERO WIDTH NON-JOINER / JOINER
ALLOWED_FORMAT = frozenset("\u200c\u200d")
_KINDS = {"Cc": "control character", "Cs": "lone surrogate", "Zl": "line separator", "Zp": "paragraph separator",
          "Cf": "invisible formatting character"}


class GameScriptError(ValueError):
    """A malformed instruction or game script; the message names the file, the line and the fix."""


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


#: how a malformed instruction is fixed (the end of :class:`GameScriptError` messages)
INSTRUCTION_FIX = ('write one instruction per line as "Character: <names>; Motion: <movement>; '
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
            raise GameScriptError(f"{where}: {part.strip()!r} is not a 'Key: value' field. Fix: {INSTRUCTION_FIX}")
        key, value = part.split(":", 1)
        norm = KEY_ALIASES.get(key.strip().lower())
        if norm is None:
            raise GameScriptError(
                f"{where}: unknown field {key.strip()!r}; the fields are Character, Motion and "
                f"Background. Fix: {INSTRUCTION_FIX}")
        if norm in values:
            raise GameScriptError(f"{where}: field {key.strip()!r} appears twice. Fix: {INSTRUCTION_FIX}")
        if not value.strip():
            raise GameScriptError(f"{where}: field {key.strip()!r} is empty. Fix: {INSTRUCTION_FIX}")
        values[norm] = " ".join(value.split())
    missing = [f.capitalize() for f in FIELDS if f not in values]
    if missing:
        raise GameScriptError(f"{where}: missing field(s) {', '.join(missing)}. Fix: {INSTRUCTION_FIX}")
    characters = _split_characters(values["character"])
    if not characters:
        raise GameScriptError(f"{where}: no character name given. Fix: {INSTRUCTION_FIX}")
    return Turn(characters, values["motion"], values["background"],
                where="" if where == "<string>" else where)
