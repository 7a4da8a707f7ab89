"""Video I/O helpers: the pixel-range conversions, MP4 (H.264 via PyAV) and GIF writing, reading.

Frames are ``[T, H, W, 3]`` (one clip) throughout; the VAE's video range is [-1, 1]
(docs/diffusion.md#latent-scale: final video ``clamp((x + 1) / 2, 0, 1)``), data clips are uint8.
The one home of the range conversions: :func:`to_unit` (float range -> [0, 1], numpy or jax, usable
under ``jax.jit``), :func:`to_uint8` (float range -> uint8 pixels) and :func:`from_uint8` (uint8
pixels -> float range).
"""

from __future__ import annotations

import io
import os
from fractions import Fraction

import numpy as np
from PIL import Image

from animegamer_jax.io import fileio

#: the VAE's pixel range (its encoder's input, its decoder's output)

from animegamer_jax.io import paths
VAE_RANGE = (-1.0, 1.0)


def to_unit(frames, value_range: tuple[float, float] = VAE_RANGE):
    """Float frames in ``value_range`` -> ``clip((x - lo) / (hi - lo), 0, 1)``, same array type and dtype.

    Args:
      frames: a float numpy or jax array of any shape (traceable: used inside jitted decoders).
      value_range: (lo, hi) of the input, default the VAE's (-1, 1).

    Returns:
      an array of the same shape, type and dtype, in [0, 1].
    """
    lo, hi = value_range
    return ((frames - lo) / (hi - lo)).clip(0.0, 1.0)


def to_uint8(frames, value_range: tuple[float, float] = VAE_RANGE) -> np.ndarray:
    """Float frames -> uint8 ``[..., 3]``: ``round(255 * clip((x - lo) / (hi - lo), 0, 1))``.

    Args:
      frames: array-like (numpy or jax) of any shape, e.g. ``[T, H, W, 3]``; uint8 frames are
        already pixels and are returned as they are.
      value_range: (lo, hi) of float input, default the VAE's (-1, 1); (0, 1) for [0, 1] frames.

    Returns:
      uint8 numpy array of the same shape.
    """
    x = np.asarray(frames)
    if x.dtype == np.uint8:
        return x
    return np.round(to_unit(x.astype(np.float32), value_range) * 255.0).astype(np.uint8)


def from_uint8(frames, value_range: tuple[float, float] = VAE_RANGE):
    """uint8 pixels -> float32 ``x / 255 * (hi - lo) + lo`` in ``value_range`` (default [-1, 1], the VAE
    encoder's and CLIP's input).

    Args:
      frames: a uint8 numpy or jax array of any shape (traceable: a jax array stays a jax array, so the
        conversion can run inside a jitted program next to the network that reads it).
      value_range: (lo, hi) of the output.

    Returns:
      float32 array of the same shape and array type.

    Raises:
      TypeError: ``frames`` is not uint8.
    """
    lo, hi = value_range
    x = frames if hasattr(frames, "astype") and not isinstance(frames, (list, tuple)) else np.asarray(frames)
    if x.dtype != np.uint8:
        raise TypeError(f"from_uint8 expects uint8 frames, got {x.dtype}")
    return x.astype(np.float32) / 255.0 * (hi - lo) + lo


def _check_frames(frames) -> np.ndarray:
    x = to_uint8(frames)
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"expected frames [T, H, W, 3], got shape {x.shape}")
    return x


def write_mp4(path: str, frames, fps: float = 8.0, crf: int = 18, preset: str | None = None,
              container_format: str | None = None, deterministic: bool = False) -> None:
    """Writes an H.264 MP4 (libx264, yuv420p) with PyAV.

    Args:
      path: output file.
      frames: ``[T, H, W, 3]`` uint8, or float in [-1, 1] (converted by :func:`to_uint8`).
        H and W must be even (yuv420p).
      fps: frames per second (AnimeGamer clips: 8 fps, docs/data.md#clips).
      crf: x264 constant rate factor (lower = better quality; 0 = lossless luma).
      preset: x264 preset ("veryfast", ...); None = x264's default ("medium").
      container_format: the container (None = "mp4", also for paths without a video suffix,
        e.g. temporary files of atomic writes).
      deterministic: identical frames give byte-identical files: libx264 with one thread (threaded
        encoding depends on thread timing), explicit frame timestamps, and macroblock-tree rate
        control off (``mbtree=0``: with it on, PyAV's bundled x264 gives different files for the
        same frames from run to run). Game outputs use it.

    Raises:
      ValueError: wrong shape, or odd H / W.
    """
    import av  # heavy

    x = _check_frames(frames)
    t, h, w, _ = x.shape
    if h % 2 or w % 2:
        raise ValueError(f"H.264 yuv420p needs even height and width, got {h}x{w}")
    fileio.makedirs(paths.as_path(path).parent)
    rate = Fraction(fps).limit_denominator(1001)
    options = {"crf": str(crf), **({"preset": preset} if preset else {})}
    target = paths.av_output(path)  # a URL is encoded in memory, then uploaded
    with av.open(target, mode="w", format=container_format or "mp4") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        if deterministic:
            stream.codec_context.thread_count = 1
            stream.codec_context.thread_type = "NONE"
            options.update({"threads": "1", "x264-params": "mbtree=0"})
        stream.options = options
        for i, f in enumerate(x):
            frame = av.VideoFrame.from_ndarray(f, format="rgb24")
            if deterministic:
                frame.pts = i  # explicit timestamps: nothing left for the muxer to guess
                frame.time_base = 1 / rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    paths.finish_av_output(path, target)


def write_gif(path: str, frames, fps: float = 8.0, loop: int = 0) -> None:
    """Writes an animated GIF with Pillow (``duration = 1000 / fps`` ms per frame, 10 ms units).

    Args:
      frames: ``[T, H, W, 3]`` uint8 or float in [-1, 1].
      fps: frames per second.
      loop: 0 = loop forever.
    """
    x = _check_frames(frames)
    out = paths.as_path(path)
    fileio.makedirs(out.parent)
    images = [Image.fromarray(f) for f in x]
    buf = io.BytesIO()
    images[0].save(
        buf, format="GIF", save_all=True, append_images=images[1:], duration=int(round(1000.0 / fps)), loop=loop,
        optimize=False)
    out.write_bytes(buf.getvalue())


def write_video(path: str, frames, fps: float = 8.0) -> None:
    """Writes ``.mp4`` or ``.gif`` by the file suffix (see :func:`write_mp4`, :func:`write_gif`)."""
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext == ".gif":
        write_gif(path, frames, fps)
    elif ext in (".mp4", ".m4v", ".mov"):
        write_mp4(path, frames, fps)
    else:
        raise ValueError(f"unsupported video suffix {ext!r} (use .mp4 or .gif)")


def read_video(path: str, max_frames: int | None = None) -> tuple[np.ndarray, float]:
    """Decodes a video file with PyAV.

    Returns:
      (uint8 frames ``[T, H, W, 3]`` RGB, fps as float; for GIFs fps comes from the frame duration).
    """
    import av  # heavy

    frames = []
    src = io.BytesIO(paths.as_path(path).read_bytes()) if paths.is_url(path) else path
    with av.open(src) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate) if stream.average_rate else 0.0
        for frame in container.decode(stream):
            if not fps and frame.duration and frame.time_base:
                fps = 1.0 / float(frame.duration * frame.time_base)
            frames.append(frame.to_ndarray(format="rgb24"))
            if max_frames is not None and len(frames) >= max_frames:
                break
    if not frames:
        raise ValueError(f"no video frames in {path}")
    return np.stack(frames), fps


def save_image(path: str, img: Image.Image, **kw) -> None:
    """PIL ``img.save(buf, **kw)`` (e.g. ``format="PNG"``) to ``path``, a local path or a URL: encoded in
    memory, then written in one piece (``fileio.write_bytes_atomic``).

    Raises:
      OSError: the folder is missing or not writable; ValueError / KeyError: PIL cannot encode ``kw``'s format.
    """
    buf = io.BytesIO()
    img.save(buf, **kw)
    fileio.write_bytes_atomic(path, buf.getvalue())


def contact_sheet(turn_frames, columns: int = 6, value_range: tuple[float, float] = VAE_RANGE) -> np.ndarray:
    """Rows = clips (``[T, 8h, 8w, 3]`` each, values in ``value_range``), columns = ``columns`` evenly
    spaced frames of each, 2-px white separators; uint8 ``[H', W', 3]``."""
    rows = []
    for frames in turn_frames:
        frames = to_uint8(frames, value_range)
        idx = np.linspace(0, len(frames) - 1, min(columns, len(frames))).round().astype(int)
        sep = np.full((frames.shape[1], 2, 3), 255, np.uint8)
        cells = []
        for i in idx:
            cells += [frames[i], sep]
        rows.append(np.concatenate(cells[:-1], axis=1))
        rows.append(np.full((2, rows[-1].shape[1], 3), 255, np.uint8))
    return np.concatenate(rows[:-1], axis=0)
