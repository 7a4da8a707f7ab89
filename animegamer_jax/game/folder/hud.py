"""The HUD drawn under a turn's frames (the meters and the instruction) and the game's videos: H.264 MP4
and GIF through ``io.media``, the project's one media writer, in its deterministic mode."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from animegamer_jax.io import media
from animegamer_jax.game.run import METER_NAMES
from animegamer_jax.inference.vae_decode import FRAME_RANGE

_METER_COLORS = {"social": (80, 160, 255), "entertainment": (255, 180, 60), "stamina": (90, 220, 120)}


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # pillow without FreeType: bitmap font of fixed size
        return ImageFont.load_default()


def draw_hud(frames: np.ndarray, meters: Mapping[str, int], instruction: str, turn: int) -> np.ndarray:
    """Adds a HUD panel under every frame: three meter bars with values and the instruction.

    Args:
      frames: uint8 ``[T, H, W, 3]``.
      meters: ``{"social": v, "entertainment": v, "stamina": v}``, values in 0..100.
      instruction: the turn's instruction text (wrapped).
      turn: 0-based turn index (shown 1-based).

    Returns:
      uint8 ``[T, H' + panel, W', 3]`` with even height and width; the panel height depends only
      on the frame width, so all turns of a game have one size. Frames narrower than 240 px
      are first enlarged by an integer factor (nearest neighbour).
    """
    if frames.shape[2] < 240:
        # tiny configs: enlarge (nearest) so the frame is not a speck beside the HUD text
        f = -(-240 // frames.shape[2])
        frames = np.repeat(np.repeat(frames, f, axis=1), f, axis=2)
    t, h, w, _ = frames.shape
    pw = w
    fs = max(9, min(14, pw // 30))
    font = _font(fs)
    chars = max(10, int(pw / (fs * 0.55)))
    max_lines = 4
    lines = textwrap.wrap(f"Turn {turn + 1}: {instruction}", chars)[:max_lines]
    # room for max_lines whatever the instruction: every turn of a game gets the same frame size
    # (game.mp4 concatenates them)
    panel_h = 6 + 3 * (fs + 4) + 4 + max_lines * (fs + 3) + 4
    total_h = h + panel_h + ((h + panel_h) % 2)
    total_w = pw + pw % 2
    panel = Image.new("RGB", (total_w, total_h - h), (16, 16, 24))
    d = ImageDraw.Draw(panel)
    y = 6
    label_w = int(fs * 0.6 * len("entertainment ")) + 4
    bar_w = max(20, total_w - label_w - 8 - int(fs * 2.2))
    for name in METER_NAMES:
        v = int(meters[name])
        d.text((4, y), name, fill=(230, 230, 230), font=font)
        x0 = label_w
        d.rectangle([x0, y + 2, x0 + bar_w, y + fs], outline=(120, 120, 120))
        d.rectangle([x0, y + 2, x0 + int(bar_w * max(0, min(100, v)) / 100), y + fs], fill=_METER_COLORS[name])
        d.text((x0 + bar_w + 4, y), str(v), fill=(230, 230, 230), font=font)
        y += fs + 4
    y += 4
    for line in lines:
        d.text((4, y), line, fill=(255, 255, 255), font=font)
        y += fs + 3
    panel_np = np.asarray(panel)
    out = np.zeros((t, total_h, total_w, 3), np.uint8)
    out[:, :h, :w] = frames
    out[:, h:] = panel_np[None]
    return out


def _even(frames: np.ndarray) -> np.ndarray:
    t, h, w, c = frames.shape
    if h % 2 or w % 2:
        out = np.zeros((t, h + h % 2, w + w % 2, c), np.uint8)
        out[:, :h, :w] = frames
        return out
    return frames


def write_mp4(path: str, frames: np.ndarray, fps: float) -> None:
    """H.264 MP4 (yuv420p, crf 18, preset veryfast) of ``[T, H, W, 3]`` frames (uint8 or [0, 1]) at
    ``fps``, padded to even sizes, written by the one video writer (``media.write_mp4``) in its
    deterministic mode, so identical frames give byte-identical files."""
    media.write_mp4(path, _even(media.to_uint8(frames, FRAME_RANGE)), fps, crf=18, preset="veryfast",
                    container_format="mp4", deterministic=True)


def write_gif(path: str, frames: np.ndarray, fps: float) -> None:
    """Looping GIF of ``[T, H, W, 3]`` frames (uint8 or [0, 1]) at ``fps`` (``media.write_gif``)."""
    media.write_gif(path, media.to_uint8(frames, FRAME_RANGE), fps)


def clip_from_hud(hud: np.ndarray, frame_size: Sequence[int]) -> np.ndarray:
    """A turn's clip cut from under its HUD: a decoded turn video uint8 ``[T, H', W', 3]`` (:func:`draw_hud`'s
    output) -> uint8 ``[T, h, w, 3]`` with ``frame_size`` = (h, w), game.json's ``save.frame_size`` (every
    f-th pixel where draw_hud enlarged a narrow frame f times)."""
    h, w = int(frame_size[0]), int(frame_size[1])
    f = -(-240 // w) if w < 240 else 1  # draw_hud's enlargement of narrow frames
    return hud[:, :h * f:f, :w * f:f]

