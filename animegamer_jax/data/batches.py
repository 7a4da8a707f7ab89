"""Host-side batches of the training phases: loader examples -> model-ready numpy batches.

:class:`BatchBuilder` turns the batches of ``data.loader.make_loader`` ("clips" mode for the kinds
"vae", "frames", "decoder", "reference"; "turns" mode for "turns", "turns_clip") into what the losses
(train/losses.py) read; each training phase names its kind (``train.phases``; eval.decoder and
eval.representation build phase a's E_a inputs with the "decoder" kind too). The kinds
(:data:`BATCH_KINDS`), with the phases that use them:

  vae (vae):         frames f32 [B * n, T, H, W, 3] in [-1, 1]: random windows of the clips
                     (:func:`vae_windows`) at the curriculum stage of the step (:func:`vae_stage`).
  decoder (a1, a2, d): t5_ids int32 [B, Lt], first_frame f32 [B, H, W, 3] in [-1, 1], flow f32 [B],
                     and frames f32 [B, T, H, W, 3] in [-1, 1] (VAE-encoded in the step) or latents
                     f32 [B, t, C, h, w] (already scaled; ``train.encode_latents=False``);
                     with ``train.precomputed_features`` f_md [B, Lt, Dt] / f_v [B, P, Dv] replace
                     t5_ids / first_frame (the frozen encoders then stay out of the step).
  turns (b):         input_ids, cmp_mask, gen_mask, labels, padding_mask, turn_ids [B, L] (``mllm.collate``;
                     turn_ids feed the ``mllm.history_attention="turn_window"`` mask),
                     turn_t5_ids int32 [B, M, Lt], turn_first_frame f32 [B, M, H, W, 3],
                     target_turn int32 [B], history_turns int32 [B, W-1] (slot -> turn index)
                     (or precomputed turn_f_md [B, M, Lt, Dt] / turn_f_v [B, M, P, Dv], from the turns
                     loader's per-turn f_md / f_v: a dataset's feature fields named f_md / f_v serve
                     a1/a2 and b/c alike; fields named turn_f_md / turn_f_v serve b/c only);
  turns_clip (c):    the turns batch plus flow [B] and frames / latents of the target turn.
  frames (preview):  frames f32 [B, T, H, W, 3] in [-1, 1] (the whole clips; the frozen VAE encodes them
                     and its decoder makes the target).
  reference (r):     the decoder batch plus reference_frame uint8 [B, H, W, 3], each clip's reference
                     image (:func:`pick_reference_frames`; VAE-encoded in the step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from animegamer_jax.io import fileio

from animegamer_jax.tokenizers import mllm_tokenizer

from animegamer_jax.io import paths

from animegamer_jax.tokenizers import t5_tokenizer

from animegamer_jax.io import media
from animegamer_jax.data import datasets, references, video
from animegamer_jax.models.cogvideox.dit import flow_value
from animegamer_jax.models.mistral import mllm

#: the batch kinds :class:`BatchBuilder` builds (module docstring)
BATCH_KINDS: tuple[str, ...] = ("vae", "frames", "decoder", "reference", "turns", "turns_clip")


def flow_values(motion_level: np.ndarray, flow_table: Sequence[float]) -> np.ndarray:
    """Motion level -> flow value on the host: play's rule (``models.cogvideox.dit.flow_value``,
    docs/dit.md#motion-level-to-flow) in numpy; float32 of ``motion_level``'s shape."""
    return flow_value(motion_level, tuple(flow_table), xp=np)


def _strs(x: Any) -> list[str]:
    """A str / bytes array of any shape as a flat list of str."""
    return [s.decode() if isinstance(s, bytes) else str(s) for s in np.asarray(x).reshape(-1)]


def vae_stage(curriculum: Any, step: int) -> tuple[int, int, int]:
    """(frames, height, width) of the "vae" phase's batches at ``step``.

    ``curriculum`` is ``((from_step, frames, height, width), ...)`` with increasing ``from_step``, the
    first 0 (``train.vae_curriculum``; e.g. single frames first, then short clips, then full size).

    Raises:
      ValueError: an empty curriculum, a first stage not at step 0, or non-increasing steps.
    """
    stages = [tuple(int(v) for v in s) for s in curriculum]
    if not stages or stages[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(stages, stages[1:])):
        raise ValueError(f"train.vae_curriculum {curriculum!r} must be ((0, T, H, W), (step, T, H, W), ...) "
                         f"with increasing steps")
    cur = stages[0]
    for s in stages:
        if step >= s[0]:
            cur = s
    return cur[1], cur[2], cur[3]


def vae_windows(frames: np.ndarray, num_frames: int, height: int, width: int, rng: np.random.Generator,
                max_windows: int = 4, max_scale: float = 1.0) -> np.ndarray:
    """Random training windows of clips for the "vae" phase: uint8 [B, T, H, W, 3] ->
    [B * n, num_frames, height, width, 3], n = min(max_windows, T // num_frames) windows per clip, each
    at a random start frame and spatial crop, mirrored left-right with probability 1/2.

    ``max_scale`` > 1 makes the crops multi-scale (``train.vae_max_crop_scale``): each window's crop is
    ``s * (height, width)`` with ``s`` uniform in ``[1, min(max_scale, H / height, W / width)]``,
    area-resized to ``(height, width)`` (``data.video.resize_to``). On clips stored at twice the model
    size, ``s = 2`` is a whole frame as the model sees it and ``s = 1`` a quarter of it at full detail,
    so a few clips give many distinct images (the "random resized crop" of image autoencoders).
    ``max_scale = 1`` takes plain crops (no resize, no scale draw).

    Raises:
      ValueError: a window larger than the clips, or ``max_scale`` < 1.
    """
    b, t, h, w = frames.shape[:4]
    if num_frames > t or height > h or width > w:
        raise ValueError(f"vae window {num_frames}x{height}x{width} is larger than the clips {t}x{h}x{w}")
    if max_scale < 1.0:
        raise ValueError(f"train.vae_max_crop_scale={max_scale} must be >= 1")
    top = min(float(max_scale), h / height, w / width)
    n = max(1, min(int(max_windows), t // num_frames))
    out = []
    for i in range(b):
        for _ in range(n):
            s = 1.0 if top <= 1.0 else float(rng.uniform(1.0, top))
            ch, cw = min(h, int(round(height * s))), min(w, int(round(width * s)))
            t0, y0, x0 = (int(rng.integers(0, d + 1)) for d in (t - num_frames, h - ch, w - cw))
            win = frames[i, t0:t0 + num_frames, y0:y0 + ch, x0:x0 + cw]
            if (ch, cw) != (height, width):
                win = np.stack([video.resize_to(np.ascontiguousarray(f), width, height) for f in win])
            out.append(win[:, :, ::-1] if rng.random() < 0.5 else win)
    return np.ascontiguousarray(np.stack(out))


def pick_reference_frames(records: Mapping[str, Any]) -> np.ndarray:
    """Each clip's reference image for phase r: uint8 [B, H, W, 3] from a clips batch of the loader
    (``first_frame`` [B, H, W, 3] or ``frames`` [B, T, H, W, 3]; optional ``characters`` [B] str).

    Clip i's reference is the first frame of another clip of the batch: the next one (cyclically,
    i+1, i+2, ...) whose ``characters`` label equals clip i's when the records carry labels and one
    matches, else the next clip (i+1 mod B). A batch of one clip gets its own first frame. This is
    the fallback of :func:`mined_reference_frames` (clips without character labels) and the pairing
    of batches a caller hands in without a dataset.

    Raises:
      KeyError: records with neither ``first_frame`` nor ``frames`` (a clips loader with frames).
    """
    if "first_frame" in records:
        first = np.asarray(records["first_frame"])
    elif "frames" in records:
        first = np.asarray(records["frames"])[:, 0]
    else:
        raise KeyError("phase r needs each clip's first frame: build the batch with data.loader's clips mode "
                       "with frames (first_frame / frames), not latents or features only")
    b = first.shape[0]
    labels = _strs(records["characters"]) if "characters" in records else None
    pick = []
    for i in range(b):
        others = [(i + k) % b for k in range(1, b)]
        same = [j for j in others if labels is not None and labels[i] and labels[j] == labels[i]]
        pick.append(same[0] if same else others[0] if others else i)
    return np.ascontiguousarray(first[pick].astype(np.uint8))


def mined_reference_frames(dataset_dir: str, split: str = "train", seed: int = 0):
    """Phase r's ``records -> uint8 [B, H, W, 3]`` from the dataset-wide mined pairs: record i's reference
    is the first frame of the clip ``references.dataset_references`` picks for it (another clip of the same
    character, from another scene wherever the character has one), read from the split by the records'
    ``index`` (int [B], the record index the clips loader adds). A record without a mined reference (its
    clip shows nobody, or is its character's only clip) gets its own first frame.

    Returns ``(fn, how)``: ``how`` is "mined" or, where the dataset's clips carry no character labels (its
    labels file is gone, or no clip names a character), "within-batch" with ``fn`` =
    :func:`pick_reference_frames`.

    Raises:
      datasets.DatasetError: no prepared dataset at ``dataset_dir``; ValueError: a clip without a label
        in its labels file (labels of another preparation).
    """
    try:
        refs = references.dataset_references(dataset_dir, split, seed=seed)
    except FileNotFoundError:
        return pick_reference_frames, "within-batch"
    if not (refs >= 0).any():
        return pick_reference_frames, "within-batch"
    source = datasets.open_split(dataset_dir, split)

    def fn(records: Mapping[str, Any]) -> np.ndarray:
        if "index" not in records:
            raise KeyError("phase r's mined references need each record's dataset 'index' (data.loader's clips "
                           "mode adds it)")
        idx = np.asarray(records["index"]).reshape(-1)
        return np.ascontiguousarray(references.reference_frames(source, refs, idx).astype(np.uint8))

    return fn, "mined"


class BatchBuilder:
    """Turns loader batches (``data.loader.make_loader`` "clips" / "turns" modes) into model-ready
    batches (module docstring).

    Args:
      config: full config (tokenizer paths, lengths, flow table, ``train.vae_curriculum``).
      kind: one of :data:`BATCH_KINDS` (a training phase's ``batch``, ``train.phases``).
      reference_frames: the "reference" kind's ``records -> uint8 [B, H, W, 3]`` (default
        :func:`pick_reference_frames`).

    ``__call__(ex, step)``: the step picks the "vae" curriculum stage and seeds its random windows
    (``default_rng([seed, step])``), so a resumed run builds the same batches as an uninterrupted one.

    Raises:
      ValueError: an unknown ``kind``, or a malformed ``train.vae_curriculum`` (kind "vae").
      FileNotFoundError: ``config.t5.spiece_model`` missing (kinds other than "vae" and "frames").
    """

    def __init__(self, config: ml_collections.ConfigDict, kind: str, reference_frames: Any = None):
        if kind not in BATCH_KINDS:
            raise ValueError(f"unknown batch kind {kind!r}; use one of {', '.join(BATCH_KINDS)} "
                             f"(a training phase's batch: train.phases)")
        self.config, self.kind = config, kind
        self.reference_frames = reference_frames or pick_reference_frames
        if kind == "vae":
            vae_stage(config.train.vae_curriculum, 0)  # fail early on a malformed curriculum
            self.t5_tok = self.tok = None
            return
        if kind == "frames":  # frames only (no text): the VAE encodes them, its decoder is the target
            self.t5_tok = self.tok = None
            return
        spiece = paths.resource(config.t5.spiece_model)
        if not spiece or not fileio.exists(spiece):
            raise FileNotFoundError(f"config.t5.spiece_model {spiece!r} not found (the T5 spiece.model shipped "
                                    f"with the T5 weights)")
        self.t5_tok = t5_tokenizer.T5Tokenizer(spiece, max_length=int(config.t5.max_length))
        self.tok = mllm_tokenizer.get_tokenizer() if kind in ("turns", "turns_clip") else None

    def __call__(self, ex: Mapping[str, Any], step: int = 0) -> dict[str, np.ndarray]:
        if self.kind == "vae":
            return self.vae_batch(ex, step)
        if self.kind == "frames":
            return {"frames": media.from_uint8(ex["frames"])}
        if self.kind == "decoder":
            return self.decoder_batch(ex)
        if self.kind == "reference":
            return {**self.decoder_batch(ex), "reference_frame": self.reference_frames(ex)}
        return self.mllm_batch(ex)

    def vae_batch(self, ex: Mapping[str, Any], step: int) -> dict[str, np.ndarray]:
        t, h, w = vae_stage(self.config.train.vae_curriculum, step)
        rng = np.random.default_rng([int(self.config.seed), int(step)])
        windows = vae_windows(np.asarray(ex["frames"]), t, h, w, rng, int(self.config.train.vae_windows_per_clip),
                              float(self.config.train.get("vae_max_crop_scale", 1.0)))
        return {"frames": media.from_uint8(windows)}

    def decoder_batch(self, ex: Mapping[str, Any]) -> dict[str, np.ndarray]:
        out = {"flow": flow_values(ex["motion_level"], self.config.dit.flow_table)}
        if "f_md" in ex:  # precomputed T5 / CLIP features
            out["f_md"], out["f_v"] = np.asarray(ex["f_md"], np.float32), np.asarray(ex["f_v"], np.float32)
        else:
            out["t5_ids"] = self.t5_tok(_strs(ex["action"]))
            out["first_frame"] = media.from_uint8(ex["first_frame"])
        if "latents" in ex:
            out["latents"] = np.asarray(ex["latents"], np.float32)
        else:
            out["frames"] = media.from_uint8(ex["frames"])
        return out

    def mllm_batch(self, ex: Mapping[str, Any]) -> dict[str, np.ndarray]:
        cfg = self.config
        w = int(cfg.mllm.history_window)
        q = mllm.num_queries(cfg)
        num_turns = np.asarray(ex["num_turns"]).astype(np.int64)
        b, m = np.asarray(ex["states"]).shape[:2]
        instr = np.asarray(ex["instruction"]).reshape(b, m)
        seqs, target, hist = [], np.zeros(b, np.int32), np.zeros((b, max(w - 1, 1)), np.int32)
        for i in range(b):
            n = int(num_turns[i])
            states = np.asarray(ex["states"][i])
            seqs.append(mllm.build_sequence(self.tok, _strs(instr[i, :n]), [list(s) for s in states[:n - 1]],
                                            num_queries=q, history_window=w, target_states=list(states[n - 1])))
            target[i] = n - 1
            first = max(0, n - 1 - (w - 1))
            idx = list(range(first, n - 1))
            hist[i, :len(idx)] = idx
        out = mllm.collate(seqs, pad_to=int(cfg.train.max_seq_len))
        # Precomputed T5 / CLIP features per turn: the turns loader returns a dataset's per-clip feature
        # fields under their own names (f_md / f_v, the ones a1/a2 read in clips mode), [B, M, ...]
        feat = next((p for p in ("turn_", "") if p + "f_md" in ex or p + "f_v" in ex), None)
        if feat is not None:
            if feat + "f_md" not in ex or feat + "f_v" not in ex:
                have, lack = (feat + "f_md", feat + "f_v") if feat + "f_md" in ex else (feat + "f_v", feat + "f_md")
                raise KeyError(f"a turns example with stored feature {have!r} but not {lack!r}: a dataset stores "
                               f"both T5 (f_md) and CLIP (f_v) features or neither (data/prepare.py feature_fn)")
            out["turn_f_md"] = np.asarray(ex[feat + "f_md"], np.float32)
            out["turn_f_v"] = np.asarray(ex[feat + "f_v"], np.float32)
        else:
            # E_a's T5 input is the action text in every phase (a1/a2 train it on it); the whole
            # instruction would make targets that the decoder never saw
            if "action" not in ex:
                raise KeyError("a turns example without 'action' (each turn's action text, E_a's T5 input): "
                               "build it with data.loader's turns mode (SampleTurns), which carries it")
            actions = np.asarray(ex["action"]).reshape(b, m)
            out["turn_t5_ids"] = self.t5_tok([s for row in actions for s in _strs(row)]).reshape(b, m, -1)
            out["turn_first_frame"] = media.from_uint8(ex["first_frame"])
        out["target_turn"], out["history_turns"] = target, hist
        if self.kind == "turns_clip":
            levels = np.asarray(ex["motion_level"]) if "motion_level" in ex else np.asarray(ex["states"])[..., 0]
            levels = levels.reshape(b, m)
            out["flow"] = flow_values(levels[np.arange(b), target], cfg.dit.flow_table)
            if "latents" in ex:
                out["latents"] = np.asarray(ex["latents"], np.float32)[np.arange(b), target]
            else:
                out["frames"] = media.from_uint8(np.asarray(ex["frames"])[np.arange(b), target])
        return out
