r"""Label a film's clips automatically with a captioner (paper Sec. 3.3): film -> clips -> labels JSONL.

  python -m animegamer_jax.data.caption --config=configs/tiny.py \
      --film=my_film=/films/my_film.mp4 [--film_dir=/films] [--dataset=DIR] --characters=CHARS/ \
      --captioner=hf:/models/InternVL3-8B-hf --out=labels.jsonl [--config.label.batch_size=8]

Clips are planned exactly as `data.prepare` plans them (scene cuts, 2 s segments, `config.data`), so
the file this writes is the `--labels` file `prepare` reads (label_schema.py format). For every clip,
`config.label.num_frames` (4, the paper's) uniformly sampled frames go to the captioner together with
the reference images of every character (`CHARS/<name>/*.png`, the first `config.label.max_references`
in name order; `<name>` is the name written into the labels) and the prompt below. The answer is one
JSON object (captioners.ANSWER_KEYS): the characters present, the motion as adverb + verb phrase, the
background as time + place, the changes of social, entertainment and stamina (-5..5) and a short
reason. It is parsed (`parse_answer`: the first JSON object in the text, prose around it is ignored)
and validated against the label schema (`label_schema.parse_clip`, names against the cast); on failure the
clip is asked again with a stricter prompt that quotes the error (`config.label.max_retries` times),
and then written as an `unlabelled` line with the reason and the answer's start: never dropped, never
guessed. The paper asks two prompts (characters, then motion / background / states); here both are one
prompt and one generation per clip. The motion LEVEL is not asked: `prepare` computes it from optical
flow (data/motion.py); the prompt states it so that the adverb agrees with it.

Output: a header comment (`# animegamer-label {...}`: captioner, films, cast, the planning config),
one `film` line per film declaring the cast, then one `clip` or `unlabelled` line per clip, in clip
order per batch (`clip` lines carry the captioner's "reason" beside the schema fields; `prepare`
ignores it). Review the file before training.

Resumable: lines are appended and synced after every batch; a rerun with the same `--out` verifies the
header (same films, cast, captioner and planning config) and every written clip's start time against
the plan, drops a torn last line, and captions only the clips not yet in the file. A file without the
header (e.g. hand-written labels) is never touched; `--overwrite` restarts a file this command wrote.
Paths are etils.epath paths (local or cloud URLs; films are decoded with PyAV from local paths).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from absl import flags
from etils import epath
from ml_collections import config_flags
from PIL import Image
from tqdm import tqdm

from animegamer_jax import cli as cli_lib
from animegamer_jax import paths
from animegamer_jax.data import captioners as captioners_lib
from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import label_schema, motion
from animegamer_jax.data.films import films_of_dataset, list_film_dir, parse_film_arg

HEADER_PREFIX = "# animegamer-label "
FORMAT_VERSION = 1
_PLAN_KEYS = ("num_frames", "fps", "clip_seconds", "scene_threshold")


class AnswerError(ValueError):
    """A captioner answer that is not a valid label; `kind` is a short category for the summary."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# ----------------------------------------------------------------------------- inputs


def load_references(characters_dir: str, max_per_character: int = 2) -> dict[str, tuple[np.ndarray, ...]]:
    """Reference images of the cast: `characters_dir/<name>/*.png` -> {name: (uint8 [h, w, 3] RGB, ...)}.

    Names are the sub-folder names (sorted); each character's first `max_per_character` PNGs by file
    name are kept. Raises FileNotFoundError naming the folder when it is missing or a character folder
    holds no PNG; ValueError naming the file for an unreadable image.
    """
    root = epath.Path(characters_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{characters_dir}: no such characters folder (expected CHARS/<name>/*.png)")
    cast: dict[str, tuple[np.ndarray, ...]] = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        pngs = sorted(p for p in sub.iterdir() if p.suffix.lower() == ".png")
        if not pngs:
            raise FileNotFoundError(f"{sub}: character folder without a .png reference image")
        images = []
        for p in pngs[:max(1, int(max_per_character))]:
            try:
                images.append(np.asarray(Image.open(io.BytesIO(p.read_bytes())).convert("RGB")))
            except Exception as e:  # PIL raises several types for a bad file
                raise ValueError(f"{p}: not a readable PNG image ({e})") from e
        cast[sub.name] = tuple(images)
    if not cast:
        raise FileNotFoundError(f"{characters_dir}: no character folders (expected CHARS/<name>/*.png)")
    return cast


def sample_frame_indices(num_clip_frames: int, num_frames: int) -> np.ndarray:
    """int [num_frames]: uniformly spaced frame indices over a clip, first and last included."""
    return np.linspace(0, num_clip_frames - 1, num_frames).round().astype(int)


# ----------------------------------------------------------------------------- prompt and parser


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


# ----------------------------------------------------------------------------- the output file


def _header(captioner: str, films: Sequence[tuple[str, str]], cast: Sequence[str], config) -> dict:
    return {"format": FORMAT_VERSION, "captioner": captioner, "films": [f for f, _ in films], "cast": list(cast),
            "plan": {k: config.data[k] for k in _PLAN_KEYS},
            "size": [int(config.data.height), int(config.data.width)], "num_frames": int(config.label.num_frames)}


class _LineFile:
    """Appends lines to the labels file and makes them durable after every batch.

    Local files are appended to and fsync'ed; other URLs (object stores cannot append) are rewritten
    whole through a temporary object and a rename after every batch.
    """

    def __init__(self, path: epath.Path, lines: list[str]):
        self.path, self.lines = path, list(lines)
        self.local = "://" not in str(path)
        self._rewrite()  # the verified content (a torn last line dropped), atomically

    def _rewrite(self) -> None:
        tmp = self.path.parent / f".{self.path.name}.tmp"
        tmp.write_text("".join(line + "\n" for line in self.lines))
        tmp.replace(self.path)

    def append(self, new: Sequence[str]) -> None:
        self.lines.extend(new)
        if not self.local:
            self._rewrite()
            return
        with open(str(self.path), "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in new))
            f.flush()
            os.fsync(f.fileno())


def _read_existing(path: epath.Path, header: dict, overwrite: bool) -> tuple[list[str], dict[tuple[str, int], dict]]:
    """Verified lines of an earlier run (torn last line dropped) and its clip / unlabelled objects by key."""
    if not path.exists():
        return [], {}
    text = path.read_text()
    raw = text.split("\n")
    torn = raw[-1] != ""  # the last line was cut short by a kill
    raw = raw[:-1] if raw else raw
    if not raw or not raw[0].startswith(HEADER_PREFIX):
        raise FileExistsError(f"{path} exists and was not written by this command (no '{HEADER_PREFIX.strip()}' "
                              "header): it is left untouched; choose another --out")
    if overwrite:
        return [], {}
    old = json.loads(raw[0][len(HEADER_PREFIX):])
    diff = [k for k in header if old.get(k) != header[k]]
    if diff:
        changed = ", ".join(f"{k}: {old.get(k)!r} != {header[k]!r}" for k in diff)
        raise ValueError(f"{path} was written by another labelling run ({changed}); "
                         "use another --out, or --overwrite to start this file again")
    lines, done = [raw[0]], {}
    for n, line in enumerate(raw[1:], 2):
        if not line.strip() or line.startswith("#"):
            lines.append(line)
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e}); fix or remove the line, then rerun") from e
        if obj.get("type") in ("clip", "unlabelled"):
            key = (str(obj.get("film_id")), obj.get("clip_index"))
            if key in done:
                raise ValueError(f"{path}:{n}: film '{key[0]}' clip {key[1]} appears twice")
            done[key] = obj
        lines.append(line)
    if torn and text.rsplit("\n", 1)[-1].strip():
        try:
            obj = json.loads(text.rsplit("\n", 1)[-1])  # complete JSON, only its newline missing
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and obj.get("type") in ("clip", "unlabelled"):
            done[(str(obj.get("film_id")), obj.get("clip_index"))] = obj
            lines.append(text.rsplit("\n", 1)[-1])
    return lines, done


# ----------------------------------------------------------------------------- the command


@dataclasses.dataclass
class LabelReport:
    """What label_films did (counts of this run; `already` = clips found done in the file)."""

    out: str
    total: int
    already: int
    labelled: int
    retried: int
    unlabelled: int
    reasons: dict[str, int]
    seconds: float

    def summary(self) -> str:
        done = self.labelled + self.unlabelled
        line = (f"labelled {self.labelled} / retried {self.retried} / unlabelled {self.unlabelled} "
                f"of {done} clip(s) captioned in {self.seconds:.1f} s")
        if self.already:
            line += f" ({self.already} already in the file)"
        line += f"; {self.out} holds {self.already + done} of {self.total} clips"
        if self.reasons:
            line += "; unlabelled because: " + ", ".join(f"{k} ({v})" for k, v in sorted(self.reasons.items()))
        return line


def _batches(items: Iterator, size: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def label_films(films: Sequence[tuple[str, str]], captioner: captioners_lib.Captioner, out: str, config,
                characters_dir: str = "", overwrite: bool = False, progress: bool = True,
                log: Callable[[str], None] = lambda s: None) -> LabelReport:
    """Labels every clip of `films` with `captioner` into the labels JSONL `out` (module docstring).

    Args:
      films: (film_id, video path) pairs, ids unique.
      captioner: a captioners.Captioner.
      out: the labels file (created, or resumed when it holds an earlier run of the same job).
      config: the full config (`data` plans the clips, `label` the captioning).
      characters_dir: CHARS/ with <name>/*.png reference images ("" = no named characters).
      overwrite: restart a file an earlier run of this command wrote (never a file without its header).
      progress: show a progress bar (tqdm, on stderr).
      log: message callback.

    Raises:
      FileExistsError: `out` exists and was not written by this command.
      ValueError: `out` belongs to another labelling run, or a clip in it does not match the plan;
        duplicate film ids.
      video.VideoError, clips.FilmTooShortError: a bad film (named).
    """
    t0 = time.time()
    ids = [f for f, _ in films]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate film ids in {ids}")
    lcfg, dcfg = config.label, config.data
    references = load_references(characters_dir, int(lcfg.max_references)) if characters_dir else {}
    cast = list(references)
    plans = []
    for film_id, path in films:
        specs, scenes, info = clips_lib.plan_film(path, film_id, dcfg)
        log(f"{film_id}: {len(scenes)} scenes, {len(specs)} clips")
        plans.append((film_id, path, specs))
    total = sum(len(s) for _, _, s in plans)

    out_path = epath.Path(out)
    header = _header(captioner.name, films, cast, config)
    lines, done = _read_existing(out_path, header, overwrite)
    planned = {(f, s.clip_index): s for f, _, specs in plans for s in specs}
    for key, obj in done.items():
        spec = planned.get(key)
        if spec is None or abs(float(obj.get("start", -1.0)) - spec.start_time) > label_schema.START_TOLERANCE_S:
            raise ValueError(f"{out}: film '{key[0]}' clip {key[1]} does not match the clip plan of this run "
                             "(another cut of the film?); use another --out, or --overwrite to start again")
    if not lines:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        lines = [HEADER_PREFIX + json.dumps(header)]
        lines += [json.dumps({"type": "film", "film_id": f, "characters": cast}) for f, _, _ in plans]
    writer = _LineFile(out_path, lines)
    if done:
        log(f"resuming {out}: {len(done)} of {total} clips already labelled")

    def pending_clips() -> Iterator[clips_lib.Clip]:
        for film_id, path, specs in plans:
            todo = [s for s in specs if (film_id, s.clip_index) not in done]
            if todo:
                yield from clips_lib.extract_clips(path, todo, int(dcfg.height), int(dcfg.width))

    bins = tuple(float(b) for b in dcfg.motion_bins)
    labelled = retried = unlabelled = 0
    reasons: collections.Counter = collections.Counter()
    bar = tqdm(total=total, initial=len(done), unit="clip", desc="label", disable=not progress, file=sys.stderr)
    try:
        for batch in _batches(pending_clips(), max(1, int(lcfg.batch_size))):
            base = []
            for clip in batch:
                frames = clip.frames[sample_frame_indices(clip.frames.shape[0], int(lcfg.num_frames))]
                level = motion.motion_level(motion.motion_scope(clip.frames, r=float(dcfg.flow_threshold)), bins)
                base.append(captioners_lib.CaptionRequest(
                    (clip.spec.film_id, clip.spec.clip_index), frames, references, level,
                    build_prompt(references, frames, level)))
            results: dict[int, tuple] = {}
            errors: dict[int, tuple[AnswerError, str]] = {}
            todo = list(range(len(batch)))
            for attempt in range(1 + max(0, int(lcfg.max_retries))):
                reqs = [base[i] if attempt == 0 else dataclasses.replace(
                    base[i], strict=True, prompt=build_prompt(references, base[i].frames, base[i].motion_level,
                                                              strict=True, previous_error=str(errors[i][0])))
                        for i in todo]
                answers = captioner.caption(reqs)
                if len(answers) != len(reqs):
                    raise RuntimeError(f"captioner {captioner.name} returned {len(answers)} answers for "
                                       f"{len(reqs)} clips")
                failed = []
                for i, answer in zip(todo, answers):
                    spec = batch[i].spec
                    try:
                        parsed = parse_answer(answer, cast, spec.film_id, spec.clip_index, spec.start_time)
                        results[i] = (*parsed, attempt)
                    except (AnswerError, label_schema.LabelError) as e:
                        err = e if isinstance(e, AnswerError) else AnswerError("invalid label", str(e))
                        errors[i] = (err, answer)
                        failed.append(i)
                todo = failed
                if not todo:
                    break
            new_lines = []
            for i, clip in enumerate(batch):
                spec = clip.spec
                if i in results:
                    label, reason, attempt = results[i]
                    new_lines.append(json.dumps({**label.to_json(), "reason": reason}))
                    labelled += 1
                    retried += attempt > 0
                else:
                    err, answer = errors[i]
                    reasons[err.kind] += 1
                    retried += int(lcfg.max_retries) > 0
                    snippet = " ".join(answer.split())[:120]
                    new_lines.append(json.dumps({
                        "type": "unlabelled", "film_id": spec.film_id, "clip_index": spec.clip_index,
                        "start": round(spec.start_time, 4),
                        "reason": f"{err} after {1 + int(lcfg.max_retries)} attempt(s); answer began {snippet!r}"}))
                    unlabelled += 1
            writer.append(new_lines)
            bar.update(len(batch))
    finally:
        bar.close()
    return LabelReport(str(out_path), total, len(done), labelled, retried, unlabelled, dict(reasons),
                       time.time() - t0)


def define_flags(fv, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.data.caption`` on ``fv`` (absl + ml_collections config_flags)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"),
                                    "Config file: `data` plans the clips (as prepare does), `label` the captioning.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_multi_string("film", None, "FILM_ID=PATH (or PATH, id = file stem); repeat per film.",
                              flag_values=fv)
    flags.DEFINE_string("film_dir", "", "Folder of films (every video file in it; id = file stem).", flag_values=fv)
    flags.DEFINE_string("dataset", "", "A dataset written by data.prepare: label its films again.", flag_values=fv)
    flags.DEFINE_string("characters", "", "Folder CHARS/ with CHARS/<name>/*.png reference images of each "
                        "character.", flag_values=fv)
    flags.DEFINE_string("captioner", None, "hf:/local/vlm/folder (transformers VLM, e.g. InternVL), rule "
                        "(rule-based baseline), or py:package.module:factory.", flag_values=fv)
    flags.DEFINE_string("out", "labels.jsonl", "Labels JSONL to write (resumed when it holds an earlier run).",
                        flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Restart an output file that an earlier run of this command wrote.",
                      flag_values=fv)
    flags.DEFINE_bool("progress", True, "Show a progress bar (--noprogress to hide it).", flag_values=fv)
    cli_lib.define_verbosity(fv)
    flags.mark_flag_as_required("captioner", flag_values=fv)


def main(argv: Sequence[str] | None = None) -> int:
    """Labels the films' clips and prints the summary; returns the exit status (2 with a one-line message
    on a bad command line or a bad input)."""
    return cli_lib.run_command("python -m animegamer_jax.data.caption", argv, define_flags, __doc__, (), _run,
                               (FileNotFoundError, FileExistsError, ValueError))


def _run(f) -> int:
    """The body of :func:`main` on parsed flags ``f``."""
    films = [parse_film_arg(a) for a in f.film or []]
    if f.film_dir:
        films += list_film_dir(f.film_dir)
    if f.dataset:
        films += films_of_dataset(f.dataset)
    if not films:
        raise cli_lib.UsageError("give the films to label: --film=ID=PATH (repeatable), --film_dir=DIR or "
                                 "--dataset=DIR")
    cfg = f.config
    captioner = captioners_lib.make_captioner(f.captioner, cfg.label)
    report = label_films(films, captioner, f.out, cfg, characters_dir=f.characters, overwrite=f.overwrite,
                         progress=f.progress, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(report.summary(), flush=True)
    return 0


def cli() -> None:
    """Console script ``animegamer-label`` (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
