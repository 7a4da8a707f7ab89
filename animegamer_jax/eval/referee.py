"""The referee: scores every turn of a game on the toy world against the world's own truth.

Command (``eval game``: eval/referee_games.py plays the games; this module only scores)::

  python -m animegamer_jax.commands.eval game --system DIR --world DIR --out DIR
  python -m animegamer_jax.commands.eval game --ground_truth|--standin|--retrieval --world DIR --out DIR

A turn's clip (uint8 [T, h, w, 3], read back from its turn video with the HUD cut off) is read the way
the world draws it (data/toy_world.py): the world knows its background plates, its characters and their
kinematics, so each column is a nearest-truth decision, not a learned feature:

- **background**: the plate (resized to the clip like data.prepare resizes films; as drawn or blurred by
  PLATE_BLURS) with the lowest median per-pixel error;
- **sprite**: per frame, the largest connected region of pixels that differ from that plate (as drawn
  and blurred, after the frame's median colour offset) by more than MASK_LEVELS in a channel, holes
  filled, none over MAX_AREA of the frame: its area, centroid and a canonical crop (centred on the
  centroid, sized by sqrt(area), GRID x GRID cells, off-sprite pixels grey). Only the largest region
  counts: a second, smaller sprite is ignored, a larger one taken instead;
- **character**: the nearest of the K characters' canonical crops (each rendered at ANGLES angles like a
  clip is made, sharp and blurred by TEMPLATE_BLURS), summed over CHARACTER_FRAMES frames;
- **motion / action**: the trajectory (centroid x, centroid y, log sqrt(area)) fitted by each of the 10
  moving actions (walk left / right, jump, grow, shrink, each slowly or quickly) and "still" with free
  offsets ("none" when the best fit's error passes MAX_FIT: a sprite that jumps about); a still sprite is
  then spun: the crops of the character read (not the one named) at angle theta0 + omega t for omega of
  a slow spin, a quick spin and none (stand), "none" past MAX_SPIN_FIT; the lowest error wins.
  ``action`` = motion and speed (13 actions: standing has no speed);
- **meters**: the turn's predicted (SC, ET, ST) against the action's rule (exact share, MAE);
- **continuity**: the sprite's x and size at turn k+1's first frame against turn k's last frame
  (|dx| <= 0.04 of the width, |d log size| <= 0.12), both turns showing the named character: the
  system's self-consistency (a sprite that never moves continues);
- **position**: the named character's x and size at the clip's first and last frames against where the
  engine has it from the turn's start state (the same tolerances): the state carried from the truth;
- **pixels**: PSNR (from the split's mean squared error) and SSIM against the engine's own render of the
  turn's instruction from the turn's start state (data/toy_motion.render_turn).

  ref = Referee(manifest, height=64, width=96)
  turn = ref.score_turn(clip, truth_turn, "Kiki", times, states=(0, 1, -1))  # {"motion": "jump", ...}
  report = summarize({"seen": [[turn, ...], ...]}, manifest)                  # the report's fixed keys

Report keys (report.json, read by other tools): ``splits.<seen|heldout_compositions|heldout_characters|
long>.<motion|action|background|character|meters_exact|meters_mae|continuity|position|psnr|ssim|
num_turns>``, ``chance.<column>`` and ``by_turn.<column>`` (the long game per 5-turn bucket,
``by_turn.turns`` their labels; empty without the long split).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence

import cv2
import numpy as np
from scipy import ndimage

from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import toy_motion, toy_sprites, toy_world, video
from animegamer_jax.io import media

MASK_LEVELS = 40  # a sprite pixel differs from the plate by more than this in some channel (0..255)
GRID = 24  # canonical crop side (cells)
EXTENT = 1.2  # the canonical crop spans +- EXTENT * sqrt(area) px around the centroid
ANGLES = 48  # template angles (7.5 degrees apart)
CHARACTER_FRAMES = 6  # frames of a clip compared with the templates for the character
MIN_PIXELS = 6  # fewer sprite pixels: no sprite in that frame
PLATE_BLURS = (1.0, 2.0)  # Gaussian sigmas (px) of the blurred plates a pixel must also differ from
TEMPLATE_BLURS = (1.5,)  # Gaussian sigmas (px) of the blurred character templates beside the sharp ones
MAX_CHARACTER_FIT = 0.01  # the nearest character's mean squared crop distance per value above this: nobody
MAX_FIT = 4.0  # a trajectory fit's error (sum over x, y, log size of mean squared residual / SIGMA^2) above this: "none"
MAX_SPIN_FIT = 0.015  # the spin / stand fit's mean squared crop distance per value above this: "none"
MAX_AREA = 0.4  # a region over this share of the frame is no sprite (the largest toy sprite covers about 0.2)
CONTINUITY = (0.04, 0.12)  # |dx| (widths) and |d log size| within which two frames continue
#: the trajectory fit's noise scales: x (widths), y (heights), log size
SIGMA = (0.02, 0.02, 0.04)
COLUMNS = ("motion", "action", "background", "character", "meters_exact", "meters_mae", "continuity", "position", "psnr",
           "ssim")
_GREY = 128.0


def _resize(frame: np.ndarray, h: int, w: int) -> np.ndarray:
    return clips_lib.resize_center_crop(frame, h, w)


def ssim(x: np.ndarray, y: np.ndarray) -> float:
    """Mean SSIM (Wang et al. 2004: 11 x 11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03, data range 255) of
    two uint8 [..., H, W, 3] arrays, per channel, averaged."""
    a = np.asarray(x, np.float32).reshape((-1,) + np.shape(x)[-3:])
    b = np.asarray(y, np.float32).reshape(a.shape)

    def f(v):  # the 11 x 11 Gaussian window (sigma 1.5) per frame and channel, edges reflected
        out = np.empty_like(v)
        for fr, o in zip(v, out):
            cv2.GaussianBlur(fr, (11, 11), 1.5, dst=o, borderType=cv2.BORDER_REFLECT)
        return out

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    ma, mb = f(a), f(b)
    va, vb, cov = f(a * a) - ma * ma, f(b * b) - mb * mb, f(a * b) - ma * mb
    return float(np.mean(((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))))


def psnr(x: np.ndarray, y: np.ndarray) -> float:
    """PSNR in dB of two uint8 arrays (peak 255; 100 dB for equal arrays)."""
    mse = float(np.mean((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2))
    return 100.0 if mse == 0 else float(10.0 * np.log10(255.0 ** 2 / mse))


def _channel_max(a: np.ndarray) -> np.ndarray:
    """``a.max(axis=-1)`` of a [..., 3] array, as two elementwise maxima (numpy's reduce over a last axis of 3
    is several times slower; the values are the same)."""
    return np.maximum(np.maximum(a[..., 0], a[..., 1]), a[..., 2])


def sprite_masks(frames: np.ndarray, plates: np.ndarray, max_area: float = MAX_AREA) -> np.ndarray:
    """bool [T, h, w]: per frame the largest 8-connected region of pixels that differ by more than MASK_LEVELS
    in a channel from every one of ``plates`` (float32 [V, h, w, 3]: the background as drawn and blurred,
    :func:`plate_variants`) once the frame's median colour offset from the first is taken off (a clip
    decoded a little brighter or softer still shows its background as background); closed by a 3 x 3
    square, its holes filled (the dark outline encloses sprite pixels of the plate's colour; a ring's hole
    too); empty below MIN_PIXELS or above ``max_area`` of the frame (noise, another scene: no sprite)."""
    f = frames.astype(np.float32)
    offset = np.median((f - plates[0][None]).reshape(len(f), -1, 3), axis=1)  # [T, 3]
    f = f - offset[:, None, None, :]
    diff = np.min([_channel_max(np.abs(f - p[None])) for p in plates], axis=0) > MASK_LEVELS
    out = np.zeros_like(diff)
    kernel = np.ones((3, 3), np.uint8)
    for t, d in enumerate(diff):
        closed = cv2.morphologyEx(d.astype(np.uint8), cv2.MORPH_CLOSE, kernel)  # seals a blurred outline's gaps
        n, lab, stats, _ = cv2.connectedComponentsWithStats(closed, connectivity=8)
        if n > 1:
            k = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
            if MIN_PIXELS <= stats[k, cv2.CC_STAT_AREA] <= max_area * d.size:
                out[t] = ndimage.binary_fill_holes(lab == k)  # inside the outline: plate-coloured sprite pixels too
    return out


def plate_variants(plate: np.ndarray) -> np.ndarray:
    """float32 [1 + len(PLATE_BLURS), h, w, 3]: a plate as drawn and Gaussian-blurred by each PLATE_BLURS sigma
    (px), so the edges of a background's own structure (stripes, trunks, waves) in a soft clip stay
    background."""
    plate = np.asarray(plate, np.float32)
    return np.stack([plate] + [cv2.GaussianBlur(plate, (0, 0), s, borderType=cv2.BORDER_REFLECT) for s in PLATE_BLURS])


def canonical(frame: np.ndarray, mask: np.ndarray) -> np.ndarray | None:
    """float32 [GRID * GRID * 3]: the sprite of ``mask`` in ``frame`` (uint8 [h, w, 3]) on grey, centred on its
    centroid, +- EXTENT * sqrt(area) px across GRID cells (bilinear), values / 255 - 0.5; None without a
    sprite."""
    ys, xs = np.nonzero(mask)
    if len(ys) < MIN_PIXELS:
        return None
    cy, cx, size = ys.mean(), xs.mean(), math.sqrt(len(ys))
    step = 2 * EXTENT * size / GRID
    img = np.where(mask[..., None], frame.astype(np.float32), np.float32(_GREY))
    # dst (j, i) -> src (cx + (j - (G - 1) / 2) * step, cy + (i - (G - 1) / 2) * step)
    m = np.float32([[step, 0, cx - (GRID - 1) / 2 * step], [0, step, cy - (GRID - 1) / 2 * step]])
    crop = cv2.warpAffine(img, m, (GRID, GRID), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=(_GREY, _GREY, _GREY))
    return (crop / 255.0 - 0.5).reshape(-1)


class Referee:
    """Scores turns of one toy world at one clip size (module docstring).

    Args:
      manifest: the world's manifest.json (toy_world.read_manifest).
      height, width: the clips' size (the system's data.height / data.width).
    """

    def __init__(self, manifest: dict, height: int, width: int):
        self.manifest, self.h, self.w = manifest, int(height), int(width)
        self.size = tuple(manifest["size"])  # the world's (W, H)
        self.names = [c["name"] for c in manifest["characters"]]
        self.chars = [toy_world.character_of(manifest, n) for n in self.names]
        self.backgrounds = list(manifest["backgrounds"])
        self.plates = np.stack([plate_variants(_resize(np.clip(np.rint(toy_sprites.background(b, *self.size)), 0, 255)
                                                       .astype(np.uint8), self.h, self.w)) for b in self.backgrounds])
        self.bank, self.unit_area = self._templates()
        self.bank_sq = (self.bank ** 2).sum(-1)  # [K, V, A]

    def _templates(self) -> tuple[np.ndarray, np.ndarray]:
        """(float32 [K, V, ANGLES, D] canonical crops, float [K] sprite area in px at scale 1): each character
        drawn at scale 1 on grey at the world's size, resized like a clip, and as is or Gaussian-blurred by
        each TEMPLATE_BLURS sigma (V = 1 + len(TEMPLATE_BLURS): a soft clip's sprite still finds itself)."""
        wt, ht = self.size
        f = max(self.h / ht, self.w / wt)
        r = toy_sprites.RADIUS * ht
        side = 2 * int(math.ceil(1.5 * r)) + 2
        out_side = max(8, int(round(side * f)))
        plate = np.full((1, out_side, out_side, 3), _GREY, np.float32)
        bank = np.zeros((len(self.chars), 1 + len(TEMPLATE_BLURS), ANGLES, GRID * GRID * 3), np.float32)
        area = np.zeros(len(self.chars))
        for k, c in enumerate(self.chars):
            for a in range(ANGLES):
                canvas = np.full((side, side, 3), _GREY, np.float32)
                toy_sprites.draw_sprite(canvas, c, side / 2, side / 2, r, 2 * math.pi * a / ANGLES)
                small = cv2.resize(np.clip(np.rint(canvas), 0, 255).astype(np.uint8), (out_side, out_side),
                                   interpolation=cv2.INTER_AREA)
                for v, sigma in enumerate((0.0, *TEMPLATE_BLURS)):
                    img = small if not sigma else cv2.GaussianBlur(small, (0, 0), sigma, borderType=cv2.BORDER_REPLICATE)
                    mask = sprite_masks(img[None], plate, max_area=1.0)[0]  # a tight canvas
                    bank[k, v, a] = canonical(img, mask)
                    if a == 0 and v == 0:
                        area[k] = mask.sum()
        return bank, area

    # ---- reading a clip ----------------------------------------------------------------------------

    def background_of(self, frames: np.ndarray) -> int:
        """Index into ``self.backgrounds`` of the nearest plate (median abs error over 3 frames, the smallest of
        its drawn and blurred variants)."""
        pick = frames[np.unique(np.linspace(0, len(frames) - 1, 3).round().astype(int))].astype(np.float32)
        err = [min(np.median(np.abs(pick - v[None]).sum(-1), axis=(1, 2)).mean() for v in p) for p in self.plates]
        return int(np.argmin(err))

    def read(self, frames: np.ndarray) -> dict:
        """What a clip shows: {"background": index, "valid": bool [T], "x", "y" (fractions), "size" (sqrt
        area, px): float [T], "crops": float32 [T, D] (zeros where no sprite)}."""
        frames = np.asarray(frames, np.uint8)
        if frames.ndim != 4 or frames.shape[1:] != (self.h, self.w, 3):
            raise ValueError(f"clip of shape {frames.shape}: expected [T, {self.h}, {self.w}, 3]")
        b = self.background_of(frames)
        masks = sprite_masks(frames, self.plates[b])
        t = len(frames)
        out = {"background": b, "valid": np.zeros(t, bool), "x": np.zeros(t), "y": np.zeros(t), "size": np.zeros(t),
               "crops": np.zeros((t, GRID * GRID * 3), np.float32)}
        for i in range(t):
            crop = canonical(frames[i], masks[i])
            if crop is None:
                continue
            ys, xs = np.nonzero(masks[i])
            out["valid"][i] = True
            out["x"][i], out["y"][i] = (xs.mean() + 0.5) / self.w, (ys.mean() + 0.5) / self.h
            out["size"][i], out["crops"][i] = math.sqrt(len(ys)), crop
        return out

    def _distances(self, crops: np.ndarray, k: int | None = None) -> np.ndarray:
        """Squared distances of crops [N, D] to the templates: [N, K, A] (or [N, A] of character ``k``), the
        nearer of each template's sharp and blurred variants."""
        bank, sq = (self.bank, self.bank_sq) if k is None else (self.bank[k], self.bank_sq[k])
        dots = np.tensordot(crops, bank, axes=([1], [bank.ndim - 1]))
        d = (crops ** 2).sum(-1).reshape((-1,) + (1,) * (bank.ndim - 1)) - 2 * dots + sq[None]
        return d.min(axis=-2)  # over the blur variants

    def character_of(self, seen: dict) -> int:
        """Index of the nearest character (sum over CHARACTER_FRAMES valid frames of the best angle); -1 when
        no frame shows a sprite or the nearest is no match (mean squared crop distance per value over
        MAX_CHARACTER_FIT: a blob of noise is nobody)."""
        idx = np.nonzero(seen["valid"])[0]
        if not len(idx):
            return -1
        idx = idx[np.unique(np.linspace(0, len(idx) - 1, CHARACTER_FRAMES).round().astype(int))]
        total = self._distances(seen["crops"][idx]).min(axis=2).sum(axis=0)  # [K]
        k = int(np.argmin(total))
        return k if total[k] / (len(idx) * self.bank.shape[-1]) <= MAX_CHARACTER_FIT else -1

    def motion_of(self, seen: dict, times: np.ndarray, k: int) -> tuple[str, bool]:
        """(motion, quick) of a clip read by :meth:`read` whose frames are at ``times`` (s), character ``k``
        (its templates decide spin vs stand); ("none", False) when fewer than 3 frames show a sprite."""
        v = seen["valid"]
        if v.sum() < 3:
            return "none", False
        t, x, y, ls = times[v], seen["x"][v], seen["y"][v], np.log(seen["size"][v])
        best, err = ("stand", False), math.inf
        for m, q in [*((m, q) for m, q in toy_motion.ACTIONS if m not in ("stand", "spin")), ("stand", False)]:
            px, py, pls = self._predicted(m, q, t, float(np.exp(ls[0])), k)
            e = sum(float(np.mean(((o - p) - (o - p).mean()) ** 2)) / s ** 2
                    for o, p, s in ((x, px, SIGMA[0]), (y, py, SIGMA[1]), (ls, pls, SIGMA[2])))
            if e < err:
                best, err = (m, q), e
        if err > MAX_FIT:  # no action moves like this (a sprite that jumps about, frames out of order)
            return "none", False
        if best[0] != "stand" or k < 0:
            return best
        d = self._distances(seen["crops"][v], k)  # [N, A]
        bins = 2 * math.pi / ANGLES
        scores = {}
        spin = toy_motion.SPIN
        for m, q, omega in (("stand", False, 0.0), ("spin", False, spin[False]), ("spin", True, spin[True])):
            off = np.rint(omega * t / bins).astype(int)  # [N]
            cols = (np.arange(ANGLES)[:, None] + off[None]) % ANGLES  # [A0, N]
            scores[(m, q)] = float(d[np.arange(len(t))[None], cols].mean(axis=1).min())
        pick = min(scores, key=scores.get)
        if scores[pick] / self.bank.shape[-1] > MAX_SPIN_FIT:  # no steady angle track (frames out of order)
            return "none", False
        return pick

    def _predicted(self, motion: str, quick: bool, t: np.ndarray, size_px: float,
                   k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, y, log scale) of ``motion`` at ``t`` (fractions of the width / height) from a state whose size is
        ``size_px`` (sqrt area; character ``k``'s area at scale 1 gives the scale), unclamped: the fit compares
        shapes, its offsets are fitted away."""
        unit = math.sqrt(self.unit_area[k]) if k >= 0 and self.unit_area[k] > 0 else size_px
        state = toy_motion.State(0.5, size_px / unit, 0.0)
        poses = np.asarray([toy_motion.sprite_pose(state, motion, quick, float(tt), 1, 1, clamp=False) for tt in t])
        return poses[:, 0], poses[:, 1], np.log(poses[:, 2] / toy_sprites.RADIUS)

    # ---- scoring -----------------------------------------------------------------------------------

    def truth_clip(self, turn: dict, character: str, times: np.ndarray) -> np.ndarray:
        """uint8 [T, h, w, 3]: the engine's render of ``turn`` (a truth.json turn) from its start state, resized
        like data.prepare resizes the films."""
        c = self.chars[self.names.index(character)]
        frames = toy_motion.render_turn(c, toy_motion.State.from_json(turn["start"]), turn["motion"], bool(turn["quick"]),
                                       turn["background"], times, self.size)
        return np.stack([_resize(f, self.h, self.w) for f in frames])

    def film_clip(self, turn: dict, character: str, times: np.ndarray) -> np.ndarray:
        """uint8 [T, h, w, 3]: ``turn`` as a training clip is made: rendered at the world's size and frame rate,
        encoded as the world's films are (H.264, data/video.write_film), decoded, sampled at ``times`` and
        resized (the referee's ceiling on what a system can learn from its data)."""
        c = self.chars[self.names.index(character)]
        fps = float(self.manifest["fps"])
        n = max(int(round(float(np.max(times)) * fps)) + 1, 2)
        frames = toy_motion.render_turn(c, toy_motion.State.from_json(turn["start"]), turn["motion"], bool(turn["quick"]),
                                       turn["background"], np.arange(n) / fps, self.size)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "turn.mp4")
            video.write_film(path, frames, fps, x264_params=toy_world.X264_PARAMS)
            decoded = media.read_video(path)[0]
        idx = np.minimum(np.rint(np.asarray(times) * fps).astype(int), len(decoded) - 1)
        return np.stack([_resize(decoded[i], self.h, self.w) for i in idx])

    def score_turn(self, clip: np.ndarray, turn: dict, character: str, times: np.ndarray,
                   states: Sequence[int] | None = None, pixels: bool = True) -> dict:
        """One turn: what the clip shows against ``turn``'s truth (a truth.json turn of ``character``).

        Returns {"motion", "quick", "background", "character": what was read; "motion_ok", "action_ok",
        "background_ok", "character_ok", "position_ok": bool; "meters_exact": bool or None, "meters_mae":
        float or None (``states``: predicted SC, ET, ST); "psnr", "ssim", "mse": vs :meth:`truth_clip`
        (``pixels``); "first", "last": (x, size) of the first / last frame with a sprite, or None}.
        ``position_ok``: the named character's first and last frames within CONTINUITY of where the engine
        has it at those times from the turn's start state (x and sqrt(area)): the state carried, not only
        the motion.

        Raises:
          ValueError: a clip of another frame count than ``times`` or another size than the referee's.
        """
        clip = np.asarray(clip, np.uint8)
        times = np.asarray(times, np.float64)
        if len(clip) != len(times):
            raise ValueError(f"a clip of {len(clip)} frames, but the world's turns have {len(times)} (its clip_plan): "
                             f"score a system made for this world's clip length")
        seen = self.read(clip)
        k = self.character_of(seen)
        motion, quick = self.motion_of(seen, times, k)
        want_m, want_q = turn["motion"], bool(turn["quick"])
        out = {"motion": motion, "quick": bool(quick), "background": self.backgrounds[seen["background"]],
               "character": self.names[k] if k >= 0 else None,
               "motion_ok": motion == want_m, "action_ok": motion == want_m and (want_m == "stand" or quick == want_q),
               "background_ok": self.backgrounds[seen["background"]] == turn["background"],
               "character_ok": k >= 0 and self.names[k] == character, "meters_exact": None, "meters_mae": None}
        if states is not None:
            got, want = np.asarray(list(states)[-3:], float), np.asarray(turn["states"], float)
            out["meters_exact"], out["meters_mae"] = bool((got == want).all()), float(np.abs(got - want).mean())
        v = np.nonzero(seen["valid"])[0]
        out["first"] = [float(seen["x"][v[0]]), float(seen["size"][v[0]])] if len(v) else None
        out["last"] = [float(seen["x"][v[-1]]), float(seen["size"][v[-1]])] if len(v) else None
        out["position_ok"] = bool(out["character_ok"] and len(v)) and all(
            _near(out[key], self._expected(turn, character, float(times[i])))
            for key, i in (("first", v[0]), ("last", v[-1])))
        if pixels:
            truth = self.truth_clip(turn, character, times)
            out["mse"] = float(np.mean((clip.astype(np.float64) - truth) ** 2))
            out["psnr"], out["ssim"] = psnr(clip, truth), ssim(clip, truth)
        return out

    def _expected(self, turn: dict, character: str, t: float) -> tuple[float, float]:
        """(x as a share of the width, sqrt(area) px) of ``character`` ``t`` s into ``turn`` as the engine has it."""
        pose = toy_motion.sprite_pose(toy_motion.State.from_json(turn["start"]), turn["motion"], bool(turn["quick"]), t,
                                     1, 1)
        unit = math.sqrt(self.unit_area[self.names.index(character)])
        return pose[0], unit * pose[2] / toy_sprites.RADIUS


def _near(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two (x share, size px) readings are within CONTINUITY of each other."""
    return abs(a[0] - b[0]) <= CONTINUITY[0] and abs(math.log(max(a[1], 1e-6) / max(b[1], 1e-6))) <= CONTINUITY[1]


def continuous(prev: dict, nxt: dict) -> bool:
    """Whether turn ``nxt`` starts where ``prev`` ended: both show the named character, and its x and size
    at ``nxt``'s first frame are within CONTINUITY of ``prev``'s last (score_turn's "first" / "last")."""
    if prev.get("last") is None or nxt.get("first") is None or not (prev["character_ok"] and nxt["character_ok"]):
        return False
    return _near(prev["last"], nxt["first"])


def columns(turns: Sequence[dict], boundaries: Sequence[bool]) -> dict:
    """The report's columns over scored turns (score_turn's dicts) and their continuity checks (one bool per
    turn after a game's first); ``psnr`` from the turns' mean squared error (not a mean of dB)."""
    def mean(key):
        vals = [float(t[key]) for t in turns if t.get(key) is not None]
        return float(np.mean(vals)) if vals else None

    mse = mean("mse")
    return {"motion": mean("motion_ok"), "action": mean("action_ok"), "background": mean("background_ok"),
            "character": mean("character_ok"), "meters_exact": mean("meters_exact"), "meters_mae": mean("meters_mae"),
            "continuity": float(np.mean(boundaries)) if len(boundaries) else None, "position": mean("position_ok"),
            "psnr": None if mse is None else (100.0 if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))),
            "ssim": mean("ssim"), "num_turns": len(turns)}


def chance(manifest: dict) -> dict:
    """Each column's chance level: a uniform guess among the world's motions, actions, backgrounds,
    characters and distinct state rules (None where no guess applies)."""
    rules = {tuple(v) for _, slow, quick in toy_motion.MOTIONS.values() for v in (slow, quick)}
    return {"motion": 1 / len(toy_motion.MOTIONS), "action": 1 / len(toy_motion.ACTIONS),
            "background": 1 / len(manifest["backgrounds"]), "character": 1 / len(manifest["characters"]),
            "meters_exact": 1 / len(rules), "meters_mae": None, "continuity": None, "position": None, "psnr": None,
            "ssim": None}


def summarize(scored: dict[str, list[list[dict]]], manifest: dict, bucket: int = 5) -> dict:
    """The report from scored games per split ({split: [[turn dict, ...] per game]}): ``splits``, ``chance``
    and ``by_turn`` (the long game's columns per ``bucket`` turns)."""
    report = {"splits": {}, "chance": chance(manifest), "by_turn": {}}
    for split, games in scored.items():
        turns = [t for g in games for t in g]
        bounds = [continuous(a, b) for g in games for a, b in zip(g, g[1:])]
        report["splits"][split] = columns(turns, bounds)
    long_games = scored.get("long") or []
    if long_games:
        g = long_games[0]
        rows = []
        for s in range(0, len(g), bucket):
            part = g[s:s + bucket]
            bounds = [continuous(a, b) for a, b in zip(g[max(s - 1, 0):s + bucket], g[max(s, 1):s + bucket])]
            rows.append((f"{s + 1}-{s + len(part)}", columns(part, bounds)))
        report["by_turn"] = {"turns": [r[0] for r in rows],
                             **{c: [r[1][c] for r in rows] for c in (*COLUMNS, "num_turns")}}
    return report


def pct(v) -> str:
    """A share in [0, 1] as ``"75.0 %"``; None as ``"n/a"``."""
    return "n/a" if v is None else f"{100 * v:.1f} %"


def render_markdown(report: dict) -> str:
    """report.md: one row per split, one column per score, the chance row; the long game by turn bucket."""
    def cell(c, v):
        if v is None:
            return "n/a"
        return f"{v:.2f} dB" if c == "psnr" else f"{v:.3f}" if c in ("ssim", "meters_mae") else pct(v)

    head = "| split | turns | " + " | ".join(COLUMNS) + " |"
    lines = [f"Referee of {report.get('world', '?')}: system {report.get('system', '?')}.", "", head,
             "|---" * (len(COLUMNS) + 2) + "|"]
    for split, cols in report["splits"].items():
        lines.append(f"| {split} | {cols['num_turns']} | " + " | ".join(cell(c, cols[c]) for c in COLUMNS) + " |")
    lines.append("| chance | | " + " | ".join(cell(c, report["chance"][c]) for c in COLUMNS) + " |")
    bt = report.get("by_turn") or {}
    if bt.get("turns"):
        lines += ["", "The long game by turn:", "", "| turns | " + " | ".join(COLUMNS) + " |",
                  "|---" * (len(COLUMNS) + 1) + "|"]
        for i, lab in enumerate(bt["turns"]):
            lines.append(f"| {lab} | " + " | ".join(cell(c, bt[c][i]) for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"
