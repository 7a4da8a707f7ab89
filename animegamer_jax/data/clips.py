"""Film -> fixed-length clips (paper Sec. 3.3, Appendix B; docs/data.md#clips).

Each shot (scene) is cut into back-to-back segments of `clip_seconds` (2 s) in timestamp order; the
remainder shorter than one segment is dropped, so no clip crosses a scene cut. From a segment we sample
`num_frames` (17) frames at `fps` (8): sample i is the source frame on screen at
`start + i / fps`, clamped to the segment's last source frame (17 samples at 8 fps span 2.0 s, so
sample 16 would otherwise be the first frame of the next segment, possibly across a cut). Frames are
resized so that they cover the target and center-cropped to (height, width) (480x720 at full size).

Extraction is two-pass and streaming: pass 1 finds scenes (scenes.detect_scenes) and plans the clips;
pass 2 decodes once more and keeps only the frames of clips not yet complete, so memory holds about
one clip's frames at a time, whatever the film length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from animegamer_jax.data import scenes as scenes_lib
from animegamer_jax.data import video


class FilmTooShortError(ValueError):
    """A film (or every scene of it) is shorter than one clip."""


@dataclasses.dataclass(frozen=True)
class ClipSpec:
    """Where a clip comes from.

    Attributes:
      film_id: the film's id (user-chosen, e.g. the file stem).
      clip_index: 0-based position of the clip in its film (timestamp order, across scenes).
      scene_id: 0-based shot index in the film.
      start_frame: first source frame of the segment.
      end_frame: one past the last source frame of the segment.
      frame_indices: the `num_frames` sampled source frame indices (int, non-decreasing).
      src_fps: the film's frame rate.
    """

    film_id: str
    clip_index: int
    scene_id: int
    start_frame: int
    end_frame: int
    frame_indices: tuple[int, ...]
    src_fps: float

    @property
    def start_time(self) -> float:
        """Segment start in seconds from the start of the film."""
        return self.start_frame / self.src_fps

    @property
    def end_time(self) -> float:
        """Segment end (exclusive) in seconds."""
        return self.end_frame / self.src_fps

    @property
    def frame_times(self) -> np.ndarray:
        """float32 [T]: time in seconds of each sampled frame."""
        return np.asarray(self.frame_indices, np.float64).astype(np.float32) / np.float32(self.src_fps)


@dataclasses.dataclass
class Clip:
    """A decoded clip.

    Attributes:
      spec: its ClipSpec.
      frames: uint8 [T, H, W, 3] RGB, T = num_frames; frames[0] is the clip's first frame
        (the shot encoder's visual reference).
    """

    spec: ClipSpec
    frames: np.ndarray

    @property
    def first_frame(self) -> np.ndarray:
        """uint8 [H, W, 3]."""
        return self.frames[0]


def resize_center_crop(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Scales an RGB uint8 [h, w, 3] frame to cover (height, width), then center-crops to it.

    Returns uint8 [height, width, 3]. Aspect ratio is kept (no distortion); the excess is cut
    equally from both sides.
    """
    h, w = frame.shape[:2]
    scale = max(height / h, width / w)
    nh, nw = max(height, round(h * scale)), max(width, round(w * scale))
    resized = video.resize_to(frame, nw, nh)
    top, left = (nh - height) // 2, (nw - width) // 2
    return np.ascontiguousarray(resized[top:top + height, left:left + width])


def plan_clips(film_id: str, scenes: list[scenes_lib.Scene], src_fps: float, num_frames: int = 17,
               fps: float = 8.0, clip_seconds: float = 2.0, stride_seconds: float = 0.0) -> list[ClipSpec]:
    """Cuts every scene into `clip_seconds` segments starting every `stride_seconds` (0 = `clip_seconds`:
    back to back, the paper's cut; smaller: overlapping windows) and picks the sampled frames.

    Returns the clips of the film in timestamp order (possibly empty).
    """
    seg = int(round(clip_seconds * src_fps))
    if seg < 1:
        raise ValueError(f"clip_seconds={clip_seconds} is shorter than one frame at {src_fps} fps")
    step = int(round(stride_seconds * src_fps)) if stride_seconds > 0 else seg
    if step < 1:
        raise ValueError(f"stride_seconds={stride_seconds} is shorter than one frame at {src_fps} fps")
    out: list[ClipSpec] = []
    for scene in scenes:
        start = scene.start_frame
        while start + seg <= scene.end_frame:
            idx = tuple(min(start + int(np.floor(i / fps * src_fps + 1e-6)), start + seg - 1)
                        for i in range(num_frames))
            out.append(ClipSpec(film_id, len(out), scene.scene_id, start, start + seg, idx, src_fps))
            start += step
    return out


def plan_film(path: str, film_id: str, data_cfg) -> tuple[list[ClipSpec], list[scenes_lib.Scene], video.VideoInfo]:
    """Pass 1 for one film: scenes and clip plan, using the `data` config section.

    Raises:
      video.VideoError: unreadable / corrupt / empty video (message starts with the path).
      FilmTooShortError: no scene holds a whole clip (message names the path and durations).
    """
    scenes, info = scenes_lib.detect_scenes(path, threshold=float(data_cfg.scene_threshold))
    specs = plan_clips(film_id, scenes, info.fps, int(data_cfg.num_frames), float(data_cfg.fps),
                       float(data_cfg.clip_seconds), float(data_cfg.get("clip_stride_seconds", 0.0)))
    if not specs:
        longest = max(s.num_frames for s in scenes) / info.fps
        raise FilmTooShortError(
            f"{path}: film '{film_id}' yields no clip: {info.num_frames / info.fps:.2f} s in {len(scenes)} "
            f"scene(s), longest scene {longest:.2f} s < clip length {float(data_cfg.clip_seconds):.2f} s")
    return specs, scenes, info


def extract_clips(path: str, specs: list[ClipSpec], height: int, width: int) -> Iterator[Clip]:
    """Pass 2: decodes `path` once and yields the planned clips, in order, as they complete.

    Frames are resize_center_crop'ed to (height, width). Raises video.VideoError if the file cannot be
    decoded, or decodes to fewer frames than pass 1 saw (message names path and clip).
    """
    needed: dict[int, np.ndarray | None] = {i: None for s in specs for i in s.frame_indices}
    pending = list(specs)
    for i, rgb in video.iter_frames(path):
        if i in needed:
            needed[i] = resize_center_crop(rgb, height, width)
        while pending and i >= pending[0].frame_indices[-1]:
            spec = pending.pop(0)
            frames = np.stack([needed[j] for j in spec.frame_indices])
            yield Clip(spec, frames)
            # Drop frames no later clip uses.
            keep = set(j for s in pending for j in s.frame_indices)
            for j in [j for j in needed if needed[j] is not None and j not in keep]:
                del needed[j]
        if not pending:
            return
    if pending:
        raise video.VideoError(f"{path}: stream ended before clip {pending[0].clip_index} of film "
                               f"'{pending[0].film_id}' (needs source frame {pending[0].frame_indices[-1]})")
