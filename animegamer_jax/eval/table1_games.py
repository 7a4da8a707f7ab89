"""The benchmark file Table 1 is scored on: games of rounds with ground-truth states and character references.

Mirrors the paper's benchmark (paper §4.2; docs/evaluation.md#benchmark: GPT-4o simulated games of 10 rounds,
each round an instruction plus ground-truth character states). One JSON file::

    {
      "name": "animegamer-mini",
      "description": "...",                                   (optional)
      "characters": {"Bunny": "references/bunny.png", ...},   (paths relative to this file)
      "games": [
        {"game_id": "bunny-day", "seed": 11,                  (seed optional)
         "rounds": [
           {"character": "Bunny", "motion": "slowly walk out of the burrow", "background": "day meadow",
            "states": {"ML": 2, "SC": 0, "ET": 1, "ST": -1}},
           ...]}]
    }

A round may give its instruction as one string ``"instruction": "Character: ...; Motion: ...;
Background: ..."`` instead of the three fields. ``states`` holds the ground-truth motion level ML
(1..5) and the state changes SC, ET, ST (-5..5), the MLLM's output fields
(docs/token_layout.md#state-fields). Every character a round names needs a reference image (any size,
RGB; CLIP resizes it).

Every problem raises :class:`BenchmarkError` naming the file, the game / round and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
from PIL import Image

from animegamer_jax.io import fileio
from animegamer_jax.eval.metrics import STATE_FIELDS
from animegamer_jax.inference import instructions

_TOP_KEYS = {"name", "description", "characters", "games"}
_GAME_KEYS = {"game_id", "seed", "rounds"}
_ROUND_KEYS = {"character", "motion", "background", "instruction", "states"}
STATE_RANGES = {"ML": (1, 5), "SC": (-5, 5), "ET": (-5, 5), "ST": (-5, 5)}


class BenchmarkError(ValueError):
    """A malformed benchmark file; the message names the file, the place and the fix."""


@dataclasses.dataclass(frozen=True)
class Round:
    """One round: the player's instruction and the ground-truth states (ML, SC, ET, ST)."""

    turn: instructions.Turn
    states: tuple[int, int, int, int]


@dataclasses.dataclass(frozen=True)
class BenchmarkGame:
    """A benchmark game: id, optional seed and its rounds in order."""

    game_id: str
    rounds: tuple[Round, ...]
    seed: int | None = None

    def to_game(self) -> instructions.Game:
        """The game as a :class:`animegamer_jax.inference.instructions.Game` for generation."""
        return instructions.Game(self.game_id, tuple(r.turn for r in self.rounds), self.seed)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A loaded benchmark.

    Attributes:
      name: benchmark name.
      path: the JSON file it came from.
      characters: character name -> absolute path of its reference image.
      games: the games in file order.
    """

    name: str
    path: str
    characters: dict[str, str]
    games: tuple[BenchmarkGame, ...]

    @property
    def num_rounds(self) -> int:
        return sum(len(g.rounds) for g in self.games)

    def to_games(self) -> tuple[instructions.Game, ...]:
        """All games as generation inputs (instructions and seeds only, no ground truth)."""
        return tuple(g.to_game() for g in self.games)

    def write_jsonl(self, path: str) -> None:
        """Writes the games in the batch-generation JSONL form (``game/script.py``), atomically (a local
        path or a URL: ``fileio.write_text_atomic``)."""
        lines = []
        for g in self.games:
            obj = {"game_id": g.game_id, "turns": [r.turn.text for r in g.rounds]}
            if g.seed is not None:
                obj["seed"] = g.seed
            lines.append(json.dumps(obj) + "\n")
        fileio.write_text_atomic(path, "".join(lines))

    def reference_images(self) -> dict[str, np.ndarray]:
        """Character name -> uint8 [H, W, 3] RGB reference image.

        Raises:
          BenchmarkError: an image that cannot be decoded.
        """
        out = {}
        for name, p in self.characters.items():
            try:
                with Image.open(p) as im:
                    out[name] = np.asarray(im.convert("RGB"), np.uint8)
            except OSError as e:
                raise BenchmarkError(f"{self.path}: reference image of {name!r} at {p} cannot be read ({e}). "
                                     f"Fix: point 'characters.{name}' at a PNG or JPEG file") from None
        return out


def _check_keys(obj: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise BenchmarkError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}. "
                             f"Fix: remove or rename them")


def _parse_states(obj: object, where: str) -> tuple[int, int, int, int]:
    fix = 'Fix: write e.g. "states": {"ML": 2, "SC": 0, "ET": 1, "ST": -1}'
    if isinstance(obj, list):
        if len(obj) != 4:
            raise BenchmarkError(f"{where}: 'states' as a list needs 4 values (ML, SC, ET, ST), got {len(obj)}. {fix}")
        obj = dict(zip(STATE_FIELDS, obj))
    if not isinstance(obj, dict):
        raise BenchmarkError(f"{where}: 'states' must be an object, got {type(obj).__name__}. {fix}")
    missing = [f for f in STATE_FIELDS if f not in obj]
    unknown = sorted(set(obj) - set(STATE_FIELDS))
    if missing or unknown:
        raise BenchmarkError(f"{where}: 'states' has missing {missing} / unknown {unknown} fields. {fix}")
    values = []
    for f in STATE_FIELDS:
        v = obj[f]
        lo, hi = STATE_RANGES[f]
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise BenchmarkError(f"{where}: state {f} must be an integer in {lo}..{hi}, got {v!r}. {fix}")
        values.append(v)
    return tuple(values)  # type: ignore[return-value]


def _parse_round(obj: object, where: str) -> Round:
    if not isinstance(obj, dict):
        raise BenchmarkError(f"{where}: a round must be an object, got {type(obj).__name__}")
    _check_keys(obj, _ROUND_KEYS, where)
    if "states" not in obj:
        raise BenchmarkError(f"{where}: missing 'states' (the ground truth). Fix: add "
                             '"states": {"ML": .., "SC": .., "ET": .., "ST": ..}')
    fields = [k for k in ("character", "motion", "background") if k in obj]
    try:
        if "instruction" in obj:
            if fields:
                raise BenchmarkError(f"{where}: give either 'instruction' or character/motion/background, not both")
            if not isinstance(obj["instruction"], str):
                raise BenchmarkError(f"{where}: 'instruction' must be a string")
            turn = instructions.parse_instruction(obj["instruction"], where)
        else:
            for k in ("character", "motion", "background"):
                if not isinstance(obj.get(k), str):
                    raise BenchmarkError(f"{where}: '{k}' must be a non-empty string "
                                         "(or give one 'instruction' string)")
            turn = instructions.parse_instruction(
                f"Character: {obj['character']}; Motion: {obj['motion']}; Background: {obj['background']}", where)
    except instructions.GameScriptError as e:
        raise BenchmarkError(str(e)) from None
    return Round(turn, _parse_states(obj["states"], where))


def load_benchmark(path: str, check_images: bool = True) -> Benchmark:
    """Loads and validates a benchmark JSON file.

    Args:
      path: the JSON file.
      check_images: also check that every reference image file exists.

    Raises:
      BenchmarkError: missing file, invalid JSON, unknown/missing keys, a game without rounds,
        duplicated game ids, out-of-range states, a character without a reference image, a missing
        image file. The message names the file, the game/round and the fix.
    """
    if not os.path.exists(path):
        raise BenchmarkError(f"{path}: file not found. Fix: pass a benchmark JSON such as "
                             f"data/benchmark/benchmark.json")
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except json.JSONDecodeError as e:
        raise BenchmarkError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
    except UnicodeDecodeError:
        raise BenchmarkError(f"{path}: not valid UTF-8. Fix: save the file as UTF-8") from None
    if not isinstance(obj, dict):
        raise BenchmarkError(f"{path}: the top level must be an object with 'name', 'characters', 'games'")
    _check_keys(obj, _TOP_KEYS, path)
    for k in ("name", "characters", "games"):
        if k not in obj:
            raise BenchmarkError(f"{path}: missing top-level key {k!r}. Fix: see the format in "
                                 "animegamer_jax/eval/table1_games.py")
    base = os.path.dirname(os.path.abspath(path))
    chars = obj["characters"]
    if not isinstance(chars, dict) or not chars:
        raise BenchmarkError(f"{path}: 'characters' must map each character name to a reference image path")
    characters = {}
    for name, p in chars.items():
        if not isinstance(p, str) or not p:
            raise BenchmarkError(f"{path}: characters.{name} must be an image path string")
        full = p if os.path.isabs(p) else os.path.join(base, p)
        if check_images and not os.path.isfile(full):
            raise BenchmarkError(f"{path}: reference image of {name!r} not found at {full}. "
                                 "Fix: paths are relative to the benchmark file")
        characters[name] = full
    games_obj = obj["games"]
    if not isinstance(games_obj, list) or not games_obj:
        raise BenchmarkError(f"{path}: 'games' must be a non-empty list")
    games, seen = [], set()
    for gi, g in enumerate(games_obj):
        where = f"{path} game {gi}"
        if not isinstance(g, dict):
            raise BenchmarkError(f"{where}: a game must be an object")
        _check_keys(g, _GAME_KEYS, where)
        gid = g.get("game_id")
        if not isinstance(gid, str) or not gid or "/" in gid or gid.startswith("."):
            raise BenchmarkError(f"{where}: 'game_id' must be a non-empty string usable as a folder name, got {gid!r}")
        where = f"{path} game {gid!r}"
        if gid in seen:
            raise BenchmarkError(f"{where}: duplicated game_id. Fix: make ids unique")
        seen.add(gid)
        seed = g.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise BenchmarkError(f"{where}: 'seed' must be an integer, got {seed!r}")
        rounds_obj = g.get("rounds")
        if not isinstance(rounds_obj, list) or not rounds_obj:
            raise BenchmarkError(f"{where}: 'rounds' must be a non-empty list of rounds")
        rounds = tuple(_parse_round(r, f"{where} round {ri}") for ri, r in enumerate(rounds_obj))
        for ri, r in enumerate(rounds):
            unknown = [c for c in r.turn.characters if c not in characters]
            if unknown:
                raise BenchmarkError(f"{where} round {ri}: character(s) {unknown} have no reference image. "
                                     f"Fix: add them to 'characters' (known: {sorted(characters)})")
        games.append(BenchmarkGame(gid, rounds, seed))
    return Benchmark(str(obj["name"]), os.path.abspath(path), characters, tuple(games))
