"""The toy world: a procedural game of named sprite characters, rendered with numpy (no download), that
knows the truth of every clip (the referee's ground truth, eval/referee.py).

K characters (default 60: 48 seen, 12 held out), drawn from the seed: a name of two syllables, a shape
(SHAPES), a main and a second colour (COLOURS) and a pattern (PATTERNS) with a dark outline; any two
characters differ in at least two of those four features. They act on backgrounds (BACKGROUNDS, default
the first 6) with the 7 motions of MOTIONS, slowly or quickly (13 actions: "calmly stand still" has no
speed), each with its state rule (the SC / ET / ST changes of its label).

The sprite's state (:class:`State`: x position, scale, angle) carries from one scene to the next and
from one game turn to the next: walking moves x at a fixed speed, growing and shrinking change the scale
at a fixed rate, jumping and spinning return to the ground and the start angle every turn
(:func:`advance`). A film shows ONE character in ``scenes_per_film`` scenes separated by hard cuts;
consecutive scenes differ in background (PySceneDetect finds every cut at the generator's frame), and
a scene starts where the one before it ended. A scene's action never leaves the sprite's range
(:func:`feasible`); a game's instruction that would is clamped (a walk stops at the wall).

Splits (all drawn from the seed and written in the manifest):
- held-out characters: ``num_heldout`` characters whose films go to ``heldout/`` (no phase reads it);
- held-out compositions: for every seen character a ``heldout_share`` of the (motion, background) pairs
  that none of its training films shows (``manifest["heldout_compositions"]``);
- game scripts (generate's JSONL, ``num_turns`` turns): ``games/seen.jsonl`` (seen characters, compositions
  their training films show), ``games/heldout_compositions.jsonl`` (seen characters, each turn one of its held-out
  compositions), ``games/heldout_characters.jsonl``, and ``games/long.jsonl`` (one game of ``long_turns``
  turns); ``games/truth.json`` holds each turn's truth (action, background, start and end state, states).

Command (also ``python -m animegamer_jax.commands.data sample --world=toy``):
  python -m animegamer_jax.commands.data sample --world=toy --out_dir data/prepared/toy

Writes into ``--out_dir``:
  train/<film_id>.mp4, heldout/<film_id>.mp4   H.264 films (video.write_film), film_id "toy_<name>_<k>"
  characters/<Name>/reference.png             each character centred on plain grey at the film size (the
                                              layout data.caption --characters reads)
  labels.jsonl                                the generator's ground truth as clip labels (label_schema) of
                                              every film, clips planned as data.prepare plans them
  games/*.jsonl, games/truth.json             the referee's game scripts and their truth (above)
  manifest.json                               characters (+ reference, heldout), backgrounds, held-out
                                              compositions, films with their scenes (frames, background,
                                              motion, action, start state) and cuts
Same arguments and seed: the same bytes (x264 single-threaded with fixed options). A folder that holds
other files than a toy world's is refused; files of an earlier toy world that the new one lacks are
removed.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import math
import os
import tempfile

import numpy as np
from PIL import Image

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import label_schema, scenes, video

FORMAT = "animegamer_jax.toy_world/2"
TOY_SIZE = (192, 128)  # (width, height): 3:2 like the tiny config's 96x64 clips, so nothing is cropped
TOY_FPS = 25.0
#: a name is two of these (capitalised): 1,024 names
SYLLABLES = ("ba", "bo", "da", "di", "fe", "fo", "ga", "ki", "ko", "la", "li", "lu", "ma", "mi", "mo", "na",
             "ni", "no", "pa", "pi", "ra", "ri", "ro", "sa", "si", "ta", "ti", "to", "va", "vi", "za", "zu")
SHAPES = ("circle", "square", "triangle", "star", "diamond", "ring", "cross", "hexagon")
PATTERNS = ("stripes", "dots", "checks", "halves")
COLOURS = {"red": (220, 40, 40), "orange": (240, 140, 30), "yellow": (240, 220, 40), "green": (50, 180, 60),
           "cyan": (40, 200, 210), "blue": (40, 80, 220), "purple": (140, 60, 200), "pink": (240, 110, 180)}
#: background name -> its label text ("<time> <place>", label_schema); a world uses the first N
BACKGROUNDS = {"sky": "day sky", "checkered": "day checkered hall", "stripes": "night striped room",
               "desert": "evening desert", "ocean": "day ocean", "forest": "day forest",
               "snow": "winter snowfield", "night": "night starry sky"}
#: motion -> (verb phrase, (SC, ET, ST) slowly, (SC, ET, ST) quickly): the labels' ground truth
MOTIONS = {"walk_left": ("walk left", (0, 0, -1), (0, 1, -2)), "walk_right": ("walk right", (0, 0, -1), (0, 1, -2)),
           "jump": ("jump", (0, 1, -1), (0, 2, -2)), "spin": ("spin around", (0, 1, 0), (0, 2, -1)),
           "stand": ("stand still", (0, 0, 2), (0, 0, 2)), "grow": ("grow bigger", (1, 1, 0), (1, 2, -1)),
           "shrink": ("shrink", (-1, 0, 0), (-1, 0, -1))}
ADVERBS = ("slowly", "quickly")
#: the 13 (motion, quick) actions: "stand" has one speed ("calmly stand still")
ACTIONS = tuple((m, q) for m in MOTIONS for q in ((False,) if m == "stand" else (False, True)))
SPLITS = ("seen", "heldout_compositions", "heldout_characters", "long")
OUTLINE = (25, 25, 25)  # every sprite's outline colour
_OUTLINE = np.array(OUTLINE, np.float32)
_GREY = (128, 128, 128)
RADIUS = 0.2  # a sprite's radius at scale 1, as a fraction of the frame height
SPRITE_REACH = 1.35  # every shape's outline (distance <= 1.15) lies within this many radii of its centre
FLOOR = 0.82  # the sprite stands with its bottom on this line (fraction of the height)
X_RANGE = (0.18, 0.82)  # the sprite's centre stays within these fractions of the width
SCALE_RANGE = (0.6, 1.4)  # and its scale within these
#: the kinematics, per speed (False = slowly, True = quickly)
WALK_SPEED = {False: 0.075, True: 0.15}  # frame widths per second
BOB = 0.04  # a walk's bob, frame heights (period 1 s slowly, 0.5 s quickly; also a 0.15 rad sway)
JUMP = {False: (1.0, 0.18), True: (0.5, 0.28)}  # (period s, height in frame heights): back on the ground each period
SPIN = {False: math.pi, True: 3 * math.pi}  # rad/s
GROW = {False: math.log(1.15) / 2, True: math.log(1.35) / 2}  # log scale per second (x1.15 / x1.35 in 2 s)
#: libx264 options of the films: with x264's macroblock tree on, the bytes of these small flat-colour films
#: vary from run to run (same frames); without it they repeat
X264_PARAMS = "mbtree=0"
MAX_CHARACTERS = 192  # the greedy draw finds 197-200 for seeds 0-4


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

    @property
    def features(self) -> tuple[str, str, str, str]:
        return (self.shape, self.colour, self.colour2, self.pattern)


@dataclasses.dataclass(frozen=True)
class State:
    """Where a sprite is between two actions: ``x`` its centre (fraction of the width), ``scale`` its
    radius over RADIUS * height, ``angle`` radians in [0, 2 pi)."""

    x: float = 0.5
    scale: float = 1.0
    angle: float = 0.0

    def to_json(self) -> list[float]:
        return [round(self.x, 6), round(self.scale, 6), round(self.angle, 6)]

    @classmethod
    def from_json(cls, v) -> "State":
        return cls(float(v[0]), float(v[1]), float(v[2]))


START = State()  # every film and every game starts here


def make_characters(k: int, seed: int = 0) -> list[Character]:
    """``k`` characters drawn from ``seed``: distinct two-syllable names; (shape, colour, colour2, pattern)
    with colour2 != colour, any two differing in at least two of the four (greedy over a seeded shuffle of
    all 1,792 combinations, so the first k of a larger draw are the draw of k).

    Raises:
      ValueError: ``k`` outside 1..MAX_CHARACTERS.
    """
    if not 1 <= k <= MAX_CHARACTERS:
        raise ValueError(f"--num_characters={k}: must be 1..{MAX_CHARACTERS}")
    rng = np.random.default_rng([seed, 7919])
    names = [a.capitalize() + b for a, b in itertools.product(SYLLABLES, SYLLABLES)]
    names = [names[i] for i in rng.permutation(len(names))]
    combos = [(s, c1, c2, p) for s in SHAPES for c1 in COLOURS for c2 in COLOURS if c2 != c1 for p in PATTERNS]
    chosen: list[tuple[str, str, str, str]] = []
    for i in rng.permutation(len(combos)):
        cand = combos[i]
        if all(sum(a != b for a, b in zip(cand, c)) >= 2 for c in chosen):
            chosen.append(cand)
            if len(chosen) == k:
                break
    if len(chosen) < k:
        raise ValueError(f"--num_characters={k}: seed {seed} draws only {len(chosen)} characters that differ in "
                         f"two features; pass fewer")
    return [Character(n, *f) for n, f in zip(names, chosen)]


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
    reach = SPRITE_REACH * radius + 2  # every shape's outline lies within this box: the rest is left as it is
    y0, y1 = max(int(cy - reach), 0), min(int(cy + reach) + 1, h)
    x0, x1 = max(int(cx - reach), 0), min(int(cx + reach) + 1, w)
    if y0 >= y1 or x0 >= x1:
        return
    y, x = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    ca, sa = np.cos(angle), np.sin(angle)
    u = ((x - cx) * ca + (y - cy) * sa) / radius
    v = (-(x - cx) * sa + (y - cy) * ca) / radius
    d = _shape_distance(c.shape, u, v)
    fill = np.where(_pattern(c.pattern, u, v)[..., None], np.float32(COLOURS[c.colour2]), np.float32(COLOURS[c.colour]))
    box = canvas[y0:y1, x0:x1]
    box[:] = np.where((d <= 1.0)[..., None], fill, np.where((d <= 1.15)[..., None], _OUTLINE, box))


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
    if name == "ocean":  # the sky's hue: told apart by its waves
        band = ((y + 0.02 * h * np.sin(x / w * 4 * np.pi)) // max(h // 10, 1) % 2 == 0)[..., None]
        sea = np.where(band, np.float32((30, 90, 170)), np.float32((50, 120, 200)))
        return np.where((y < 0.35 * h)[..., None], np.float32((150, 200, 240)), sea)
    if name == "forest":
        trunk = ((x % max(w // 6, 1)) < max(w // 24, 1))[..., None]
        upper = np.where(trunk, np.float32((60, 40, 20)), np.float32((100, 200, 80)))
        return np.where((y > 0.75 * h)[..., None], np.float32((40, 120, 40)), upper)
    if name == "snow":
        ground = (y > h * (0.6 + 0.04 * np.sin(x / w * 3 * np.pi)))[..., None]
        return np.where(ground, np.float32((245, 245, 250)), np.float32((195, 210, 230)))
    if name == "night":  # dark blue with a fixed scatter of stars (2 x 2 px)
        cell = (np.floor(x / 2) * 7919 + np.floor(y / 2) * 104729) % 89 == 0
        return np.where(cell[..., None], np.float32((250, 250, 210)), np.float32((20, 25, 90)))
    raise ValueError(f"unknown background {name!r}")


def _x_scale(state: State, motion: str, quick: bool, t: float, clamp: bool = True) -> tuple[float, float]:
    """(x, scale) ``t`` s into ``motion`` from ``state`` (clamped to X_RANGE / SCALE_RANGE unless not ``clamp``)."""
    x, s = state.x, state.scale
    if motion in ("walk_left", "walk_right"):
        x = x + (-1 if motion == "walk_left" else 1) * WALK_SPEED[quick] * t
        x = min(max(x, X_RANGE[0]), X_RANGE[1]) if clamp else x
    elif motion in ("grow", "shrink"):
        s = s * math.exp((1 if motion == "grow" else -1) * GROW[quick] * t)
        s = min(max(s, SCALE_RANGE[0]), SCALE_RANGE[1]) if clamp else s
    return x, s


def sprite_pose(state: State, motion: str, quick: bool, t: float, w: int, h: int,
                clamp: bool = True) -> tuple[float, float, float, float]:
    """(cx, cy, radius, angle) in px / radians of a sprite ``t`` s into ``motion`` from ``state`` in a
    ``w`` x ``h`` frame: its bottom on FLOOR less the walk's bob or the jump's lift (x and scale clamped to
    X_RANGE / SCALE_RANGE unless not ``clamp``)."""
    x, s = _x_scale(state, motion, quick, t, clamp)
    angle, lift = state.angle, 0.0
    if motion in ("walk_left", "walk_right"):
        k = 2 if quick else 1
        lift, angle = BOB * abs(math.sin(2 * math.pi * k * t)), angle + 0.15 * math.sin(2 * math.pi * k * t)
    elif motion == "jump":
        period, height = JUMP[quick]
        lift = height * abs(math.sin(math.pi * t / period))
    elif motion == "spin":
        angle += SPIN[quick] * t
    r = RADIUS * h * s
    return x * w, FLOOR * h - r - lift * h, r, angle


def advance(state: State, motion: str, quick: bool, seconds: float) -> State:
    """The state ``seconds`` s into ``motion`` from ``state`` (a walk stops at X_RANGE's wall, a scale at
    SCALE_RANGE's bound; the angle mod 2 pi)."""
    x, s = _x_scale(state, motion, quick, seconds)
    angle = sprite_pose(state, motion, quick, seconds, 1, 1)[3]
    return State(x, s, float(angle % (2 * math.pi)))


def feasible(state: State, motion: str, quick: bool, seconds: float) -> bool:
    """Whether ``motion`` for ``seconds`` from ``state`` stays within X_RANGE and SCALE_RANGE unclamped."""
    x, s = _x_scale(state, motion, quick, seconds, clamp=False)
    eps = 1e-9
    return X_RANGE[0] - eps <= x <= X_RANGE[1] + eps and SCALE_RANGE[0] - eps <= s <= SCALE_RANGE[1] + eps


def render_frame(c: Character, bg: np.ndarray, state: State, motion: str, quick: bool, t: float) -> np.ndarray:
    """uint8 [H, W, 3]: ``c`` ``t`` s into ``motion`` from ``state`` on background ``bg`` (float32 [H, W, 3])."""
    h, w = bg.shape[:2]
    canvas = bg.copy()
    cx, cy, r, a = sprite_pose(state, motion, quick, t, w, h)
    draw_sprite(canvas, c, cx, cy, r, a)
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8)


def turn_times(seconds: float, num_frames: int, fps: float, src_fps: float = TOY_FPS) -> np.ndarray:
    """float32 [num_frames]: the times (s) of a ``seconds``-long turn's frames as data.prepare samples a clip
    of a ``src_fps`` film (clips.plan_clips: i / fps, clamped to the segment's last source frame)."""
    n = int(round(seconds * src_fps))
    spec = clips_lib.plan_clips("turn", [scenes.Scene(0, 0, n)], src_fps, int(num_frames), float(fps), float(seconds))[0]
    return spec.frame_times


def render_turn(c: Character, state: State, motion: str, quick: bool, background_name: str, times,
                size: tuple[int, int] = TOY_SIZE) -> np.ndarray:
    """uint8 [T, H, W, 3] at ``size`` (W, H): the engine's render of one instruction from ``state``, at
    ``times`` (s; :func:`turn_times`)."""
    bg = background(background_name, *size)
    return np.stack([render_frame(c, bg, state, motion, quick, float(t)) for t in times])


def reference_image(c: Character, size: tuple[int, int] = TOY_SIZE) -> np.ndarray:
    """uint8 [H, W, 3]: ``c`` centred, upright, at its scene size, on plain grey (``size`` = (W, H))."""
    canvas = np.full((size[1], size[0], 3), _GREY, np.float32)
    draw_sprite(canvas, c, size[0] / 2, size[1] / 2, RADIUS * size[1])
    return canvas.astype(np.uint8)


def action_text(motion: str, quick: bool) -> str:
    """The label's action: "<adverb> <verb phrase>" ("calmly stand still" for stand)."""
    adverb = "calmly" if motion == "stand" else ADVERBS[int(quick)]
    return f"{adverb} {MOTIONS[motion][0]}"


def state_changes(motion: str, quick: bool) -> tuple[int, int, int]:
    """(SC, ET, ST): the state rule of an action (MOTIONS)."""
    return tuple(MOTIONS[motion][2 if quick else 1])


def instruction(name: str, motion: str, quick: bool, background_name: str) -> str:
    """A turn's instruction in the release's format (label_schema.ClipLabel.instruction)."""
    return f"Character: {name}; Motion: {action_text(motion, quick)}; Background: {BACKGROUNDS[background_name]}."


def _pick(rng: np.random.Generator, options: list):
    return options[int(rng.integers(len(options)))]


def plan_world(num_characters: int = 60, num_heldout: int = 12, num_backgrounds: int = 6, films_per_character: int = 2,
               scenes_per_film: int = 8, scene_seconds: float = 2.0, heldout_share: float = 0.2,
               seed: int = 0) -> tuple[list[Character], list[str], dict[str, list[list[str]]], list[dict]]:
    """(characters, held-out names, held-out compositions, films), all drawn from ``seed``.

    Held-out compositions: for each seen character ``round(heldout_share * 7 * num_backgrounds)`` [motion,
    background] pairs its films never show. Each film is {film_id, split, character, scenes: [{background,
    motion, quick, start}]}: consecutive scenes on different backgrounds, each scene starting at the state
    the one before it ended in (``start``: State.to_json) and feasible for ``scene_seconds`` (uniform over
    the feasible (background, action) pairs).

    Raises:
      ValueError: a count out of range (named as its flag).
    """
    chars = make_characters(num_characters, seed)
    if not 0 <= num_heldout < num_characters:
        raise ValueError(f"--num_heldout={num_heldout}: must be 0..{num_characters - 1} (--num_characters - 1)")
    if not 2 <= num_backgrounds <= len(BACKGROUNDS):
        raise ValueError(f"--num_backgrounds={num_backgrounds}: must be 2..{len(BACKGROUNDS)} (a cut needs a new "
                         f"background)")
    if films_per_character < 1 or scenes_per_film < 1:
        raise ValueError("--films_per_character and --scenes_per_film must be >= 1")
    if not 0.0 <= heldout_share < 1.0:
        raise ValueError(f"--heldout_share={heldout_share}: must be in [0, 1)")
    rng = np.random.default_rng(seed)
    heldout = sorted((chars[i].name for i in rng.choice(num_characters, num_heldout, replace=False)),
                     key=[c.name for c in chars].index)
    bgs = list(BACKGROUNDS)[:num_backgrounds]
    pairs = [[m, b] for m in MOTIONS for b in bgs]
    n_hold = int(round(heldout_share * len(pairs)))
    held_pairs = {c.name: sorted(pairs[int(i)] for i in rng.choice(len(pairs), n_hold, replace=False))
                  for c in chars if c.name not in heldout}
    films = []
    for c in chars:
        banned = {tuple(p) for p in held_pairs.get(c.name, ())}
        for k in range(films_per_character):
            state, prev, scene_list = START, None, []
            for _ in range(scenes_per_film):
                options = [(b, m, q) for b in bgs if b != prev for m, q in ACTIONS
                           if (m, b) not in banned and feasible(state, m, q, scene_seconds)]
                b, m, q = _pick(rng, options)
                scene_list.append({"background": b, "motion": m, "quick": q, "start": state.to_json()})
                state, prev = advance(state, m, q, scene_seconds), b
            films.append({"film_id": f"toy_{c.name.lower()}_{k}", "split": "heldout" if c.name in heldout else "train",
                          "character": c.name, "scenes": scene_list})
    return chars, heldout, held_pairs, films


def shown_compositions(films: list[dict]) -> dict[str, set[tuple[str, str]]]:
    """{character: {(motion, background)}} that the character's training films show (plan_world's films)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for f in films:
        if f["split"] == "train":
            out.setdefault(f["character"], set()).update((s["motion"], s["background"]) for s in f["scenes"])
    return out


def plan_games(chars: list[Character], heldout: list[str], held_pairs: dict, bgs: list[str], seconds: float,
               num_games: int = 32, num_turns: int = 6, long_turns: int = 100, seed: int = 0,
               shown: dict | None = None) -> dict[str, list[dict]]:
    """The referee's games per split (SPLITS; module docstring): {split: [{game_id, seed, character, turns:
    [{instruction, motion, quick, background, action, states, composition, start, end}]}]}.

    Each game starts at START and each turn's state is the one the turn before it ended in; a turn is drawn
    uniformly from the (background, action) pairs of its split that are feasible for ``seconds``: seen and
    long, the (motion, background) pairs the character's training films show (``shown``:
    :func:`shown_compositions`; without it, every pair not held out); held-out compositions, the
    character's held-out pairs; held-out characters, any. A turn with none feasible takes any pair not held
    out. ``composition`` says which each turn is: "shown", "unshown", "heldout" or "new_character".
    """
    seen = [c for c in chars if c.name not in heldout]
    held = [c for c in chars if c.name in heldout]
    out: dict[str, list[dict]] = {}
    for si, split in enumerate(SPLITS):
        rng = np.random.default_rng([seed, 31, si])
        pool = held if split == "heldout_characters" else seen
        n_games, n_turns = (1, long_turns) if split == "long" else (num_games, num_turns)
        if not pool or n_games < 1 or n_turns < 1:
            out[split] = []
            continue
        order = [pool[int(i)] for i in rng.permutation(len(pool))]
        games = []
        for g in range(n_games):
            c = order[g % len(order)]
            banned = {tuple(p) for p in held_pairs.get(c.name, ())}
            allowed = None if shown is None else shown.get(c.name, set())
            state, turns = START, []
            for _ in range(n_turns):
                every = [(b, m, q) for b in bgs for m, q in ACTIONS if feasible(state, m, q, seconds)]
                free = [o for o in every if (o[1], o[0]) not in banned]
                if split == "heldout_compositions":
                    options = [o for o in every if (o[1], o[0]) in banned] or free
                elif split == "heldout_characters" or allowed is None:
                    options = free
                else:
                    options = [o for o in free if (o[1], o[0]) in allowed] or free
                b, m, q = _pick(rng, options)
                end = advance(state, m, q, seconds)
                kind = ("new_character" if c.name in heldout else "heldout" if (m, b) in banned
                        else "shown" if allowed is not None and (m, b) in allowed else "unshown")
                turns.append({"instruction": instruction(c.name, m, q, b), "motion": m, "quick": q, "background": b,
                              "action": action_text(m, q), "states": list(state_changes(m, q)),
                              "composition": kind, "start": state.to_json(), "end": end.to_json()})
                state = end
            games.append({"game_id": f"{split.replace('_', '-')}-{g:02d}-{c.name.lower()}",
                          "seed": seed * 1_000_003 + si * 10_007 + g, "character": c.name, "turns": turns})
        out[split] = games
    return out


def scene_label(film_id: str, clip_index: int, start: float, character: str, scene: dict) -> label_schema.ClipLabel:
    """The ground-truth label of a clip of ``scene`` (a plan_world scene)."""
    sc, et, st = state_changes(scene["motion"], scene["quick"])
    return label_schema.ClipLabel(film_id, clip_index, float(start), (character,),
                                  action_text(scene["motion"], scene["quick"]), BACKGROUNDS[scene["background"]],
                                  sc, et, st)


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
        assert str(old["format"]).startswith("animegamer_jax.toy_world/")
    except Exception:
        raise FileExistsError(f"--out_dir={out_dir}: holds files but no toy world manifest.json; pass an empty or "
                              f"new folder (or an earlier toy world's)") from None
    return [str(p) for p in old.get("files", [])]


def make_toy_world(out_dir: str, data_cfg, num_characters: int = 60, num_heldout: int = 12, num_backgrounds: int = 6,
                   films_per_character: int = 2, scenes_per_film: int = 8, scene_seconds: float = 2.0,
                   size: tuple[int, int] = TOY_SIZE, fps: float = TOY_FPS, seed: int = 0, heldout_share: float = 0.2,
                   num_games: int = 32, num_turns: int = 6, long_turns: int = 100) -> dict:
    """Writes the toy world (module docstring) into ``out_dir`` and returns its manifest.

    Args:
      data_cfg: the `data` config section that plans the labelled clips (clips.plan_clips: num_frames, fps,
        clip_seconds, clip_stride_seconds), as data.prepare will be run with; a game turn lasts clip_seconds.
      size: (width, height), both even; fps: the films' frame rate; scene_seconds: length of every scene.
      heldout_share: share of (motion, background) pairs held out per seen character; num_games, num_turns:
        games per split and turns per game of the game scripts; long_turns: turns of the long game.

    Raises:
      ValueError: a count, size or length out of range; FileExistsError: ``out_dir`` holds other files.
    """
    if size[0] % 2 or size[1] % 2 or min(size) < 16:
        raise ValueError(f"--width/--height {size[0]}x{size[1]}: both must be even and >= 16")
    n = int(round(scene_seconds * fps))
    if n < 15 or n < round(float(data_cfg.clip_seconds) * fps):
        raise ValueError(f"--scene_seconds={scene_seconds}: a scene must hold one clip "
                         f"({data_cfg.clip_seconds} s) and 15 frames (PySceneDetect's shortest shot)")
    chars, heldout, held_pairs, films = plan_world(num_characters, num_heldout, num_backgrounds, films_per_character,
                                                   scenes_per_film, n / fps, heldout_share, seed)
    bgs = list(BACKGROUNDS)[:num_backgrounds]
    seconds = float(data_cfg.clip_seconds)
    games = plan_games(chars, heldout, held_pairs, bgs, seconds, num_games, num_turns, long_turns, seed,
                       shown_compositions(films))
    stale = _check_out_dir(out_dir)
    refs = {c.name: f"characters/{c.name}/reference.png" for c in chars}
    game_files = [f"games/{s}.jsonl" for s in SPLITS if games[s]] + ["games/truth.json"]
    files = sorted([*refs.values(), "labels.jsonl", *game_files] + [f"{f['split']}/{f['film_id']}.mp4" for f in films])
    manifest = {"format": FORMAT, "complete": False, "seed": seed, "size": list(size), "fps": fps,
                "scene_seconds": scene_seconds, "heldout": heldout,
                "characters": [{**dataclasses.asdict(c), "description": c.description, "reference": refs[c.name],
                                "heldout": c.name in heldout} for c in chars],
                "backgrounds": {b: BACKGROUNDS[b] for b in bgs}, "heldout_compositions": held_pairs,
                "clip_plan": {k: data_cfg.get(k, 0.0) for k in ("num_frames", "fps", "clip_seconds",
                                                                 "clip_stride_seconds")},
                "games": {s: f"games/{s}.jsonl" for s in SPLITS if games[s]}, "truth": "games/truth.json",
                "labels": "labels.jsonl", "films": [], "files": sorted(set(files) | set(stale))}
    fileio.makedirs(out_dir)
    fileio.write_text_atomic(paths.join(out_dir, "manifest.json"), json.dumps(manifest, indent=1) + "\n")
    for c in chars:
        fileio.makedirs(paths.join(out_dir, "characters", c.name))
        fileio.write_bytes_atomic(paths.join(out_dir, refs[c.name]), _png(reference_image(c, size)))
    fileio.makedirs(paths.join(out_dir, "games"))
    for s in SPLITS:
        if games[s]:
            fileio.write_text_atomic(paths.join(out_dir, f"games/{s}.jsonl"), "".join(
                json.dumps({"game_id": g["game_id"], "seed": g["seed"], "turns": [t["instruction"] for t in g["turns"]]})
                + "\n" for g in games[s]))
    truth = {"format": FORMAT, "seconds": seconds, "clip_plan": manifest["clip_plan"], "size": list(size), "fps": fps,
             "splits": games}
    fileio.write_text_atomic(paths.join(out_dir, "games/truth.json"), json.dumps(truth, indent=1) + "\n")
    by_name = {c.name: c for c in chars}
    labels = []
    with tempfile.TemporaryDirectory() as tmp:
        for film in films:
            c, bgs_px = by_name[film["character"]], {}
            for k, s in enumerate(film["scenes"]):
                s.update(start_frame=k * n, end_frame=(k + 1) * n)

            def frames(film=film, c=c, bgs_px=bgs_px):
                for s in film["scenes"]:
                    bg = bgs_px.setdefault(s["background"], background(s["background"], *size))
                    start = State.from_json(s["start"])
                    for i in range(n):
                        yield render_frame(c, bg, start, s["motion"], s["quick"], i / fps)

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
                s["action"] = action_text(s["motion"], s["quick"])
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


def character_of(manifest: dict, name: str) -> Character:
    """The :class:`Character` ``name`` of a manifest (ValueError naming the characters when absent)."""
    for c in manifest["characters"]:
        if c["name"] == name:
            return Character(c["name"], c["shape"], c["colour"], c["colour2"], c["pattern"])
    raise ValueError(f"no character {name!r} in the toy world (characters: {[c['name'] for c in manifest['characters']]})")


def read_truth(out_dir: str) -> dict:
    """A toy world's games/truth.json (:func:`plan_games`' splits, ``seconds``, ``clip_plan``, ``size``).

    Raises:
      FileNotFoundError / ValueError: no finished toy world, or one made before game scripts (one line).
    """
    manifest = read_manifest(out_dir)
    if "truth" not in manifest:
        raise ValueError(f"{out_dir}: a toy world without game scripts ({manifest['format']}); make it again with "
                         f"python -m animegamer_jax.commands.data sample --world=toy --out_dir {out_dir}")
    return json.loads(fileio.read_bytes(paths.join(out_dir, manifest["truth"])))


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
