"""The toy world: a procedural data set of named sprite characters, rendered with numpy (no download).

K characters (default 8), each a shape (circle, square, triangle, star, diamond, ring, cross, hexagon),
two colours and a pattern (stripes, dots, checks, halves) with a dark outline, move through backgrounds
(sky, checkered hall, striped room, desert) with labelled motions (walk left / right, jump, spin, stand
still, grow, shrink; slowly or quickly). A film shows ONE character in ``scenes_per_film`` scenes
separated by hard cuts; consecutive scenes always differ in background (so PySceneDetect finds every
cut at the generator's frame) and every character meets several backgrounds. ``num_heldout`` characters
(default 2, drawn from the seed) are held out: their films go to ``heldout/``, the others to ``train/``.

Command (also ``python -m animegamer_jax.commands.data sample --world=toy``):
  python -m animegamer_jax.commands.data sample --world=toy --out_dir data/prepared/toy

Writes into ``--out_dir``:
  train/<film_id>.mp4, heldout/<film_id>.mp4   H.264 films (video.write_film), film_id "toy_<name>_<k>"
  characters/<Name>/reference.png             each character centred on plain grey at the film size (the
                                              layout data.caption --characters reads)
  labels.jsonl                                the generator's ground truth as clip labels (label_schema) of
                                              every film, clips planned as data.prepare plans them
  manifest.json                               characters (+ reference, heldout), backgrounds, films with
                                              their scenes (frames, background, motion, action) and cuts
Same arguments and seed: the same bytes (x264 single-threaded with fixed options). A folder that holds
other files than a toy world's is refused; files of an earlier toy world that the new one lacks are
removed.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile

import numpy as np
from PIL import Image

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import label_schema, scenes, video

FORMAT = "animegamer_jax.toy_world/1"
TOY_SIZE = (192, 128)  # (width, height): 3:2 like the tiny config's 96x64 clips, so nothing is cropped
TOY_FPS = 25.0
NAMES = ("Pip", "Bolt", "Mira", "Tuck", "Zed", "Lumo", "Kira", "Fenn", "Oru", "Sable", "Nim", "Quill")
SHAPES = ("circle", "square", "triangle", "star", "diamond", "ring", "cross", "hexagon")
PATTERNS = ("stripes", "dots", "checks", "halves")
COLOURS = {"red": (220, 40, 40), "orange": (240, 140, 30), "yellow": (240, 220, 40), "green": (50, 180, 60),
           "cyan": (40, 200, 210), "blue": (40, 80, 220), "purple": (140, 60, 200), "pink": (240, 110, 180)}
#: background name -> its label text ("<time> <place>", label_schema)
BACKGROUNDS = {"sky": "day sky", "checkered": "day checkered hall", "stripes": "night striped room",
               "desert": "evening desert"}
#: motion -> (verb phrase, (SC, ET, ST) slowly, (SC, ET, ST) quickly): the labels' ground truth
MOTIONS = {"walk_left": ("walk left", (0, 0, -1), (0, 1, -2)), "walk_right": ("walk right", (0, 0, -1), (0, 1, -2)),
           "jump": ("jump", (0, 1, -1), (0, 2, -2)), "spin": ("spin around", (0, 1, 0), (0, 2, -1)),
           "stand": ("stand still", (0, 0, 2), (0, 0, 2)), "grow": ("grow bigger", (1, 1, 0), (1, 2, -1)),
           "shrink": ("shrink", (-1, 0, 0), (-1, 0, -1))}
ADVERBS = ("slowly", "quickly")
_OUTLINE = np.array((25, 25, 25), np.float32)
_GREY = (128, 128, 128)
RADIUS = 0.2  # a sprite's radius, as a fraction of the frame height
#: libx264 options of the films: with x264's macroblock tree on, the bytes of these small flat-colour films
#: vary from run to run (same frames); without it they repeat
X264_PARAMS = "mbtree=0"


@dataclasses.dataclass(frozen=True)
class Character:
    """A sprite: name, shape (SHAPES), main and second colour (COLOURS names), pattern (PATTERNS)."""

    name: str
    shape: str
    colour: str
    colour2: str
    pattern: str

    @property
    def description(self) -> str:
        return f"{self.colour} {self.shape} with {self.colour2} {self.pattern}"


def make_characters(k: int) -> list[Character]:
    """The first ``k`` characters (1 <= k <= len(NAMES)); character i has shape i, pattern i, colour i
    (mod the lists), so the first len(SHAPES) differ in shape and no two are the same sprite."""
    if not 1 <= k <= len(NAMES):
        raise ValueError(f"--num_characters={k}: must be 1..{len(NAMES)}")
    cols = list(COLOURS)
    return [Character(NAMES[i], SHAPES[i % len(SHAPES)], cols[i % 8], cols[(i + 4 + i // 8) % 8],
                      PATTERNS[i % len(PATTERNS)]) for i in range(k)]


def _shape_distance(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A shape's 'radius' of each point in sprite coordinates: <= 1 inside, (1, 1.15] the outline."""
    rho, phi = np.hypot(u, v), np.arctan2(v, u) + np.pi / 2
    if shape == "circle":
        return rho
    if shape == "square":
        return np.maximum(abs(u), abs(v)) / 0.8
    if shape in ("triangle", "hexagon"):
        n = 3 if shape == "triangle" else 6
        return rho * np.cos(np.mod(phi, 2 * np.pi / n) - np.pi / n) / np.cos(np.pi / n)
    if shape == "star":
        tri = abs(np.mod(phi * 5 / (2 * np.pi), 1.0) - 0.5) * 2  # 1 at a tip, 0 between tips
        return rho / (0.45 + 0.55 * tri)
    if shape == "diamond":
        return abs(u) + abs(v)
    if shape == "ring":
        return np.maximum(rho, 1.5 - rho)
    if shape == "cross":
        return np.minimum(np.maximum(abs(u), abs(v) / 0.35), np.maximum(abs(u) / 0.35, abs(v)))
    raise ValueError(f"unknown shape {shape!r}")


def _pattern(pattern: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """bool: where the second colour shows, in sprite coordinates (turns with the sprite)."""
    if pattern == "stripes":
        return np.sin(u * 3 * np.pi) > 0
    if pattern == "dots":
        return (np.mod(u * 2.5, 1) - 0.5) ** 2 + (np.mod(v * 2.5, 1) - 0.5) ** 2 < 0.08
    if pattern == "checks":
        return (np.floor(u * 2.5) + np.floor(v * 2.5)) % 2 == 0
    if pattern == "halves":
        return u > 0
    raise ValueError(f"unknown pattern {pattern!r}")


def draw_sprite(canvas: np.ndarray, c: Character, cx: float, cy: float, radius: float, angle: float = 0.0) -> None:
    """Draws ``c`` into float32 [H, W, 3] ``canvas`` (in place), centred at (cx, cy) px, ``radius`` px, turned
    by ``angle`` radians."""
    h, w = canvas.shape[:2]
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    ca, sa = np.cos(angle), np.sin(angle)
    u = ((x - cx) * ca + (y - cy) * sa) / radius
    v = (-(x - cx) * sa + (y - cy) * ca) / radius
    d = _shape_distance(c.shape, u, v)
    fill = np.where(_pattern(c.pattern, u, v)[..., None], np.float32(COLOURS[c.colour2]), np.float32(COLOURS[c.colour]))
    canvas[:] = np.where((d <= 1.0)[..., None], fill, np.where((d <= 1.15)[..., None], _OUTLINE, canvas))


def background(name: str, w: int, h: int) -> np.ndarray:
    """float32 [h, w, 3] of a BACKGROUNDS entry."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    if name == "sky":
        t = (y / max(h - 1, 1))[..., None]
        return np.float32((70, 130, 230)) * (1 - t) + np.float32((190, 225, 255)) * t
    if name == "checkered":
        cell = max(h // 6, 1)
        on = ((x // cell + y // cell) % 2 == 0)[..., None]
        return np.where(on, np.float32((150, 110, 70)), np.float32((90, 60, 40)))
    if name == "stripes":
        on = ((x // max(w // 12, 1)) % 2 == 0)[..., None]
        return np.where(on, np.float32((40, 30, 80)), np.float32((70, 50, 120)))
    if name == "desert":
        sand = (y > h * (0.55 + 0.05 * np.sin(x / w * 2 * np.pi)))[..., None]
        return np.where(sand, np.float32((230, 200, 140)), np.float32((250, 170, 90)))
    raise ValueError(f"unknown background {name!r}")


def sprite_pose(motion: str, quick: bool, t: float, duration: float, w: int,
                h: int) -> tuple[float, float, float, float]:
    """(cx, cy, radius, angle) of a sprite ``t`` s into a scene of ``duration`` s doing ``motion``."""
    r, ground, p = RADIUS * h, 0.62 * h, t / duration
    cx, cy, angle = w / 2, ground, 0.0
    if motion in ("walk_left", "walk_right"):
        way = (-1 if motion == "walk_left" else 1) * min((0.18 if quick else 0.08) * duration, 0.6) * w
        cx = w / 2 + way * (p - 0.5)
        cy = ground - 0.04 * h * abs(np.sin(t * np.pi * (4 if quick else 2)))
        angle = 0.15 * np.sin(t * np.pi * (4 if quick else 2))
    elif motion == "jump":
        cy = ground - (0.3 if quick else 0.2) * h * abs(np.sin(t * np.pi / (1.0 if quick else 2.0)))
    elif motion == "spin":
        angle = t * np.pi * (3 if quick else 1)
    elif motion in ("grow", "shrink"):
        span = 0.8 if quick else 0.4
        r *= 1 + span * ((p if motion == "grow" else 1 - p) - 0.5)
    return cx, cy, r, angle


def render_frame(c: Character, bg: np.ndarray, motion: str, quick: bool, t: float, duration: float) -> np.ndarray:
    """uint8 [H, W, 3]: ``c`` doing ``motion`` ``t`` s into a scene on background ``bg`` (float32 [H, W, 3])."""
    h, w = bg.shape[:2]
    canvas = bg.copy()
    cx, cy, r, a = sprite_pose(motion, quick, t, duration, w, h)
    draw_sprite(canvas, c, cx, cy, r, a)
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8)


def reference_image(c: Character, size: tuple[int, int] = TOY_SIZE) -> np.ndarray:
    """uint8 [H, W, 3]: ``c`` centred, upright, at its scene size, on plain grey (``size`` = (W, H))."""
    canvas = np.full((size[1], size[0], 3), _GREY, np.float32)
    draw_sprite(canvas, c, size[0] / 2, size[1] / 2, RADIUS * size[1])
    return canvas.astype(np.uint8)


def plan_world(num_characters: int = 8, num_heldout: int = 2, num_backgrounds: int = 3, films_per_character: int = 2,
               scenes_per_film: int = 4, seed: int = 0) -> tuple[list[Character], list[str], list[dict]]:
    """(characters, held-out names, films): each film is {film_id, split, character, scenes: [{background,
    motion, quick}]}, consecutive scenes on different backgrounds; all drawn from ``seed``.

    Raises:
      ValueError: a count out of range (named as its flag).
    """
    chars = make_characters(num_characters)
    if not 0 <= num_heldout < num_characters:
        raise ValueError(f"--num_heldout={num_heldout}: must be 0..{num_characters - 1} (--num_characters - 1)")
    if not 2 <= num_backgrounds <= len(BACKGROUNDS):
        raise ValueError(f"--num_backgrounds={num_backgrounds}: must be 2..{len(BACKGROUNDS)} (a cut needs a new "
                         f"background)")
    if films_per_character < 1 or scenes_per_film < 1:
        raise ValueError("--films_per_character and --scenes_per_film must be >= 1")
    rng = np.random.default_rng(seed)
    heldout = sorted((chars[i].name for i in rng.choice(num_characters, num_heldout, replace=False)),
                     key=[c.name for c in chars].index)
    bgs, motions = list(BACKGROUNDS)[:num_backgrounds], list(MOTIONS)
    films = []
    for c in chars:
        for k in range(films_per_character):
            b = int(rng.integers(num_backgrounds))
            scene_list = []
            for _ in range(scenes_per_film):
                scene_list.append({"background": bgs[b], "motion": motions[int(rng.integers(len(motions)))],
                                   "quick": bool(rng.integers(2))})
                b = (b + 1 + int(rng.integers(num_backgrounds - 1))) % num_backgrounds
            films.append({"film_id": f"toy_{c.name.lower()}_{k}", "split": "heldout" if c.name in heldout else "train",
                          "character": c.name, "scenes": scene_list})
    return chars, heldout, films


def scene_label(film_id: str, clip_index: int, start: float, character: str, scene: dict) -> label_schema.ClipLabel:
    """The ground-truth label of a clip of ``scene`` (a plan_world scene)."""
    verb, slow, fast = MOTIONS[scene["motion"]]
    sc, et, st = fast if scene["quick"] else slow
    adverb = "calmly" if scene["motion"] == "stand" else ADVERBS[int(scene["quick"])]
    return label_schema.ClipLabel(film_id, clip_index, float(start), (character,), f"{adverb} {verb}",
                                  BACKGROUNDS[scene["background"]], sc, et, st)


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def _check_out_dir(out_dir: str) -> list[str]:
    """Files of an earlier toy world in ``out_dir`` (relative paths); raises FileExistsError when the folder
    holds anything else than a toy world."""
    if not fileio.isdir(out_dir) or not fileio.listdir(out_dir):
        return []
    manifest = paths.join(out_dir, "manifest.json")
    try:
        old = json.loads(fileio.read_bytes(manifest))
        assert old["format"] == FORMAT
    except Exception:
        raise FileExistsError(f"--out_dir={out_dir}: holds files but no toy world manifest.json; pass an empty or "
                              f"new folder (or an earlier toy world's)") from None
    return [str(p) for p in old.get("files", [])]


def make_toy_world(out_dir: str, data_cfg, num_characters: int = 8, num_heldout: int = 2, num_backgrounds: int = 3,
                   films_per_character: int = 2, scenes_per_film: int = 4, scene_seconds: float = 4.0,
                   size: tuple[int, int] = TOY_SIZE, fps: float = TOY_FPS, seed: int = 0) -> dict:
    """Writes the toy world (module docstring) into ``out_dir`` and returns its manifest.

    Args:
      data_cfg: the `data` config section that plans the labelled clips (clips.plan_clips: num_frames, fps,
        clip_seconds, clip_stride_seconds), as data.prepare will be run with.
      size: (width, height), both even; fps: the films' frame rate; scene_seconds: length of every scene.

    Raises:
      ValueError: a count, size or length out of range; FileExistsError: ``out_dir`` holds other files.
    """
    if size[0] % 2 or size[1] % 2 or min(size) < 16:
        raise ValueError(f"--width/--height {size[0]}x{size[1]}: both must be even and >= 16")
    n = int(round(scene_seconds * fps))
    if n < 15 or n < round(float(data_cfg.clip_seconds) * fps):
        raise ValueError(f"--scene_seconds={scene_seconds}: a scene must hold one clip "
                         f"({data_cfg.clip_seconds} s) and 15 frames (PySceneDetect's shortest shot)")
    chars, heldout, films = plan_world(num_characters, num_heldout, num_backgrounds, films_per_character,
                                       scenes_per_film, seed)
    stale = _check_out_dir(out_dir)
    refs = {c.name: f"characters/{c.name}/reference.png" for c in chars}
    files = sorted([*refs.values(), "labels.jsonl"] + [f"{f['split']}/{f['film_id']}.mp4" for f in films])
    manifest = {"format": FORMAT, "complete": False, "seed": seed, "size": list(size), "fps": fps,
                "scene_seconds": scene_seconds, "heldout": heldout,
                "characters": [{**dataclasses.asdict(c), "description": c.description, "reference": refs[c.name],
                                "heldout": c.name in heldout} for c in chars],
                "backgrounds": {b: BACKGROUNDS[b] for b in list(BACKGROUNDS)[:num_backgrounds]},
                "clip_plan": {k: data_cfg.get(k, 0.0) for k in ("num_frames", "fps", "clip_seconds",
                                                                 "clip_stride_seconds")},
                "labels": "labels.jsonl", "films": [], "files": sorted(set(files) | set(stale))}
    fileio.makedirs(out_dir)
    fileio.write_text_atomic(paths.join(out_dir, "manifest.json"), json.dumps(manifest, indent=1) + "\n")
    for c in chars:
        fileio.makedirs(paths.join(out_dir, "characters", c.name))
        fileio.write_bytes_atomic(paths.join(out_dir, refs[c.name]), _png(reference_image(c, size)))
    by_name = {c.name: c for c in chars}
    labels = []
    with tempfile.TemporaryDirectory() as tmp:
        for film in films:
            c, bgs = by_name[film["character"]], {}
            for k, s in enumerate(film["scenes"]):
                s.update(start_frame=k * n, end_frame=(k + 1) * n)

            def frames(film=film, c=c, bgs=bgs):
                for s in film["scenes"]:
                    bg = bgs.setdefault(s["background"], background(s["background"], *size))
                    for i in range(n):
                        yield render_frame(c, bg, s["motion"], s["quick"], i / fps, n / fps)

            local = os.path.join(tmp, "film.mp4")
            video.write_film(local, frames(), fps, x264_params=X264_PARAMS)
            rel = f"{film['split']}/{film['film_id']}.mp4"
            fileio.makedirs(paths.join(out_dir, film["split"]))
            fileio.write_bytes_atomic(paths.join(out_dir, rel), open(local, "rb").read())
            shots = [scenes.Scene(k, s["start_frame"], s["end_frame"]) for k, s in enumerate(film["scenes"])]
            for spec in clips_lib.plan_clips(film["film_id"], shots, fps, int(data_cfg.num_frames),
                                             float(data_cfg.fps), float(data_cfg.clip_seconds),
                                             float(data_cfg.get("clip_stride_seconds", 0.0))):
                labels.append(scene_label(film["film_id"], spec.clip_index, spec.start_time, c.name,
                                          film["scenes"][spec.scene_id]))
            for s in film["scenes"]:
                s["action"] = scene_label("", 0, 0.0, c.name, s).action
            manifest["films"].append({**film, "path": rel, "num_frames": n * len(film["scenes"]),
                                      "cut_frames": [s["start_frame"] for s in film["scenes"][1:]]})
    body = "".join(json.dumps({"type": "film", "film_id": f["film_id"], "characters": [f["character"]]}) + "\n"
                   for f in films) + "".join(json.dumps(lab.to_json()) + "\n" for lab in labels)
    fileio.write_text_atomic(paths.join(out_dir, "labels.jsonl"), body)
    for rel in sorted(set(stale) - set(files)):
        if fileio.exists(paths.join(out_dir, rel)):
            fileio.remove(paths.join(out_dir, rel))
    manifest.update(complete=True, files=files)
    fileio.write_text_atomic(paths.join(out_dir, "manifest.json"), json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(out_dir: str) -> dict:
    """A toy world's manifest.json.

    Raises:
      FileNotFoundError / ValueError: no manifest, another format, or an unfinished world (one line each).
    """
    path = paths.join(out_dir, "manifest.json")
    if not fileio.exists(path):
        raise FileNotFoundError(f"{out_dir}: no toy world (manifest.json); make one with "
                                f"python -m animegamer_jax.commands.data sample --world=toy --out_dir {out_dir}")
    manifest = json.loads(fileio.read_bytes(path))
    if manifest.get("format") != FORMAT or not manifest.get("complete"):
        raise ValueError(f"{path}: not a finished toy world ({FORMAT}); run the --world=toy command again")
    return manifest


def load_reference(out_dir: str, name: str) -> np.ndarray:
    """uint8 [H, W, 3] RGB: the reference image of character ``name`` of the toy world in ``out_dir``."""
    manifest = read_manifest(out_dir)
    rel = {c["name"]: c["reference"] for c in manifest["characters"]}
    if name not in rel:
        raise ValueError(f"{out_dir}: no character {name!r} (characters: {sorted(rel)})")
    return np.asarray(Image.open(io.BytesIO(fileio.read_bytes(paths.join(out_dir, rel[name])))).convert("RGB"))
