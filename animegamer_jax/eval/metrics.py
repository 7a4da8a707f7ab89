"""Table 1 metrics of AnimeGamer (paper §4.2, Table 1; docs/evaluation.md#metrics).

Every metric here works on already-computed embeddings, levels or states (numpy), so it is exact,
cheap and testable on constructed inputs; the networks that make the embeddings (CLIP, see
``animegamer_jax.eval.embedders``) and the motion estimator (``animegamer_jax.data.motion``) are
passed in.

Columns (definitions used here):

- CLIP-I: cosine(CLIP image embedding of a generated frame, CLIP image embedding of the character's
  reference image), mean over the turn's sampled frames and its characters, then over turns.
- CLIP-T: cosine(frame embedding, CLIP text embedding of the movement text), mean over frames, then turns.
- CLIP-T^E: the same against the environment (background) text.
- ACC-F: fraction of turns whose generated clip's re-estimated motion level equals the ground-truth level.
- MAE-F: mean |estimated level - ground-truth level| (levels 1..5).
- ACC-S: fraction of exact matches of the predicted state changes SC, ET, ST vs ground truth, over
  turns x 3 fields.
- MAE-S: mean |predicted - ground truth| over the same entries.
- DreamSim: 1 - DreamSim distance (the paper reports it with "higher is better"; UNCERTAIN), only if a
  DreamSim embedding function is given.

Decisions (UNCERTAIN in the paper, documented):
- The paper maps "detected generated characters" to the references; there is no detector here, so
  CLIP-I compares whole frames with the reference image. Absolute values are therefore lower than a
  detector-cropped score; comparisons between systems on the same benchmark stay meaningful.
- Cosines are raw (no ``100 x`` logit scale, no clipping at 0), which is what the paper's
  0.2-0.9 ranges indicate.
- ACC-S / MAE-S cover the three meters (SC, ET, ST); ML is scored by ACC-F / MAE-F against the
  generated video, as in the paper. :func:`state_metrics` can also score all four fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from animegamer_jax.data import motion  # data/ owns the motion estimator (docs/design.md#who-may-import-whom)

STATE_FIELDS = ("ML", "SC", "ET", "ST")  # order of the MLLM's state output (docs/token_layout.md#state-fields)
METER_FIELDS = ("SC", "ET", "ST")  # the fields ACC-S / MAE-S score
TABLE1_COLUMNS = ("CLIP-I", "DreamSim", "CLIP-T", "CLIP-T^E", "ACC-F", "MAE-F", "ACC-S", "MAE-S", "s/turn")

# frames uint8 [N, H, W, 3] -> float [N, D]
ImageEmbedFn = Callable[[np.ndarray], np.ndarray]
# texts -> float [N, D]
TextEmbedFn = Callable[[Sequence[str]], np.ndarray]


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows of ``x`` ([..., D]) divided by their L2 norm (float64)."""
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarities.

    Args:
      a: float [N, D] (or [D], treated as [1, D]).
      b: float [M, D] (or [D]).

    Returns:
      float64 [N, M] in [-1, 1].

    Raises:
      ValueError: different embedding widths.
    """
    a = np.atleast_2d(np.asarray(a))
    b = np.atleast_2d(np.asarray(b))
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"embedding widths differ: {a.shape} vs {b.shape}")
    return l2_normalize(a) @ l2_normalize(b).T


def clip_i(frame_embeds: np.ndarray, reference_embeds: np.ndarray) -> float:
    """CLIP-I of one turn: mean cosine between every sampled frame and every reference image.

    Args:
      frame_embeds: float [T, D], CLIP image embeddings of the generated frames.
      reference_embeds: float [R, D] (or [D]), embeddings of the turn's characters' references.
    """
    return float(cosine_matrix(frame_embeds, reference_embeds).mean())


def clip_t(frame_embeds: np.ndarray, text_embed: np.ndarray) -> float:
    """CLIP-T (or CLIP-T^E) of one turn: mean cosine between the frames and one text.

    Args:
      frame_embeds: float [T, D] image embeddings; text_embed: float [D] (or [1, D]) text embedding.
    """
    return float(cosine_matrix(frame_embeds, text_embed).mean())


def level_metrics(predicted: Sequence[int], target: Sequence[int]) -> tuple[float, float]:
    """Accuracy and mean absolute error of integer levels (ACC-F / MAE-F).

    Args:
      predicted, target: int sequences of equal length >= 1 (motion levels 1..5).

    Returns:
      (accuracy in [0, 1], MAE in levels).

    Raises:
      ValueError: empty inputs or different lengths.
    """
    p = np.asarray(predicted, np.int64).reshape(-1)
    t = np.asarray(target, np.int64).reshape(-1)
    if p.size == 0 or p.shape != t.shape:
        raise ValueError(f"need equal non-empty level lists, got {p.shape} and {t.shape}")
    return float(np.mean(p == t)), float(np.mean(np.abs(p - t)))


def state_metrics(predicted: np.ndarray, target: np.ndarray,
                  fields: Sequence[str] = METER_FIELDS) -> tuple[float, float]:
    """ACC-S and MAE-S of state changes.

    Args:
      predicted, target: int [N, 4] in :data:`STATE_FIELDS` order (ML, SC, ET, ST), values as the
        MLLM emits them (SC/ET/ST in -5..5).
      fields: which fields to score (default SC, ET, ST).

    Returns:
      (fraction of exactly matching entries, mean absolute error) over N x len(fields) entries.

    Raises:
      ValueError: wrong shapes or an unknown field name.
    """
    p = np.asarray(predicted, np.int64)
    t = np.asarray(target, np.int64)
    if p.ndim != 2 or p.shape[1] != len(STATE_FIELDS) or p.shape != t.shape or p.shape[0] == 0:
        raise ValueError(f"states must both be int [N>0, 4] (ML, SC, ET, ST), got {p.shape} and {t.shape}")
    unknown = [f for f in fields if f not in STATE_FIELDS]
    if unknown:
        raise ValueError(f"unknown state field(s) {unknown}; known: {STATE_FIELDS}")
    cols = [STATE_FIELDS.index(f) for f in fields]
    return level_metrics(p[:, cols], t[:, cols])


def field_accuracy(predicted: np.ndarray, target: np.ndarray) -> dict[str, dict[str, float | int]]:
    """Per-field exact-match accuracy of predicted states against the majority-class baseline.

    Args:
      predicted, target: int [N, 4] in :data:`STATE_FIELDS` order (ML, SC, ET, ST).

    Returns:
      ``{field: {"acc": fraction correct, "majority": fraction of targets equal to the field's most
      frequent target value, "majority_class": that value}}``. The baseline is the best constant
      predictor on these very targets (an upper bound of a training-set majority predictor), so
      "acc > majority" means the states follow the input, not the label prior.

    Raises:
      ValueError: wrong shapes.
    """
    p = np.asarray(predicted, np.int64)
    t = np.asarray(target, np.int64)
    if p.ndim != 2 or p.shape[1] != len(STATE_FIELDS) or p.shape != t.shape or p.shape[0] == 0:
        raise ValueError(f"states must both be int [N>0, 4] (ML, SC, ET, ST), got {p.shape} and {t.shape}")
    out = {}
    for i, name in enumerate(STATE_FIELDS):
        values, counts = np.unique(t[:, i], return_counts=True)
        k = int(np.argmax(counts))  # ties: the smallest value
        out[name] = {"acc": float(np.mean(p[:, i] == t[:, i])), "majority": float(counts[k] / t.shape[0]),
                     "majority_class": int(values[k])}
    return out


def sample_frame_indices(num_frames: int, count: int) -> np.ndarray:
    """``count`` evenly spaced frame indices of a ``num_frames`` clip (all of them if count <= 0 or >= T)."""
    if count <= 0 or count >= num_frames:
        return np.arange(num_frames)
    return np.round(np.linspace(0, num_frames - 1, count)).astype(np.int64)


def estimate_motion_level(frames: np.ndarray, bins: Sequence[float], r: float = 0.2,
                          scope_fn: Callable[..., float] | None = None) -> int:
    """Re-estimates the motion level of a generated clip with the data pipeline's estimator.

    Args:
      frames: uint8 [T, H, W, 3], T >= 2.
      bins: ascending motion-scope bin edges (``config.data.motion_bins``).
      r: relative background threshold (``config.data.flow_threshold``).
      scope_fn: ``(frames, r=...) -> float``; default ``animegamer_jax.data.motion.motion_scope``.

    Returns:
      level in 1..len(bins)+1.
    """
    fn = scope_fn or motion.motion_scope
    return motion.motion_level(fn(frames, r=r), bins)


@dataclasses.dataclass
class ScoredTurn:
    """What one generated turn contributes to the metrics.

    Attributes:
      frames: uint8 [T, H, W, 3] generated video frames.
      motion_text: the movement text (CLIP-T prompt).
      background_text: the environment text (CLIP-T^E prompt).
      characters: names of the characters whose references CLIP-I uses.
      predicted_states: int [4] (ML, SC, ET, ST) the system predicted.
      target_states: int [4] ground truth.
      seconds: wall time of the turn (excluding compilation), or None.
    """

    frames: np.ndarray
    motion_text: str
    background_text: str
    characters: tuple[str, ...]
    predicted_states: np.ndarray
    target_states: np.ndarray
    seconds: float | None = None


def evaluate_turns(turns: Sequence[ScoredTurn], *, image_embed: ImageEmbedFn, text_embed: TextEmbedFn,
                   references: dict[str, np.ndarray], motion_bins: Sequence[float],
                   flow_threshold: float = 0.2, clip_frames: int = 8,
                   scope_fn: Callable[..., float] | None = None,
                   dreamsim_embed: ImageEmbedFn | None = None) -> dict[str, float | None]:
    """Computes the Table 1 columns over a list of generated turns.

    Args:
      turns: the generated turns (any number of games, flattened).
      image_embed: frames uint8 [N, H, W, 3] -> float [N, D] (e.g. CLIP image embeddings).
      text_embed: list of N strings -> float [N, D] (CLIP text embeddings, same space).
      references: character name -> uint8 [H, W, 3] reference image.
      motion_bins: bin edges for the re-estimated motion level.
      flow_threshold: r of the motion estimator.
      clip_frames: frames per turn fed to CLIP (evenly spaced; <= 0: all).
      scope_fn: motion-scope estimator override (tests); default the data pipeline's.
      dreamsim_embed: optional DreamSim embedding function; DreamSim = 1 - cosine distance.

    Returns:
      dict with keys :data:`TABLE1_COLUMNS` (None where not computable, e.g. DreamSim without
      weights or s/turn without timings) plus ``"turns"``.

    Raises:
      KeyError: a turn names a character without a reference image.
    """
    if not turns:
        raise ValueError("no turns to evaluate")
    names = sorted({c for t in turns for c in t.characters})
    missing = [n for n in names if n not in references]
    if missing:
        raise KeyError(f"no reference image for character(s) {missing}; known: {sorted(references)}")
    ref_emb = dict(zip(names, np.asarray(image_embed(np.stack([references[n] for n in names])))))
    ds_ref = (dict(zip(names, np.asarray(dreamsim_embed(np.stack([references[n] for n in names])))))
              if dreamsim_embed is not None else None)

    texts = sorted({t.motion_text for t in turns} | {t.background_text for t in turns})
    text_emb = dict(zip(texts, np.asarray(text_embed(texts))))

    ci, ct, cte, ds, est, gt_ml = [], [], [], [], [], []
    for t in turns:
        frames = np.asarray(t.frames)
        sel = frames[sample_frame_indices(frames.shape[0], clip_frames)]
        f_emb = np.asarray(image_embed(sel))
        refs = np.stack([ref_emb[c] for c in t.characters])
        ci.append(clip_i(f_emb, refs))
        ct.append(clip_t(f_emb, text_emb[t.motion_text]))
        cte.append(clip_t(f_emb, text_emb[t.background_text]))
        if dreamsim_embed is not None:
            d_emb = np.asarray(dreamsim_embed(sel))
            ds.append(clip_i(d_emb, np.stack([ds_ref[c] for c in t.characters])))
        est.append(estimate_motion_level(frames, motion_bins, flow_threshold, scope_fn))
        gt_ml.append(int(np.asarray(t.target_states)[0]))
    acc_f, mae_f = level_metrics(est, gt_ml)
    acc_s, mae_s = state_metrics(np.stack([t.predicted_states for t in turns]),
                                 np.stack([t.target_states for t in turns]))
    per_field = field_accuracy(np.stack([t.predicted_states for t in turns]),
                               np.stack([t.target_states for t in turns]))
    secs = [t.seconds for t in turns if t.seconds is not None]
    return {
        "CLIP-I": float(np.mean(ci)),
        # DreamSim distance is 1 - cosine of its embeddings, so 1 - distance is the mean cosine.
        "DreamSim": float(np.mean(ds)) if ds else None,
        "CLIP-T": float(np.mean(ct)),
        "CLIP-T^E": float(np.mean(cte)),
        "ACC-F": acc_f,
        "MAE-F": mae_f,
        "ACC-S": acc_s,
        "MAE-S": mae_s,
        "s/turn": float(np.mean(secs)) if secs else None,
        "turns": len(turns),
        # per state field: accuracy, and the majority-class baseline's accuracy and class
        **{f"ACC-{k}": v["acc"] for k, v in per_field.items()},
        **{f"majority-{k}": v["majority"] for k, v in per_field.items()},
        **{f"majority-class-{k}": v["majority_class"] for k, v in per_field.items()},
    }
