"""Scene-cut detection with PySceneDetect's ContentDetector (paper Sec. 3.3 / Appendix B: films are
split at scene cuts before the fixed 2 s segmentation).

We feed PySceneDetect frames decoded by our own PyAV reader (downscaled for speed), so scene boundaries
are frame indices in the same time base as `video.iter_frames` and `clips.plan_clips`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scenedetect import ContentDetector, FrameTimecode

from animegamer_jax.data import video


@dataclasses.dataclass(frozen=True)
class Scene:
    """One shot: frames [start_frame, end_frame) of a film (frame indices at the film's fps)."""

    scene_id: int
    start_frame: int
    end_frame: int

    @property
    def num_frames(self) -> int:
        return self.end_frame - self.start_frame


def detect_scenes(path: str, threshold: float = 27.0, min_scene_frames: int = 15,
                  analysis_width: int = 256) -> tuple[list[Scene], video.VideoInfo]:
    """Finds the shots of a film.

    Args:
      path: video file.
      threshold: ContentDetector threshold (HSV content change score; PySceneDetect default 27).
      min_scene_frames: shortest shot in frames (PySceneDetect default 15).
      analysis_width: frames are downscaled to this width (aspect kept) before scoring.

    Returns:
      (scenes covering [0, num_decoded_frames) in order, video info with num_frames set to the decoded count).

    Raises:
      video.VideoError: unreadable / corrupt / empty video.
    """
    info = video.probe(path)
    height = max(2, round(info.height * analysis_width / info.width))
    detector = ContentDetector(threshold=threshold, min_scene_len=min_scene_frames)
    cuts: list[int] = []
    n = 0
    last_tc = None
    for i, rgb in video.iter_frames(path, (analysis_width, height)):
        last_tc = FrameTimecode(i, info.fps)
        # PySceneDetect expects OpenCV's BGR channel order.
        for tc in detector.process_frame(last_tc, np.ascontiguousarray(rgb[..., ::-1])):
            cuts.append(int(tc.frame_num))
        n = i + 1
    if last_tc is not None and hasattr(detector, "post_process"):
        for tc in detector.post_process(last_tc) or []:
            cuts.append(int(tc.frame_num))
    bounds = [0] + sorted(c for c in set(cuts) if 0 < c < n) + [n]
    scenes = [Scene(k, a, b) for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return scenes, dataclasses.replace(info, num_frames=n)
