"""Game outputs: per-turn MP4 (+GIF) with a HUD, the whole-game video, game.json, index.html, contact sheet.

Layout of one finished game folder ``<out>/<game_id>/``::

    turn_000.mp4  turn_000.gif  ...   one clip per turn, HUD drawn on every frame
    game.mp4                          all turns concatenated
    contact_sheet.png                 rows = turns, columns = evenly spaced frames (no HUD)
    game.json                         instructions, states, meters, seeds, timings, config name
    index.html                        gallery playing the turns in order (video controls, meter bars;
                                      styled by gallery.css, shared with the web app)

Writes are atomic per game: everything goes to a hidden temp folder next to the target, which is
renamed into place only when complete, so an interrupted run never leaves a folder holding a
``game.json`` (the marker :func:`is_finished` uses for resuming). MP4 is H.264 (yuv420p) through
PyAV's bundled libx264; the frame size is padded to even numbers because yuv420p needs it.
HUD: the three meters (social, entertainment, stamina, app.py semantics, architecture.md §1.5) as
bars with values, and the instruction text, drawn with PIL under the frame.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
import textwrap
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from animegamer_jax.game.state import METER_NAMES

GAME_JSON = "game.json"
_METER_COLORS = {"social": (80, 160, 255), "entertainment": (255, 180, 60), "stamina": (90, 220, 120)}


class OutputError(OSError):
    """The output folder cannot be created or written."""


def is_finished(game_dir: str) -> bool:
    """True when ``game_dir`` holds a complete game (its ``game.json`` is written last)."""
    return os.path.isfile(os.path.join(game_dir, GAME_JSON))


def check_writable(out_dir: str) -> None:
    """Creates ``out_dir`` if needed and checks a file can be written in it.

    Raises:
      OutputError: the folder cannot be created or is not writable (message names it and the fix).
    """
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=out_dir)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise OutputError(f"output folder {out_dir!r} is not writable ({e.strerror or e}). "
                          f"Fix: pass --out with a folder you can write to") from None


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # pillow without FreeType: bitmap font of fixed size
        return ImageFont.load_default()


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """float ``[T, H, W, 3]`` in [0, 1] (or uint8) -> uint8 ``[T, H, W, 3]``."""
    frames = np.asarray(frames)
    if frames.dtype == np.uint8:
        return frames
    return np.clip(np.round(frames.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)


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
    """H.264 MP4 (yuv420p, crf 18) of uint8 ``[T, H, W, 3]`` frames at ``fps``."""
    frames = _even(to_uint8(frames))
    from fractions import Fraction
    with av.open(path, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast"}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_gif(path: str, frames: np.ndarray, fps: float) -> None:
    """Looping GIF of uint8 ``[T, H, W, 3]`` frames at ``fps``."""
    imgs = [Image.fromarray(f) for f in to_uint8(frames)]
    imgs[0].save(path, save_all=True, append_images=imgs[1:], duration=int(round(1000 / fps)), loop=0)


def contact_sheet(turn_frames: Sequence[np.ndarray], columns: int = 6) -> np.ndarray:
    """Rows = turns, columns = ``columns`` evenly spaced frames of each turn; uint8 ``[H', W', 3]``."""
    rows = []
    for frames in turn_frames:
        frames = to_uint8(frames)
        idx = np.linspace(0, len(frames) - 1, min(columns, len(frames))).round().astype(int)
        sep = np.full((frames.shape[1], 2, 3), 255, np.uint8)
        cells = []
        for i in idx:
            cells += [frames[i], sep]
        rows.append(np.concatenate(cells[:-1], axis=1))
        rows.append(np.full((2, rows[-1].shape[1], 3), 255, np.uint8))
    return np.concatenate(rows[:-1], axis=0)


#: the stylesheet of the gallery and the web app (animegamer_jax/web): one look for both
GALLERY_CSS = open(os.path.join(os.path.dirname(__file__), "gallery.css"), encoding="utf-8").read()


def meters_html(meters: Mapping[str, int], deltas: Mapping[str, int] | None = None) -> str:
    """The meters as bars (``gallery.css`` classes; the web app's app.js draws the same markup).

    Args:
      meters: ``{"social", "entertainment", "stamina"}`` values in 0..100.
      deltas: optional change of each meter this turn (meter units), shown as ``+5`` / ``-10``.
    """
    cells = []
    for name in METER_NAMES:
        v = int(meters[name])
        d = "" if deltas is None else f"{int(deltas[name]):+d}"
        cls = "" if deltas is None else ("up" if deltas[name] > 0 else "down" if deltas[name] < 0 else "")
        cells.append(f'<span class="name">{name}</span><span class="bar" role="meter" aria-valuemin="0" '
                     f'aria-valuemax="100" aria-valuenow="{v}" aria-label="{name}"><span class="fill {name}" '
                     f'style="width:{max(0, min(100, v))}%"></span></span><span class="value">{v}</span>'
                     f'<span class="delta {cls}">{d}</span>')
    return f'<div class="meters">{"".join(cells)}</div>'


def _index_html(game_id: str, record: Mapping[str, Any]) -> str:
    items = []
    start = record.get("meter_start")
    prev = None if start is None else dict.fromkeys(METER_NAMES, int(start))
    for t in record["turns"]:
        m, st = t["meters"], t["states"]
        deltas = None if prev is None else {k: int(m[k]) - int(prev[k]) for k in METER_NAMES}
        prev = m
        items.append(
            f'<figure class="turn"><video src="{html.escape(t["video"])}" controls muted playsinline '
            f'preload="auto" class="pixelated"></video>'
            f"<figcaption><b>Turn {t['turn'] + 1}</b>: {html.escape(t['instruction'])}"
            f'<div class="states">ML {st["ML"]} SC {st["SC"]:+d} ET {st["ET"]:+d} ST {st["ST"]:+d}</div>'
            f"{meters_html(m, deltas)}</figcaption></figure>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(game_id)}</title>
<style>
{GALLERY_CSS}</style></head>
<body><h1>{html.escape(game_id)}</h1>
<p class="muted">config {html.escape(str(record["config"]))}, seed {record["seed"]}, {len(record["turns"])} turns.</p>
<p><button id="play" class="primary">play all turns in order</button> <a href="game.mp4">whole game (MP4)</a>
&middot; <a href="contact_sheet.png">contact sheet</a> &middot; <a href="game.json">game.json</a></p>
<div class="turns">
{"".join(items)}
</div>
<script>
const vids=[...document.querySelectorAll('video')];
function playFrom(i){{vids.forEach(v=>v.parentElement.classList.remove('playing'));
 if(i>=vids.length)return; const v=vids[i]; v.parentElement.classList.add('playing'); v.currentTime=0;
 v.onended=()=>playFrom(i+1); v.play().catch(()=>{{}});}}
document.getElementById('play').onclick=()=>playFrom(0);
playFrom(0);
</script></body></html>
"""


def write_game(out_dir: str, game_id: str, record: Mapping[str, Any], turn_frames: Sequence[np.ndarray],
               fps: float, write_gif_files: bool = True, sheet_columns: int = 6) -> str:
    """Writes one finished game atomically; returns the game folder.

    Args:
      out_dir: parent folder (created if needed).
      game_id: folder name.
      record: the game.json content: must hold ``turns``, a list (one per turn) of dicts with
        ``turn``, ``instruction``, ``states`` ({"ML","SC","ET","ST"}) and ``meters``; ``seed`` and
        ``config``. This function adds the file names (``video``, ``gif``) and ``timings.write_s``
        is left to the caller.
      turn_frames: per turn, ``[T, H, W, 3]`` float in [0, 1] or uint8 (no HUD; it is drawn here).
      fps: frames per second of every video.

    Raises:
      OutputError: ``out_dir`` not writable.
      ValueError: ``record["turns"]`` and ``turn_frames`` differ in length.
    """
    if len(record["turns"]) != len(turn_frames):
        raise ValueError(f"{len(record['turns'])} turn records but {len(turn_frames)} frame arrays")
    check_writable(out_dir)
    final = os.path.join(out_dir, game_id)
    tmp = os.path.join(out_dir, f".tmp-{game_id}-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        rec = json.loads(json.dumps(record))
        hud_all = []
        for k, (t, frames) in enumerate(zip(rec["turns"], turn_frames)):
            hud = draw_hud(to_uint8(frames), t["meters"], t["instruction"], k)
            hud_all.append(hud)
            t["video"] = f"turn_{k:03d}.mp4"
            write_mp4(os.path.join(tmp, t["video"]), hud, fps)
            if write_gif_files:
                t["gif"] = f"turn_{k:03d}.gif"
                write_gif(os.path.join(tmp, t["gif"]), hud, fps)
        write_mp4(os.path.join(tmp, "game.mp4"), np.concatenate(hud_all, axis=0), fps)
        Image.fromarray(contact_sheet(turn_frames, sheet_columns)).save(os.path.join(tmp, "contact_sheet.png"))
        rec["video"] = "game.mp4"
        rec["contact_sheet"] = "contact_sheet.png"
        with open(os.path.join(tmp, "index.html"), "w", encoding="utf-8") as f:
            f.write(_index_html(game_id, rec))
        with open(os.path.join(tmp, GAME_JSON), "w", encoding="utf-8") as f:
            json.dump(rec, f, indent=2)
        if os.path.lexists(final):
            # a partial folder from an interrupted run (no game.json) or a forced rewrite
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def update_json(game_dir: str, record: Mapping[str, Any]) -> None:
    """Replaces ``game_dir/game.json`` atomically (temp file + ``os.replace``)."""
    tmp = os.path.join(game_dir, f".{GAME_JSON}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    os.replace(tmp, os.path.join(game_dir, GAME_JSON))


def read_video(path: str) -> np.ndarray:
    """Decodes a video file to uint8 ``[T, H, W, 3]`` (for tests and tools)."""
    with av.open(path) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
