r"""Label films' clips automatically with a captioner (paper Sec. 3.3): films -> clips -> labels JSONL, on Beam.

  python -m animegamer_jax.commands.data caption --config=configs/tiny.py \
      --film=my_film=/films/my_film.mp4 [--film_dir=/films] [--dataset=DIR] --characters=CHARS/ \
      --captioner=hf:/models/InternVL3-8B-hf --out=labels.jsonl [--config.label.batch_size=8] \
      [--beam_pipeline_options=--runner=DirectRunner,--direct_num_workers=2,--direct_running_mode=multi_processing]

Clips are planned exactly as `data.prepare` plans them (scene cuts, 2 s segments, `config.data`), so
the file this writes is the `--labels` file `prepare` reads (label_schema.py format). For every clip,
`config.label.num_frames` (4, the paper's) uniformly sampled frames go to the captioner together with
the reference images of every character (`CHARS/<name>/*.png`, the first `config.label.max_references`
in name order; `<name>` is the name written into the labels) and the prompt (data/caption_prompt.py).
The answer is parsed and validated against the label schema (caption_prompt.parse_answer); on failure
the clip is asked again with a stricter prompt that quotes the error (`config.label.max_retries`
times), and then written as an `unlabelled` line with the reason and the answer's start: never
dropped, never guessed. The paper asks two prompts (characters, then motion / background / states);
here both are one prompt and one generation per clip.

Engine: an Apache Beam pipeline, the dataset builder's (`--beam_pipeline_options`, beam_util.py; "" =
DirectRunner in this process):
  films (position, id, path, clips already done)
  -> FilmClipsFn, per film: plan (clips.plan_film), check the done clips against the plan, decode the
     others (clips.extract_clips) -> ClipInput (sampled frames uint8 [N, H, W, 3], motion level), in
     batches of `config.label.batch_size` consecutive clips of the film
  -> CaptionFn: `setup()` builds the captioner once per worker (captioners.make_captioner: a model is
     never loaded per element) and loads the references; `process()` captions one batch
     (`caption_batch`: prompt, retries, validation) and writes its lines as one part file.
Batches are cut per film in FilmClipsFn, not by beam.BatchElements: a batch is then a run of one
film's clips whatever the runner's bundles, so its part file is named by film and first clip and a
rerun cuts the same batches; the cost is at most one short batch per film. A film is decoded and
captioned on one worker: films are the unit of parallelism.

Bad films fail alone: one that cannot be decoded or holds no whole clip (video.VideoError,
clips.FilmTooShortError) is counted (Beam counter `animegamer/films_failed`) and listed with the
reason (`LabelReport.failed`, the summary; exit status 1); the others are labelled, and the clips a
film yielded before a decoding error keep their labels.

Output: a header comment (`# animegamer-label {...}`: captioner spec, films, cast, the planning
config), one `film` line per film declaring the cast, then one `clip` or `unlabelled` line per clip,
films in the given order, clips in clip order (`clip` lines carry the captioner's "reason" beside the
schema fields; `prepare` ignores it). Review the file before training.

Resumable: each captioned batch is durable as soon as it is written, atomically, as
`<out folder>/.<out name>.parts/film<P>-clip<C>.jsonl` (P: the film's position in the header's film
list, C: the batch's first clip; the folder's `header.json` names the run). At the end the driver
merges the parts and the clips of an existing `--out` in film / clip order into `--out`, atomically,
and removes the parts folder. A rerun with the same `--out` verifies the header of `--out` and of the
parts folder (same films, cast, captioner and planning config) and every done clip's start time
against the plan, drops a torn last line of an `--out` that an older version appended to, and
captions only the clips in neither. A file or parts folder without the header (e.g. hand-written
labels) is never touched; `--overwrite` restarts what this command wrote.
Paths are etils.epath paths (local or cloud URLs; films are decoded with PyAV from local paths).

Errors (exit status 2, one line): FileExistsError / ValueError for an `--out` or parts folder of
another run or not ours, a done clip off the plan, duplicate film ids, a bad `--captioner` or
`--beam_pipeline_options`.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence

import apache_beam as beam
import numpy as np
from absl import logging
from apache_beam.options.pipeline_options import PipelineOptions
from etils import epath
from PIL import Image
from tqdm import tqdm

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.data import beam_util
from animegamer_jax.data import captioners as captioners_lib
from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import label_schema, motion, video
from animegamer_jax.data.caption_prompt import AnswerError, build_prompt, parse_answer

HEADER_PREFIX = "# animegamer-label "
FORMAT_VERSION = 1
_PLAN_KEYS = ("num_frames", "fps", "clip_seconds", "scene_threshold")



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


# ----------------------------------------------------------------------------- captioning one batch


@dataclasses.dataclass(frozen=True)
class ClipInput:
    """One decoded clip on its way to the captioner (an element of a FilmClipsFn batch).

    Attributes:
      film_pos: the film's position in the run's film list (orders the output, names part files).
      spec: the clip's ClipSpec.
      frames: uint8 [N, H, W, 3] RGB, the clip's `config.label.num_frames` uniformly sampled frames.
      motion_level: 1..5, optical flow over all the clip's frames (data/motion.py).
    """

    film_pos: int
    spec: clips_lib.ClipSpec
    frames: np.ndarray
    motion_level: int


def clip_input(film_pos: int, clip: clips_lib.Clip, num_frames: int, data_cfg) -> ClipInput:
    """The sampled frames and motion level of a decoded clip."""
    level = motion.motion_level(motion.motion_scope(clip.frames, r=float(data_cfg.flow_threshold)),
                                tuple(float(b) for b in data_cfg.motion_bins))
    return ClipInput(film_pos, clip.spec, clip.frames[sample_frame_indices(clip.frames.shape[0], num_frames)], level)


def caption_batch(captioner: captioners_lib.Captioner, batch: Sequence[ClipInput],
                  references: dict[str, Sequence[np.ndarray]], label_cfg) -> tuple[list[str], collections.Counter]:
    """Captions a batch: one request per clip, failed answers asked again with the strict prompt
    (`label_cfg.max_retries` times, the failed ones of the batch in one call each time).

    Returns:
      (lines, counts): one labels-JSONL line per clip, in batch order (`clip` with the reason, or
      `unlabelled` with the error and the answer's start); counts of `clips_labelled`,
      `clips_retried`, `clips_unlabelled` and `unlabelled: <AnswerError kind>`.

    Raises:
      RuntimeError: the captioner returned a wrong number of answers.
    """
    cast = list(references)
    max_retries = max(0, int(label_cfg.max_retries))
    base = [captioners_lib.CaptionRequest((c.spec.film_id, c.spec.clip_index), c.frames, references, c.motion_level,
                                          build_prompt(references, c.frames, c.motion_level)) for c in batch]
    results: dict[int, tuple] = {}
    errors: dict[int, tuple[AnswerError, str]] = {}
    todo = list(range(len(batch)))
    for attempt in range(1 + max_retries):
        reqs = [base[i] if attempt == 0 else dataclasses.replace(
            base[i], strict=True, prompt=build_prompt(references, base[i].frames, base[i].motion_level,
                                                      strict=True, previous_error=str(errors[i][0])))
                for i in todo]
        answers = captioner.caption(reqs)
        if len(answers) != len(reqs):
            raise RuntimeError(f"captioner {captioner.name} returned {len(answers)} answers for {len(reqs)} clips")
        failed = []
        for i, answer in zip(todo, answers):
            spec = batch[i].spec
            try:
                results[i] = (*parse_answer(answer, cast, spec.film_id, spec.clip_index, spec.start_time), attempt)
            except (AnswerError, label_schema.LabelError) as e:
                errors[i] = (e if isinstance(e, AnswerError) else AnswerError("invalid label", str(e)), answer)
                failed.append(i)
        todo = failed
        if not todo:
            break
    lines, counts = [], collections.Counter()
    for i, clip in enumerate(batch):
        spec = clip.spec
        if i in results:
            label, reason, attempt = results[i]
            lines.append(json.dumps({**label.to_json(), "reason": reason}))
            counts["clips_labelled"] += 1
            counts["clips_retried"] += attempt > 0
        else:
            err, answer = errors[i]
            snippet = " ".join(answer.split())[:120]
            lines.append(json.dumps({
                "type": "unlabelled", "film_id": spec.film_id, "clip_index": spec.clip_index,
                "start": round(spec.start_time, 4),
                "reason": f"{err} after {1 + max_retries} attempt(s); answer began {snippet!r}"}))
            counts["clips_unlabelled"] += 1
            counts["clips_retried"] += max_retries > 0
            counts[f"unlabelled: {err.kind}"] += 1
    return lines, counts


# ----------------------------------------------------------------------------- the Beam pipeline

_PART = "film{pos:05d}-clip{clip:06d}.jsonl"
_FAILED = "failed-film{pos:05d}.json"
_PARTS_HEADER = "header.json"


def _counter(name: str):
    return beam.metrics.Metrics.counter(beam_util.NAMESPACE, name)


class FilmClipsFn(beam.DoFn):
    """(film_pos, film_id, path, {done clip_index: start}) -> batches (lists) of ClipInput.

    Plans the film, checks the done clips against the plan, decodes the others and emits them in
    batches of `label_cfg.batch_size` consecutive clips. A bad film (video.VideoError,
    clips.FilmTooShortError) or a done clip off the plan is written as `failed-film<P>.json` (kind,
    reason) into the parts folder instead; only the bad film counts in `films_failed`.
    """

    def __init__(self, data_cfg, label_cfg, parts: str):
        self.data_cfg, self.label_cfg, self.parts = data_cfg, label_cfg, parts

    def _fail(self, pos: int, film_id: str, kind: str, reason: str, clip_index: int | None = None) -> None:
        if kind == "film":
            _counter("films_failed").inc()
        fileio.write_text_atomic(paths.join(self.parts, _FAILED.format(pos=pos)), json.dumps(
            {"film_id": film_id, "kind": kind, "reason": reason, "clip_index": clip_index}))

    def process(self, element):
        pos, film_id, path, done = element
        dcfg = self.data_cfg
        try:
            specs, scenes, _ = clips_lib.plan_film(path, film_id, dcfg)
        except (video.VideoError, clips_lib.FilmTooShortError) as e:
            self._fail(pos, film_id, "film", str(e))
            return
        logging.info("%s: %d scenes, %d clips", film_id, len(scenes), len(specs))
        _counter("clips_planned").inc(len(specs))
        starts = {s.clip_index: s.start_time for s in specs}
        for clip_index, start in sorted(done.items()):
            if clip_index not in starts or abs(float(start) - starts[clip_index]) > label_schema.START_TOLERANCE_S:
                self._fail(pos, film_id, "plan", f"film '{film_id}' clip {clip_index} does not match the clip plan "
                           "of this run (another cut of the film?)", clip_index)
                return
        todo = [s for s in specs if s.clip_index not in done]
        if not todo:
            return
        size, num_frames = max(1, int(self.label_cfg.batch_size)), int(self.label_cfg.num_frames)
        clips = clips_lib.extract_clips(path, todo, int(dcfg.height), int(dcfg.width))
        batch = []
        while True:
            # next() alone in the try: a yield hands the batch to the fused CaptionFn, whose errors are not ours
            try:
                clip = next(clips)
            except StopIteration:
                break
            except video.VideoError as e:
                self._fail(pos, film_id, "film", str(e))
                break
            batch.append(clip_input(pos, clip, num_frames, dcfg))
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch


class CaptionFn(beam.DoFn):
    """A batch of ClipInput -> its labels lines, written as one part file (atomically); nothing emitted.

    `setup()` builds the captioner (captioners.make_captioner(spec, label_cfg): the model is loaded once
    per worker) and loads the reference images of `characters_dir`.
    """

    def __init__(self, captioner: str, label_cfg, characters_dir: str, parts: str):
        self.spec, self.label_cfg, self.characters_dir, self.parts = captioner, label_cfg, characters_dir, parts

    def setup(self):
        self.captioner = captioners_lib.make_captioner(self.spec, self.label_cfg)
        self.references = (load_references(self.characters_dir, int(self.label_cfg.max_references))
                           if self.characters_dir else {})

    def process(self, batch):
        lines, counts = caption_batch(self.captioner, batch, self.references, self.label_cfg)
        name = _PART.format(pos=batch[0].film_pos, clip=batch[0].spec.clip_index)
        fileio.write_text_atomic(paths.join(self.parts, name), "".join(line + "\n" for line in lines))
        for key, n in counts.items():
            _counter(key).inc(n)
        return []


# ----------------------------------------------------------------------------- the output file


def _header(captioner: str, films: Sequence[tuple[str, str]], cast: Sequence[str], config) -> dict:
    return {"format": FORMAT_VERSION, "captioner": captioner, "films": [f for f, _ in films], "cast": list(cast),
            "plan": {k: config.data[k] for k in _PLAN_KEYS},
            "size": [int(config.data.height), int(config.data.width)], "num_frames": int(config.label.num_frames)}


def _key(obj: dict) -> tuple[str, object]:
    return str(obj.get("film_id")), obj.get("clip_index")


def _read_existing(path: epath.Path, header: dict, overwrite: bool) -> dict[tuple[str, int], tuple[dict, str]]:
    """The clip / unlabelled lines of an earlier run's `path` by key: (object, line); a torn last line
    (an older version appended per batch) is dropped, a complete one missing its newline kept."""
    if not path.exists():
        return {}
    text = path.read_text()
    raw = text.split("\n")
    torn = raw[-1] != ""  # the last line was cut short by a kill
    raw = raw[:-1] if raw else raw
    if not raw or not raw[0].startswith(HEADER_PREFIX):
        raise FileExistsError(f"{path} exists and was not written by this command (no '{HEADER_PREFIX.strip()}' "
                              "header): it is left untouched; choose another --out")
    if overwrite:
        return {}
    _check_header(json.loads(raw[0][len(HEADER_PREFIX):]), header, path)
    done = {}
    for n, line in enumerate(raw[1:], 2):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e}); fix or remove the line, then rerun") from e
        if obj.get("type") in ("clip", "unlabelled"):
            if _key(obj) in done:
                raise ValueError(f"{path}:{n}: film '{_key(obj)[0]}' clip {_key(obj)[1]} appears twice")
            done[_key(obj)] = (obj, line)
    if torn and text.rsplit("\n", 1)[-1].strip():
        try:
            obj = json.loads(text.rsplit("\n", 1)[-1])  # complete JSON, only its newline missing
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and obj.get("type") in ("clip", "unlabelled"):
            done[_key(obj)] = (obj, text.rsplit("\n", 1)[-1])
    return done


def _check_header(old: dict, header: dict, where) -> None:
    diff = [k for k in header if old.get(k) != header[k]]
    if diff:
        changed = ", ".join(f"{k}: {old.get(k)!r} != {header[k]!r}" for k in diff)
        raise ValueError(f"{where} was written by another labelling run ({changed}); "
                         "use another --out, or --overwrite to start this file again")


def _open_parts(parts: str, header: dict, overwrite: bool) -> dict[tuple[str, int], tuple[dict, str]]:
    """Creates the parts folder (or verifies an earlier run's, `--overwrite`: empties it) and returns
    the lines its part files hold by key; stale failure records and temporary files are removed."""
    if fileio.exists(parts):
        names = fileio.listdir(parts)
        if _PARTS_HEADER in names:
            if not overwrite:
                _check_header(json.loads(fileio.read_bytes(paths.join(parts, _PARTS_HEADER))), header, parts)
        elif any(not n.startswith(".") for n in names):  # empty or temporary files only: killed at creation
            raise FileExistsError(f"{parts} exists and was not written by this command (no {_PARTS_HEADER}): it "
                                  "is left untouched; choose another --out")
        if overwrite:
            fileio.rmtree(parts)
    if not fileio.exists(parts) or _PARTS_HEADER not in fileio.listdir(parts):
        fileio.makedirs(parts)
        fileio.write_text_atomic(paths.join(parts, _PARTS_HEADER), json.dumps(header))
    done: dict[tuple[str, int], tuple[dict, str]] = {}
    for name in fileio.listdir(parts):
        if name.startswith(".") or name.startswith("failed-"):
            fileio.remove(paths.join(parts, name))
        elif name.endswith(".jsonl"):
            for n, line in enumerate(fileio.read_bytes(paths.join(parts, name)).decode("utf-8").splitlines(), 1):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{paths.join(parts, name)}:{n}: not valid JSON ({e}); remove the file, "
                                     "then rerun") from e
                done.setdefault(_key(obj), (obj, line))
    return done


def _part_lines(parts: str) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    for name in fileio.listdir(parts):
        if name.endswith(".jsonl") and not name.startswith("."):
            for line in fileio.read_bytes(paths.join(parts, name)).decode("utf-8").splitlines():
                out.setdefault(_key(json.loads(line)), line)
    return out


def _watch_parts(parts: str, seen: set[str], bar: tqdm, stop: threading.Event) -> None:
    """Advances `bar` by the clips of every part file not in `seen` until `stop` is set (the progress of
    workers that may run anywhere, read where they write)."""
    while True:
        stopping = stop.wait(1.0)
        try:
            for name in fileio.listdir(parts):
                if name not in seen and name.endswith(".jsonl") and not name.startswith("."):
                    seen.add(name)
                    bar.update(fileio.read_bytes(paths.join(parts, name)).count(b"\n"))
        except OSError:  # a listing racing a write or the final removal
            pass
        if stopping:
            return


# ----------------------------------------------------------------------------- the command


@dataclasses.dataclass
class LabelReport:
    """What label_films did (counts of this run; `already` = clips found done in `out` or its parts;
    `failed` = (film_id, reason) of the films that could not be labelled; `counters` = the pipeline's
    Beam counters: films_failed, clips_planned, clips_labelled, clips_retried, clips_unlabelled,
    "unlabelled: <kind>")."""

    out: str
    total: int
    already: int
    labelled: int
    retried: int
    unlabelled: int
    reasons: dict[str, int]
    seconds: float
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    counters: dict[str, int] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        done = self.labelled + self.unlabelled
        line = (f"labelled {self.labelled} / retried {self.retried} / unlabelled {self.unlabelled} "
                f"of {done} clip(s) captioned in {self.seconds:.1f} s")
        if self.already:
            line += f" ({self.already} already in the file)"
        line += f"; {self.out} holds {self.already + done} of {self.total} clips"
        if self.reasons:
            line += "; unlabelled because: " + ", ".join(f"{k} ({v})" for k, v in sorted(self.reasons.items()))
        if self.failed:
            line += f"; {len(self.failed)} film(s) failed: " + ", ".join(f"{f} ({r})" for f, r in self.failed)
        return line


def label_films(films: Sequence[tuple[str, str]], captioner: str, out: str, config, characters_dir: str = "",
                overwrite: bool = False, progress: bool = True, log: Callable[[str], None] = lambda s: None,
                pipeline_options: PipelineOptions | None = None) -> LabelReport:
    """Labels every clip of `films` with `captioner` into the labels JSONL `out` (module docstring).

    Args:
      films: (film_id, video path) pairs, ids unique.
      captioner: a captioners.make_captioner spec ("rule", "hf:DIR", "py:module:factory"); each Beam
        worker builds it once. It is the header's captioner.
      out: the labels file (created, or resumed when it or its parts folder holds an earlier run of
        the same job).
      config: the full config (`data` plans the clips, `label` the captioning).
      characters_dir: CHARS/ with <name>/*.png reference images ("" = no named characters).
      overwrite: restart a file an earlier run of this command wrote (never a file without its header).
      progress: show a progress bar of the captioned clips (tqdm, on stderr).
      log: message callback.
      pipeline_options: Beam options (beam_util.beam_options); None = DirectRunner in this process.

    Returns:
      The LabelReport; bad films are in `failed`, the others labelled.

    Raises:
      FileExistsError: `out` (or its parts folder) exists and was not written by this command.
      ValueError: `out` belongs to another labelling run, or a clip in it does not match the plan;
        duplicate film ids; a bad captioner spec.
    """
    t0 = time.time()
    ids = [f for f, _ in films]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate film ids in {ids}")
    captioners_lib.check_spec(captioner)
    lcfg, dcfg = config.label, config.data
    cast = list(load_references(characters_dir, int(lcfg.max_references)) if characters_dir else {})
    out_path = epath.Path(out)
    header = _header(captioner, films, cast, config)
    done_out = _read_existing(out_path, header, overwrite)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    parts = str(out_path.parent / f".{out_path.name}.parts")
    done = {**_open_parts(parts, header, overwrite), **done_out}
    if done:
        log(f"resuming {out}: {len(done)} clips already labelled")

    pos_of = {film_id: pos for pos, film_id in enumerate(ids)}
    elements = [(pos, film_id, path, {k[1]: float(obj.get("start", -1.0)) for k, (obj, _) in done.items()
                                      if k[0] == film_id})
                for pos, (film_id, path) in enumerate(films)]
    strays = sorted(k for k in done if k[0] not in pos_of)
    if strays:
        raise ValueError(f"{out}: film '{strays[0][0]}' clip {strays[0][1]} is not a film of this run")
    pipeline = beam.Pipeline(options=pipeline_options or beam_util.beam_options(""))
    _ = (pipeline
         | "Films" >> beam.Create(elements)
         | "PlanAndDecode" >> beam.ParDo(FilmClipsFn(dcfg, lcfg, parts))
         | "Caption" >> beam.ParDo(CaptionFn(captioner, lcfg, characters_dir, parts)))
    bar = tqdm(initial=len(done), unit="clip", desc="label", disable=not progress, file=sys.stderr)
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_parts, args=(parts, set(fileio.listdir(parts)), bar, stop),
                               daemon=True)
    if progress:
        watcher.start()
    try:
        result = pipeline.run()
        result.wait_until_finish()
    finally:
        stop.set()
        if progress:
            watcher.join()
        bar.close()
    counts = beam_util.counters(result)

    failures = [json.loads(fileio.read_bytes(paths.join(parts, n))) for n in fileio.listdir(parts)
                if n.startswith("failed-")]
    off_plan = [f for f in failures if f["kind"] == "plan"]
    if off_plan:  # the parts of the other films stay for the rerun
        raise ValueError(f"{out}: {off_plan[0]['reason']}; use another --out, or --overwrite to start again")
    lines = {**_part_lines(parts), **{k: line for k, (_, line) in done_out.items()}}
    body = [HEADER_PREFIX + json.dumps(header)]
    body += [json.dumps({"type": "film", "film_id": f, "characters": cast}) for f in ids]
    body += [lines[k] for k in sorted(lines, key=lambda k: (pos_of[k[0]], k[1]))]
    fileio.write_text_atomic(out_path, "".join(line + "\n" for line in body))
    fileio.rmtree(parts)
    failed = [(f["film_id"], f["reason"]) for f in sorted(failures, key=lambda f: pos_of[f["film_id"]])]
    for film_id, reason in failed:
        log(f"{film_id}: failed ({reason})")
    reasons = {k.split(": ", 1)[1]: v for k, v in counts.items() if k.startswith("unlabelled: ") and v}
    return LabelReport(str(out_path), counts.get("clips_planned", 0), len(done), counts.get("clips_labelled", 0),
                       counts.get("clips_retried", 0), counts.get("clips_unlabelled", 0), reasons,
                       time.time() - t0, failed, counts)
