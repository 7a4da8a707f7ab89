"""Game outputs: per-turn MP4 (+GIF) with a HUD, the whole-game video, game.json, index.html, contact sheet.

Layout of one finished game folder ``<out>/<game_id>/``::

    turn_000.mp4  turn_000.gif  ...   one clip per turn, HUD drawn on every frame
    game.mp4                          all turns concatenated
    contact_sheet.png                 rows = turns, columns = evenly spaced frames (no HUD)
    game.json                         instructions, states, meters, seeds, timings, config name
    index.html                        gallery playing the turns in order

Writes are atomic per game: everything goes to a hidden temp folder next to the target, which is
renamed into place only when complete, so an interrupted run never leaves a folder holding a
``game.json`` (the marker :func:`is_finished` uses for resuming). ``out`` may be a URL
(``gs://bucket/games``): object stores have no rename, so there the files are written in place
and ``game.json`` last, which keeps the same guarantee. MP4 is H.264 (yuv420p) through
PyAV's bundled libx264; the frame size is padded to even numbers because yuv420p needs it.
HUD: the three meters (social, entertainment, stamina, app.py semantics, architecture.md §1.5) as
bars with values, and the instruction text, drawn with PIL under the frame.
"""

from __future__ import annotations

import html
import io
import json
import textwrap
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from animegamer_jax import paths
from animegamer_jax.game.state import METER_NAMES

GAME_JSON = "game.json"
_METER_COLORS = {"social": (80, 160, 255), "entertainment": (255, 180, 60), "stamina": (90, 220, 120)}


class OutputError(OSError):
    """The output folder cannot be created or written."""


def is_finished(game_dir: str) -> bool:
    """True when ``game_dir`` holds a complete game (its ``game.json`` is written last)."""
    return paths.isfile(paths.join(game_dir, GAME_JSON))


def check_writable(out_dir: str) -> None:
    """Creates ``out_dir`` (a local path or a URL) if needed and checks a file can be written in it.

    Raises:
      OutputError: the folder cannot be created or is not writable (message names it and the fix).
    """
    try:
        probe = paths.makedirs(out_dir) / f".write-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
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
      uint8 ``[T, H' + panel, W', 3]`` with even height and width; frames narrower than 240 px
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
    lines = textwrap.wrap(f"Turn {turn + 1}: {instruction}", chars)[:4]
    panel_h = 6 + 3 * (fs + 4) + 4 + len(lines) * (fs + 3) + 4
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
    """H.264 MP4 (yuv420p, crf 18) of uint8 ``[T, H, W, 3]`` frames at ``fps`` (``path`` may be a URL)."""
    frames = _even(to_uint8(frames))
    from fractions import Fraction
    target = paths.av_output(path)
    with av.open(target, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast"}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    paths.finish_av_output(path, target)


def _save_image(path: str, img: Image.Image, **kw: Any) -> None:
    buf = io.BytesIO()
    img.save(buf, format=kw.pop("format", None) or paths.as_path(path).suffix.lstrip(".").upper(), **kw)
    paths.as_path(path).write_bytes(buf.getvalue())


def write_gif(path: str, frames: np.ndarray, fps: float) -> None:
    """Looping GIF of uint8 ``[T, H, W, 3]`` frames at ``fps``."""
    imgs = [Image.fromarray(f) for f in to_uint8(frames)]
    _save_image(path, imgs[0], format="GIF", save_all=True, append_images=imgs[1:],
                duration=int(round(1000 / fps)), loop=0)


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


def _index_html(game_id: str, record: Mapping[str, Any]) -> str:
    items = []
    for t in record["turns"]:
        m = t["meters"]
        items.append(
            f'<figure><video src="{html.escape(t["video"])}" muted playsinline preload="auto"></video>'
            f"<figcaption><b>Turn {t['turn'] + 1}</b>: {html.escape(t['instruction'])}<br>"
            f"ML {t['states']['ML']}, SC {t['states']['SC']:+d}, ET {t['states']['ET']:+d}, "
            f"ST {t['states']['ST']:+d} | social {m['social']}, entertainment {m['entertainment']}, "
            f"stamina {m['stamina']}</figcaption></figure>")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(game_id)}</title>
<style>body{{font-family:sans-serif;background:#111;color:#eee}}figure{{display:inline-block;margin:8px;vertical-align:top}}
video{{display:block;max-width:480px}}figure.playing{{outline:3px solid #fc6}}</style></head>
<body><h1>{html.escape(game_id)}</h1>
<p>config {html.escape(str(record["config"]))}, seed {record["seed"]}, {len(record["turns"])} turns.
<button id="play">play all turns in order</button> <a href="game.mp4">whole game (MP4)</a>
<a href="contact_sheet.png">contact sheet</a></p>
{"".join(items)}
<script>
const vids=[...document.querySelectorAll('video')];
function playFrom(i){{vids.forEach(v=>v.parentElement.classList.remove('playing'));
 if(i>=vids.length)return; const v=vids[i]; v.parentElement.classList.add('playing'); v.currentTime=0;
 v.onended=()=>playFrom(i+1); v.play();}}
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
    final = paths.join(out_dir, game_id)
    remote = paths.is_url(out_dir)
    if remote:
        # Object stores have no folder rename: write in place; game.json (the finished marker) last.
        paths.rmtree(final)  # a partial folder of an interrupted run (no game.json) or a forced rewrite
        tmp = final
    else:
        tmp = paths.join(out_dir, f".tmp-{game_id}-{uuid.uuid4().hex[:8]}")
    paths.makedirs(tmp)
    try:
        rec = json.loads(json.dumps(record))
        hud_all = []
        for k, (t, frames) in enumerate(zip(rec["turns"], turn_frames)):
            hud = draw_hud(to_uint8(frames), t["meters"], t["instruction"], k)
            hud_all.append(hud)
            t["video"] = f"turn_{k:03d}.mp4"
            write_mp4(paths.join(tmp, t["video"]), hud, fps)
            if write_gif_files:
                t["gif"] = f"turn_{k:03d}.gif"
                write_gif(paths.join(tmp, t["gif"]), hud, fps)
        write_mp4(paths.join(tmp, "game.mp4"), np.concatenate(hud_all, axis=0), fps)
        _save_image(paths.join(tmp, "contact_sheet.png"), Image.fromarray(contact_sheet(turn_frames, sheet_columns)))
        rec["video"] = "game.mp4"
        rec["contact_sheet"] = "contact_sheet.png"
        paths.as_path(tmp).joinpath("index.html").write_text(_index_html(game_id, rec), encoding="utf-8")
        paths.as_path(tmp).joinpath(GAME_JSON).write_text(json.dumps(rec, indent=2), encoding="utf-8")
        if not remote:
            # a partial folder from an interrupted run (no game.json) or a forced rewrite
            paths.rmtree(final)
            paths.move_dir(tmp, final)
    except BaseException:
        if not remote:
            paths.rmtree(tmp)
        raise
    return final


def update_json(game_dir: str, record: Mapping[str, Any]) -> None:
    """Replaces ``game_dir/game.json`` atomically (temp file + ``os.replace``; one object upload on URLs)."""
    paths.write_text_atomic(paths.join(game_dir, GAME_JSON), json.dumps(record, indent=2))


def read_video(path: str) -> np.ndarray:
    """Decodes a video file (local path or URL) to uint8 ``[T, H, W, 3]`` (for tests and tools)."""
    src = io.BytesIO(paths.as_path(path).read_bytes()) if paths.is_url(path) else path
    with av.open(src) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
