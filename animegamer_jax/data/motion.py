"""Motion scope of a clip and its 5-level quantization (paper Sec. 3.3; docs/data.md#motion-scope).

Paper: MemFlow optical flow per frame, absolute values, background removed with threshold r = 0.2,
mean of the rest = the shot's motion scope, quantized to 5 levels (ML 1..5).

Substitutions and decisions (documented here; evaluation's ACC-F / MAE-F reuse this estimator):
- Flow: MemFlow (a learned flow network) is not available here; we use OpenCV's DIS optical flow
  (`DISOpticalFlow`, MEDIUM preset) on grayscale frames, between consecutive sampled frames
  (8 fps at the default config). DIS is deterministic on CPU for a given OpenCV build.
- "Absolute value": the per-pixel flow magnitude sqrt(u^2 + v^2), in pixels per sampled frame.
- Resolution: magnitudes are multiplied by `reference_height / H` (default 480), so the scope is
  "pixels per sampled frame at 480-pixel height" at any clip size and one set of bin edges serves the
  full-size and tiny configs.
- r = 0.2 is RELATIVE: in every frame pair, pixels with magnitude < r * (that pair's maximum magnitude)
  are background and dropped. An absolute 0.2 px threshold would only drop sub-pixel noise and keep
  all of a panning or static background, so it would not separate the moving character; the
  relative rule keeps the fastest-moving region (usually the character) and the scope reads as
  "how fast the moving part moves". A pair with no motion at all (max = 0) scores 0.
- Scope = mean over frame pairs of the per-pair mean over kept pixels.
- Levels: level = 1 + number of bin edges <= scope (edges ascending, 4 edges -> levels 1..5).
  The paper gives no edges. Default edges (config.data.motion_bins = (1.118, 5.0, 12.247, 24.495)):
  the geometric midpoints between the release's per-level representative flow values
  (inference_Decoder.py `cuculate_level`: 0.5, 2.5, 10, 15, 40; docs/dit.md#motion-level-to-flow), i.e. a
  scope is given the level whose representative value is nearest in log scale. Those values are what
  the decoder's flow embedding sees per level at inference, so training clips binned this way carry
  consistent conditioning. On the sample footage (prepared at 480x720) this spreads the 7 clips over
  levels 2..5; a still shot scores ~0 (level 1). For a real corpus, `derive_bins` returns the 20/40/60/80 %
  quantiles of its scopes (equal-count levels); `python -m animegamer_jax.commands.data prepare` prints them
  after a build so a user can copy them into `config.data.motion_bins`.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

REFERENCE_HEIGHT = 480


def _gray(frame: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_RGB2GRAY)


def flow_magnitudes(frames: np.ndarray) -> np.ndarray:
    """Dense DIS optical-flow magnitude between consecutive frames.

    Args:
      frames: uint8 [T, H, W, 3] RGB, T >= 2.

    Returns:
      float32 [T-1, H, W]: |flow| in pixels (at the frames' own resolution).
    """
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}")
    if frames.shape[0] < 2:
        raise ValueError(f"need at least 2 frames for optical flow, got {frames.shape[0]}")
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM)
    grays = [_gray(f) for f in frames]
    mags = []
    for a, b in zip(grays[:-1], grays[1:]):
        flow = dis.calc(a, b, None)
        mags.append(np.sqrt(flow[..., 0] ** 2 + flow[..., 1] ** 2))
    return np.stack(mags).astype(np.float32)


def motion_scope(frames: np.ndarray, r: float = 0.2, reference_height: int = REFERENCE_HEIGHT) -> float:
    """Motion scope f_ms of a clip (see the module docstring for the exact rule).

    Args:
      frames: uint8 [T, H, W, 3] RGB clip frames in time order (T >= 2).
      r: relative background threshold (fraction of each pair's max magnitude).
      reference_height: magnitudes are rescaled to this frame height.

    Returns:
      Motion scope in pixels per frame step at `reference_height` (float >= 0).
    """
    mags = flow_magnitudes(frames) * np.float32(reference_height / frames.shape[1])
    per_pair = []
    for m in mags:
        top = float(m.max())
        if top <= 0.0:
            per_pair.append(0.0)
            continue
        per_pair.append(float(m[m >= r * top].mean()))
    return float(np.mean(per_pair))


def motion_level(scope: float, bins: Sequence[float]) -> int:
    """Quantizes a motion scope to a level 1..len(bins)+1 (1..5 with 4 edges).

    Args:
      scope: motion scope (motion_scope's units).
      bins: ascending bin edges; a scope equal to an edge goes to the upper level.
    """
    edges = np.asarray(bins, np.float64)
    if edges.ndim != 1 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"motion bins must be strictly ascending, got {tuple(bins)}")
    return int(np.searchsorted(edges, scope, side="right")) + 1


def derive_bins(scopes: Sequence[float], num_levels: int = 5) -> tuple[float, ...]:
    """Equal-count bin edges: the k/num_levels quantiles (k = 1..num_levels-1) of a dataset's scopes.

    Edges are made strictly ascending (a tiny step is added to ties) so motion_level accepts them.
    """
    qs = np.quantile(np.asarray(scopes, np.float64), np.arange(1, num_levels) / num_levels)
    edges = [float(qs[0])]
    for q in qs[1:]:
        edges.append(max(float(q), edges[-1] + 1e-6))
    return tuple(round(e, 6) for e in edges)
