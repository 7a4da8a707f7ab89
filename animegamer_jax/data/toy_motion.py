"""How a toy world's sprite moves (data/toy_world.py): the 7 motions of MOTIONS, slowly or quickly (13 actions:
"calmly stand still" has no speed), each with its state rule (the SC / ET / ST changes of its label).

The sprite's state (:class:`State`: x position, scale, angle) carries from one scene to the next and from one
game turn to the next: walking moves x at a fixed speed, growing and shrinking change the scale at a fixed
rate, jumping and spinning return to the ground and the start angle every turn (:func:`advance`). An action
that would leave the sprite's range is not :func:`feasible`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import scenes, toy_sprites

TOY_FPS = 25.0
#: motion -> (verb phrase, (SC, ET, ST) slowly, (SC, ET, ST) quickly): the labels' ground truth
MOTIONS = {"walk_left": ("walk left", (0, 0, -1), (0, 1, -2)), "walk_right": ("walk right", (0, 0, -1), (0, 1, -2)),
           "jump": ("jump", (0, 1, -1), (0, 2, -2)), "spin": ("spin around", (0, 1, 0), (0, 2, -1)),
           "stand": ("stand still", (0, 0, 2), (0, 0, 2)), "grow": ("grow bigger", (1, 1, 0), (1, 2, -1)),
           "shrink": ("shrink", (-1, 0, 0), (-1, 0, -1))}
ADVERBS = ("slowly", "quickly")
#: the 13 (motion, quick) actions: "stand" has one speed ("calmly stand still")
ACTIONS = tuple((m, q) for m in MOTIONS for q in ((False,) if m == "stand" else (False, True)))
FLOOR = 0.82  # the sprite stands with its bottom on this line (fraction of the height)
X_RANGE = (0.18, 0.82)  # the sprite's centre stays within these fractions of the width
SCALE_RANGE = (0.6, 1.4)  # and its scale within these
#: the kinematics, per speed (False = slowly, True = quickly)
WALK_SPEED = {False: 0.075, True: 0.15}  # frame widths per second
BOB = 0.04  # a walk's bob, frame heights (period 1 s slowly, 0.5 s quickly; also a 0.15 rad sway)
JUMP = {False: (1.0, 0.18), True: (0.5, 0.28)}  # (period s, height in frame heights): back on the ground each period
SPIN = {False: math.pi, True: 3 * math.pi}  # rad/s
GROW = {False: math.log(1.15) / 2, True: math.log(1.35) / 2}  # log scale per second (x1.15 / x1.35 in 2 s)


@dataclasses.dataclass(frozen=True)
class State:
    """Where a sprite is between two actions: ``x`` its centre (fraction of the width), ``scale`` its
    radius over RADIUS * height (toy_sprites), ``angle`` radians in [0, 2 pi)."""

    x: float = 0.5
    scale: float = 1.0
    angle: float = 0.0

    def to_json(self) -> list[float]:
        return [round(self.x, 6), round(self.scale, 6), round(self.angle, 6)]

    @classmethod
    def from_json(cls, v) -> "State":
        return cls(float(v[0]), float(v[1]), float(v[2]))


START = State()  # every film and every game starts here


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
    r = toy_sprites.RADIUS * h * s
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


def render_frame(c: toy_sprites.Character, bg: np.ndarray, state: State, motion: str, quick: bool,
                 t: float) -> np.ndarray:
    """uint8 [H, W, 3]: ``c`` ``t`` s into ``motion`` from ``state`` on background ``bg`` (float32 [H, W, 3])."""
    h, w = bg.shape[:2]
    canvas = bg.copy()
    cx, cy, r, a = sprite_pose(state, motion, quick, t, w, h)
    toy_sprites.draw_sprite(canvas, c, cx, cy, r, a)
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8)


def turn_times(seconds: float, num_frames: int, fps: float, src_fps: float = TOY_FPS) -> np.ndarray:
    """float32 [num_frames]: the times (s) of a ``seconds``-long turn's frames as data.prepare samples a clip
    of a ``src_fps`` film (clips.plan_clips: i / fps, clamped to the segment's last source frame)."""
    n = int(round(seconds * src_fps))
    spec = clips_lib.plan_clips("turn", [scenes.Scene(0, 0, n)], src_fps, int(num_frames), float(fps), float(seconds))[0]
    return spec.frame_times


def render_turn(c: toy_sprites.Character, state: State, motion: str, quick: bool, background_name: str, times,
                size: tuple[int, int] = toy_sprites.TOY_SIZE) -> np.ndarray:
    """uint8 [T, H, W, 3] at ``size`` (W, H): the engine's render of one instruction from ``state``, at
    ``times`` (s; :func:`turn_times`)."""
    bg = toy_sprites.background(background_name, *size)
    return np.stack([render_frame(c, bg, state, motion, quick, float(t)) for t in times])


def action_text(motion: str, quick: bool) -> str:
    """The label's action: "<adverb> <verb phrase>" ("calmly stand still" for stand)."""
    adverb = "calmly" if motion == "stand" else ADVERBS[int(quick)]
    return f"{adverb} {MOTIONS[motion][0]}"


def state_changes(motion: str, quick: bool) -> tuple[int, int, int]:
    """(SC, ET, ST): the state rule of an action (MOTIONS)."""
    return tuple(MOTIONS[motion][2 if quick else 1])


def instruction(name: str, motion: str, quick: bool, background_name: str) -> str:
    """A turn's instruction in the release's format (label_schema.ClipLabel.instruction)."""
    background = toy_sprites.BACKGROUNDS[background_name]
    return f"Character: {name}; Motion: {action_text(motion, quick)}; Background: {background}."
