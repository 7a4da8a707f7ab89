"""The toy world's look (data/toy_world.py): its characters, sprites drawn with numpy, and its backgrounds.

K characters drawn from the seed: a name of two syllables, a shape (SHAPES), a main and a second colour
(COLOURS) and a pattern (PATTERNS) with a dark outline; any two characters differ in at least two of those
four features. A world uses the first N backgrounds of BACKGROUNDS.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

TOY_SIZE = (192, 128)  # (width, height): 3:2 like the tiny config's 96x64 clips, so nothing is cropped
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
OUTLINE = (25, 25, 25)  # every sprite's outline colour
_OUTLINE = np.array(OUTLINE, np.float32)
_GREY = (128, 128, 128)
RADIUS = 0.2  # a sprite's radius at scale 1, as a fraction of the frame height
SPRITE_REACH = 1.35  # every shape's outline (distance <= 1.15) lies within this many radii of its centre
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


def reference_image(c: Character, size: tuple[int, int] = TOY_SIZE) -> np.ndarray:
    """uint8 [H, W, 3]: ``c`` centred, upright, at its scene size, on plain grey (``size`` = (W, H))."""
    canvas = np.full((size[1], size[0], 3), _GREY, np.float32)
    draw_sprite(canvas, c, size[0] / 2, size[1] / 2, RADIUS * size[1])
    return canvas.astype(np.uint8)

