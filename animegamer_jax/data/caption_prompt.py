"""The captioner's prompt and its answer parser (data/caption.py captions with them; paper Sec. 3.3).

The prompt (`build_prompt`) interleaves the cast's reference images, the clip's sampled frames and the
request; the answer is one JSON object (captioners.ANSWER_KEYS): the characters present, the motion as
adverb + verb phrase, the background as time + place, the changes of social, entertainment and stamina
(-5..5) and a short reason. `parse_answer` takes the first JSON object in the text (prose around it is
ignored) and validates it against the label schema (`label_schema.parse_clip`, names against the cast);
a failure is an `AnswerError`. The motion LEVEL is not asked: `prepare` computes it from optical flow
(data/motion.py); the prompt states it so that the adverb agrees with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import numpy as np

from animegamer_jax.data import captioners as captioners_lib
from animegamer_jax.data import label_schema


class AnswerError(ValueError):
    """A captioner answer that is not a valid label; `kind` is a short category for the summary."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def build_prompt(references: dict[str, Sequence[np.ndarray]], frames: np.ndarray, motion_level: int,
                 strict: bool = False, previous_error: str = "") -> tuple[str | np.ndarray, ...]:
    """The interleaved prompt of one clip: text parts (str) and images (uint8 [h, w, 3]), in order."""
    names = list(references)
    parts: list[str | np.ndarray] = ["You label clips of an animated film for a game dataset.\n"]
    if names:
        parts.append("These are the main characters, with reference images:\n")
        for name in names:
            parts.append(f"{name}:")
            parts.extend(references[name])
            parts.append("\n")
    parts.append(f"Here are {len(frames)} frames of the clip, in time order:")
    parts.extend(frames)
    allowed = ", ".join(names) if names else "(no named characters: always [])"
    example_name = json.dumps(names[:1])
    parts.append(
        f"\nOptical flow measures the motion level of this clip as {int(motion_level)} of 5 "
        "(1 = still, 5 = very fast).\n"
        "Answer with one JSON object with exactly these keys:\n"
        f'"characters": the main characters who appear in the frames, a list of names from: {allowed} ([] if none);\n'
        '"adverb": one adverb for how the main character moves;\n'
        '"verb": a short verb phrase (2 to 5 words) for what it does;\n'
        '"time": the time of day; "place": where it happens (one or two words each);\n'
        '"social", "entertainment", "stamina": how much each state of the character changes during the '
        "clip, an integer from -5 to 5;\n"
        '"reason": one short sentence explaining the state changes.\n'
        f'Example: {{"characters": {example_name}, "adverb": "slowly", "verb": "crawl out of burrow", '
        '"time": "day", "place": "meadow", "social": 0, "entertainment": 1, "stamina": -1, '
        '"reason": "a calm stroll is fun and a little tiring"}')
    if strict:
        parts.append(
            f"\nYour previous answer could not be used: {previous_error}\n"
            "Reply with ONLY the JSON object: no text before or after it, no code fence, all nine keys, "
            f"integers -5..5 without quotes, character names exactly as written above ({allowed}).")
    return tuple(parts)


def _find_json_object(text: str) -> dict:
    decoder = json.JSONDecoder()
    first_error = None
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError as e:
            first_error = first_error or e
            continue
        if isinstance(obj, dict) and set(obj) & set(captioners_lib.ANSWER_KEYS):
            return obj
    if first_error is not None:
        raise AnswerError("malformed JSON", f"the answer's JSON does not parse ({first_error.msg})")
    raise AnswerError("no JSON object", "no JSON object in the answer")


def _state(obj: dict, key: str) -> int:
    v = obj[key]
    if isinstance(v, str) and re.fullmatch(r"\s*[+-]?\d+\s*", v):
        v = int(v)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise AnswerError("bad state", f"'{key}' must be an integer from -5 to 5, got {v!r}")
    if not label_schema.STATE_RANGE[0] <= v <= label_schema.STATE_RANGE[1]:
        raise AnswerError("state out of range", f"'{key}' must be an integer from -5 to 5, got {v}")
    return v


def _words(obj: dict, key: str, lo: int, hi: int) -> str:
    v = obj[key]
    if not isinstance(v, str) or not lo <= len(v.split()) <= hi or not re.fullmatch(r"[A-Za-z][A-Za-z' -]*", v.strip()):
        raise AnswerError("bad text field", f"'{key}' must be {lo}..{hi} plain words, got {v!r}")
    return " ".join(v.split()).lower()


def parse_answer(text: str, cast: Sequence[str], film_id: str, clip_index: int,
                 start: float) -> tuple[label_schema.ClipLabel, str]:
    """Parses a captioner answer into a validated label.

    Args:
      text: the raw answer; the first JSON object holding answer keys is used (prose or a code fence
        around it is ignored).
      cast: the allowed character names; answer names are matched case-insensitively and written as
        spelled in the cast.
      film_id, clip_index, start: where the clip is (copied into the label).

    Returns:
      (ClipLabel, reason): action = "<adverb> <verb>", background = "<time> <place>".

    Raises:
      AnswerError: no / malformed JSON, missing keys, non-list characters, unknown names, states that
        are not integers in -5..5 (never clipped), adverb / verb / time / place that are not short
        plain words. The message says what is wrong; `kind` names the category.
    """
    obj = _find_json_object(text)
    missing = [k for k in captioners_lib.ANSWER_KEYS if k not in obj and k != "reason"]
    if missing:
        raise AnswerError("missing keys", f"the answer lacks {missing}")
    chars = obj["characters"]
    if not isinstance(chars, list) or not all(isinstance(c, str) for c in chars):
        raise AnswerError("bad characters", f"'characters' must be a list of names, got {chars!r}")
    by_lower = {c.lower(): c for c in cast}
    unknown = [c for c in chars if c.strip().lower() not in by_lower]
    if unknown:
        raise AnswerError("unknown character", f"unknown character(s) {unknown}; the cast is {list(cast)}")
    names = list(dict.fromkeys(by_lower[c.strip().lower()] for c in chars))
    adverb = _words(obj, "adverb", 1, 1)
    verb = _words(obj, "verb", 1, 6)
    when = _words(obj, "time", 1, 2)
    place = _words(obj, "place", 1, 4)
    states = {k: _state(obj, k) for k in label_schema.STATE_NAMES}
    reason = obj.get("reason", "")
    reason = " ".join(reason.split())[:200] if isinstance(reason, str) else ""
    line = {"type": "clip", "film_id": film_id, "clip_index": clip_index, "start": start, "characters": names,
            "action": f"{adverb} {verb}", "background": f"{when} {place}", "states": states}
    return label_schema.parse_clip(line, f"answer for film '{film_id}' clip {clip_index}"), reason
