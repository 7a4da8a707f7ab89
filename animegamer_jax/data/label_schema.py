"""Clip labels: the JSONL interface between captioning and dataset building (paper Sec. 3.3, App. B).

A labels file is JSON Lines, one object per line, three kinds:

  {"type": "film", "film_id": "sample_film", "characters": ["Bunny", "Driver"]}
  {"type": "clip", "film_id": "sample_film", "clip_index": 0, "start": 0.0,
   "characters": ["Bunny"], "action": "slowly crawl out of burrow", "background": "day meadow",
   "states": {"social": 0, "entertainment": 1, "stamina": 1}}
  {"type": "unlabelled", "film_id": "sample_film", "clip_index": 3, "start": 10.76,
   "reason": "no JSON object in the answer"}

- `film` lines (optional, one per film) declare the cast; when present, every clip's characters must
  belong to it ("unknown character" otherwise). Names are case-sensitive.
- `clip` lines: `clip_index` is the clip's 0-based position in its film as planned by
  `clips.plan_clips` (timestamp order), `start` its start time in seconds (checked against the plan
  within 0.05 s, to catch labels written for a different cut of the film). `action` is the short
  motion description (adverb + verb phrase, e.g. "gently sit on railing"), `background` is
  "<time> <place>" (e.g. "day town"). `states` are the character-state CHANGES during the clip,
  integers in -5..5: social (SC), entertainment (ET), stamina (ST).
- `unlabelled` lines mark a clip the captioner could not label (`data/caption.py` writes them, with the
  reason); `prepare` leaves such clips out and reports them. Label one by hand by replacing its line
  with a `clip` line.
- Blank lines and lines starting with '#' are ignored.

The MLLM instruction of a clip follows the release's format (docs/token_layout.md#instruction-text):
  "Character: <names>; Motion: <action>; Background: <background>."

Automatic labelling (the paper captions with InternVL from reference images of the protagonists and 4
evenly sampled frames): `python -m animegamer_jax.commands.data caption` (data/caption.py, captioners in
data/captioners.py) writes this format; review it by hand before training.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence

STATE_NAMES = ("social", "entertainment", "stamina")
STATE_RANGE = (-5, 5)
START_TOLERANCE_S = 0.05


class LabelError(ValueError):
    """A labels file is malformed or does not match the clips of a film."""


@dataclasses.dataclass(frozen=True)
class ClipLabel:
    """Labels of one clip (see the module docstring for the meaning of each field)."""

    film_id: str
    clip_index: int
    start: float
    characters: tuple[str, ...]
    action: str
    background: str
    social: int
    entertainment: int
    stamina: int

    @property
    def instruction(self) -> str:
        """The MLLM instruction text (release format, docs/token_layout.md#instruction-text)."""
        names = ", ".join(self.characters) if self.characters else "none"
        return f"Character: {names}; Motion: {self.action}; Background: {self.background}."

    def state_changes(self) -> tuple[int, int, int]:
        """(SC, ET, ST) in the MLLM's positional order."""
        return self.social, self.entertainment, self.stamina

    def to_json(self) -> dict:
        return {"type": "clip", "film_id": self.film_id, "clip_index": self.clip_index,
                "start": round(self.start, 4), "characters": list(self.characters), "action": self.action,
                "background": self.background,
                "states": {"social": self.social, "entertainment": self.entertainment, "stamina": self.stamina}}


@dataclasses.dataclass
class LabelSet:
    """Parsed labels file: casts per film, labels keyed by (film_id, clip_index), and the clips marked
    unlabelled ((film_id, clip_index) -> (start, reason))."""

    path: str
    casts: dict[str, tuple[str, ...]]
    clips: dict[tuple[str, int], ClipLabel]
    unlabelled: dict[tuple[str, int], tuple[float, str]] = dataclasses.field(default_factory=dict)

    def for_film(self, film_id: str) -> list[ClipLabel]:
        """Labels of one film, by clip_index."""
        return sorted((v for (f, _), v in self.clips.items() if f == film_id), key=lambda v: v.clip_index)


def _parse_clip(obj: dict, where: str) -> ClipLabel:
    for key in ("film_id", "clip_index", "start", "characters", "action", "background", "states"):
        if key not in obj:
            raise LabelError(f"{where}: clip label lacks field '{key}'")
    states = obj["states"]
    if not isinstance(states, Mapping) or set(states) != set(STATE_NAMES):
        raise LabelError(f"{where}: 'states' must have exactly the keys {STATE_NAMES}, got {states!r}")
    for name in STATE_NAMES:
        v = states[name]
        if not isinstance(v, int) or isinstance(v, bool) or not STATE_RANGE[0] <= v <= STATE_RANGE[1]:
            raise LabelError(f"{where}: state '{name}' must be an integer in -5..5, got {v!r}")
    chars = obj["characters"]
    if not isinstance(chars, list) or not all(isinstance(c, str) and c for c in chars):
        raise LabelError(f"{where}: 'characters' must be a list of names, got {chars!r}")
    for key in ("action", "background"):
        if not isinstance(obj[key], str) or not obj[key].strip():
            raise LabelError(f"{where}: '{key}' must be a non-empty string")
    if not isinstance(obj["clip_index"], int) or obj["clip_index"] < 0:
        raise LabelError(f"{where}: 'clip_index' must be an integer >= 0, got {obj['clip_index']!r}")
    return ClipLabel(str(obj["film_id"]), int(obj["clip_index"]), float(obj["start"]), tuple(chars),
                     obj["action"].strip(), obj["background"].strip(), int(states["social"]),
                     int(states["entertainment"]), int(states["stamina"]))


def parse_clip(obj: dict, where: str) -> ClipLabel:
    """Validates one clip-line object (the module docstring's schema) and returns its ClipLabel.

    Raises:
      LabelError: starting with `where`: a missing or ill-typed field, states outside -5..5.
    """
    return _parse_clip(obj, where)


def read_labels(path: str) -> LabelSet:
    """Parses and validates a labels JSONL file.

    Raises:
      LabelError: naming the file and line: bad JSON, missing / ill-typed fields, states outside
        -5..5, duplicate clips, unknown characters (not in the film's declared cast).
      FileNotFoundError: no such file.
    """
    casts: dict[str, tuple[str, ...]] = {}
    clips: dict[tuple[str, int], ClipLabel] = {}
    lines: list[tuple[int, dict]] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise LabelError(f"{path}:{n}: not valid JSON ({e})") from e
            if not isinstance(obj, dict) or obj.get("type") not in ("film", "clip", "unlabelled"):
                raise LabelError(f"{path}:{n}: each line must be an object with \"type\": \"film\", "
                                 f"\"clip\" or \"unlabelled\"")
            lines.append((n, obj))
    for n, obj in lines:
        if obj["type"] == "film":
            if "film_id" not in obj or not isinstance(obj.get("characters"), list):
                raise LabelError(f"{path}:{n}: film line needs 'film_id' and a 'characters' list")
            casts[str(obj["film_id"])] = tuple(obj["characters"])
    unlabelled: dict[tuple[str, int], tuple[float, str]] = {}
    for n, obj in lines:
        if obj["type"] == "film":
            continue
        where = f"{path}:{n}"
        if obj["type"] == "unlabelled":
            if not isinstance(obj.get("clip_index"), int) or "film_id" not in obj or "start" not in obj:
                raise LabelError(f"{where}: an unlabelled line needs 'film_id', 'clip_index' and 'start'")
            key = (str(obj["film_id"]), obj["clip_index"])
            if key in clips or key in unlabelled:
                raise LabelError(f"{where}: duplicate line for film '{key[0]}' clip {key[1]}")
            unlabelled[key] = (float(obj["start"]), str(obj.get("reason", "")))
            continue
        label = _parse_clip(obj, where)
        key = (label.film_id, label.clip_index)
        if key in clips or key in unlabelled:
            raise LabelError(f"{where}: duplicate label for film '{label.film_id}' clip {label.clip_index}")
        cast = casts.get(label.film_id)
        if cast is not None:
            unknown = [c for c in label.characters if c not in cast]
            if unknown:
                raise LabelError(f"{where}: film '{label.film_id}' clip {label.clip_index}: unknown "
                                 f"character(s) {unknown}; the film's cast is {list(cast)}")
        clips[key] = label
    return LabelSet(path, casts, clips, unlabelled)


def write_labels(path: str, labels: Iterable[ClipLabel], casts: Mapping[str, Sequence[str]] | None = None) -> None:
    """Writes labels (and optional casts) as JSONL in the format read_labels accepts."""
    with open(path, "w", encoding="utf-8") as f:
        for film_id, chars in (casts or {}).items():
            f.write(json.dumps({"type": "film", "film_id": film_id, "characters": list(chars)}) + "\n")
        for label in labels:
            f.write(json.dumps(label.to_json()) + "\n")


def match_labels(film_id: str, specs: Sequence, labels: LabelSet, film_path: str = "") -> list[ClipLabel | None]:
    """Pairs planned clips (clips.ClipSpec, in order) with their labels.

    Returns one ClipLabel per spec, in the same order; None for a clip marked unlabelled.

    Raises:
      LabelError: naming the labels file, the film (and its path) and the clip: a clip without a label,
        a label for a clip the film does not have, or a start time that differs from the plan by more
        than 0.05 s.
    """
    film = f"film '{film_id}'" + (f" ({film_path})" if film_path else "")
    out = []
    for spec in specs:
        label = labels.clips.get((film_id, spec.clip_index))
        if label is None and (film_id, spec.clip_index) in labels.unlabelled:
            start, _ = labels.unlabelled[(film_id, spec.clip_index)]
            if abs(start - spec.start_time) > START_TOLERANCE_S:
                raise LabelError(f"{labels.path}: unlabelled line of {film} clip {spec.clip_index} says start "
                                 f"{start:.2f} s but the clip starts at {spec.start_time:.2f} s "
                                 f"(labels written for a different cut?)")
            out.append(None)
            continue
        if label is None:
            raise LabelError(f"{labels.path}: no label for {film} clip {spec.clip_index} "
                             f"(starts at {spec.start_time:.2f} s); the film has {len(specs)} clips")
        if abs(label.start - spec.start_time) > START_TOLERANCE_S:
            raise LabelError(f"{labels.path}: label of {film} clip {spec.clip_index} says start "
                             f"{label.start:.2f} s but the clip starts at {spec.start_time:.2f} s "
                             f"(labels written for a different cut?)")
        out.append(label)
    extra = sorted([lab.clip_index for lab in labels.for_film(film_id) if lab.clip_index >= len(specs)]
                   + [i for f, i in labels.unlabelled if f == film_id and i >= len(specs)])
    if extra:
        raise LabelError(f"{labels.path}: labels for clips {extra} of {film}, which has only "
                         f"{len(specs)} clips (indices 0..{len(specs) - 1})")
    return out
