"""Host-side batches of the training phases: loader examples -> model-ready numpy batches.

Each batch kind is a record (:class:`BatchKind`, one per kind, :data:`KINDS`): the ``data.loader`` mode
that feeds it ("clips" or "turns"), and its groups of fields (:class:`Fields`), each building its
arrays (``build``) beside their shapes (``spec``, what ``aot.programs`` compiles against).
:class:`BatchBuilder` holds a kind's tools (tokenizers) and builds its batches; each training phase
names its kind (``train.phases``; eval.decoder and eval.representation build phase a's E_a inputs with
the "decoder" kind too). The kinds, with the phases that use them:

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

import dataclasses
from collections.abc import Callable, Mapping, Sequence
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



#: a batch's fields as shapes: ``{field: (shape, numpy dtype)}``
Shapes = dict[str, tuple[tuple[int, ...], Any]]


def _none(config: ml_collections.ConfigDict) -> dict[str, Any]:
    return {}


def _no_note(config: ml_collections.ConfigDict) -> str:
    return ""


@dataclasses.dataclass(frozen=True)
class Fields:
    """One group of a batch kind's fields, built and shaped side by side.

    Attributes:
      build: ``(records, builder, step) -> {field: array}`` from a loader batch of B records
        (``builder``: the :class:`BatchBuilder`, holding the config, the tools and ``reference_frames``).
      spec: ``(config, n) -> Shapes`` of the fields of n records, as ``build`` makes them.
      setup: ``config -> {name: tool}``, what ``build`` reads from ``builder.tools`` (tokenizers), made
        once by :class:`BatchBuilder`; it raises on a config that cannot build the fields.
      note: ``config -> str``, the inputs in words for the compile tool's table ("" for none).
    """

    build: Callable[[Mapping[str, Any], BatchBuilder, int], dict[str, np.ndarray]]
    spec: Callable[[ml_collections.ConfigDict, int], Shapes]
    setup: Callable[[ml_collections.ConfigDict], dict[str, Any]] = _none
    note: Callable[[ml_collections.ConfigDict], str] = _no_note


@dataclasses.dataclass(frozen=True)
class BatchKind:
    """One kind of host batch (module docstring): which loader mode feeds it and its groups of fields.

    Attributes:
      name: the kind's name (:data:`KINDS`).
      loader: the ``data.loader`` mode of its records ("clips" or "turns").
      fields: its :class:`Fields`, in build order.
      clip_target: its batches carry a target clip, frames (VAE-encoded in the step with
        ``train.encode_latents``) or latents.
      settings: ``config -> {name: value}``, the settings its batches depend on that a resume must agree
        on (``train.pipeline.run_meta``).
      dataset_key: the ``config.train`` field naming its own prepared dataset when set (else
        ``config.data.dataset_dir``).
    """

    name: str
    loader: str
    fields: tuple[Fields, ...]
    clip_target: bool = False
    settings: Callable[[ml_collections.ConfigDict], dict[str, Any]] = _none
    dataset_key: str = ""

    def build(self, records: Mapping[str, Any], builder: BatchBuilder, step: int = 0) -> dict[str, np.ndarray]:
        """The model batch of a loader batch: every group's fields (``builder`` holds the config and tools)."""
        out: dict[str, np.ndarray] = {}
        for f in self.fields:
            out.update(f.build(records, builder, step))
        return out

    def spec(self, config: ml_collections.ConfigDict, n: int) -> Shapes:
        """Shapes and dtypes of a batch of ``n`` records as :meth:`build` makes it under ``config``
        (``vae``: the curriculum's last, largest stage; its windows are rows)."""
        out: Shapes = {}
        for f in self.fields:
            out.update(f.spec(config, n))
        return out

    def note(self, config: ml_collections.ConfigDict) -> str:
        """Its inputs in words ("T5/CLIP in the step, VAE-encoded frames", "frames", ...)."""
        return ", ".join(w for w in (f.note(config) for f in self.fields) if w)


class BatchBuilder:
    """Turns loader batches (``data.loader.make_loader`` "clips" / "turns" modes) into model-ready
    batches of one :class:`BatchKind`.

    Args:
      config: full config (tokenizer paths, lengths, flow table, ``train.vae_curriculum``).
      kind: a :class:`BatchKind` or its name in :data:`KINDS` (a training phase's ``batch``, ``train.phases``).
      reference_frames: the "reference" kind's ``records -> uint8 [B, H, W, 3]`` (default
        :func:`pick_reference_frames`).

    ``tools`` holds what the kind's fields read (``"t5"``: the T5 tokenizer, ``"mllm"``: the MLLM's).
    ``__call__(ex, step)``: the step picks the "vae" curriculum stage and seeds its random windows
    (``default_rng([seed, step])``), so a resumed run builds the same batches as an uninterrupted one.

    Raises:
      ValueError: an unknown kind name, or a malformed ``train.vae_curriculum`` (kind "vae").
      FileNotFoundError: ``config.t5.spiece_model`` missing (kinds with text: all but "vae" and "frames").
    """

    def __init__(self, config: ml_collections.ConfigDict, kind: BatchKind | str, reference_frames: Any = None):
        self.config = config
        self.kind = kind if isinstance(kind, BatchKind) else batch_kind(kind)
        self.reference_frames = reference_frames or pick_reference_frames
        self.tools: dict[str, Any] = {}
        for f in self.kind.fields:
            self.tools.update(f.setup(config))

    def __call__(self, ex: Mapping[str, Any], step: int = 0) -> dict[str, np.ndarray]:
        return self.kind.build(ex, self, step)


# ---------------------------------------------------------------- the groups of fields

F32, I32, BOOL, U8 = np.float32, np.int32, np.bool_, np.uint8


def _clip_shape(config: ml_collections.ConfigDict) -> tuple[int, int, int, int]:
    """(T, H, W, 3) of a clip as the loader stores it (``data.num_frames`` x ``data.height`` x
    ``data.width``; defaults from the DiT's latent size)."""
    t_lat, h_lat, w_lat = (int(config.dit.num_latent_frames), int(config.dit.sample_height),
                           int(config.dit.sample_width))
    sf = 2 ** (len(tuple(config.vae.block_out_channels)) - 1)
    return (int(config.data.get("num_frames", 1 + 4 * (t_lat - 1))), int(config.data.get("height", sf * h_lat)),
            int(config.data.get("width", sf * w_lat)), 3)


def _t5_tools(config: ml_collections.ConfigDict) -> dict[str, Any]:
    spiece = paths.resource(config.t5.spiece_model)
    if not spiece or not fileio.exists(spiece):
        raise FileNotFoundError(f"config.t5.spiece_model {spiece!r} not found (the T5 spiece.model shipped "
                                f"with the T5 weights)")
    return {"t5": t5_tokenizer.T5Tokenizer(spiece, max_length=int(config.t5.max_length))}


def _turn_tools(config: ml_collections.ConfigDict) -> dict[str, Any]:
    return {**_t5_tools(config), "mllm": mllm_tokenizer.get_tokenizer()}


def _features_note(config: ml_collections.ConfigDict) -> str:
    return "T5/CLIP features precomputed" if config.train.precomputed_features else "T5/CLIP in the step"


def _target_note(config: ml_collections.ConfigDict) -> str:
    return "VAE-encoded frames" if config.train.encode_latents else "latents"


def _frames_note(config: ml_collections.ConfigDict) -> str:
    return "frames"


def _vae_setup(config: ml_collections.ConfigDict) -> dict[str, Any]:
    vae_stage(config.train.vae_curriculum, 0)  # fail early on a malformed curriculum
    return {}


def _vae_build(ex: Mapping[str, Any], builder: BatchBuilder, step: int) -> dict[str, np.ndarray]:
    t = builder.config.train
    f, h, w = vae_stage(t.vae_curriculum, step)
    rng = np.random.default_rng([int(builder.config.seed), int(step)])
    windows = vae_windows(np.asarray(ex["frames"]), f, h, w, rng, int(t.vae_windows_per_clip),
                          float(t.get("vae_max_crop_scale", 1.0)))
    return {"frames": media.from_uint8(windows)}


def _vae_spec(config: ml_collections.ConfigDict, n: int) -> Shapes:
    _, t, h, w = tuple(config.train.vae_curriculum)[-1]
    per_clip = max(1, min(int(config.train.vae_windows_per_clip), _clip_shape(config)[0] // int(t)))
    return {"frames": ((n * per_clip, int(t), int(h), int(w), 3), F32)}


def _vae_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
    t = config.train
    return {"vae_curriculum": [list(s) for s in t.vae_curriculum],
            "vae_windows_per_clip": int(t.vae_windows_per_clip),
            "vae_max_crop_scale": float(t.get("vae_max_crop_scale", 1.0))}


#: vae: random curriculum windows of the clips
VAE_WINDOWS = Fields(_vae_build, _vae_spec, setup=_vae_setup, note=_frames_note)
#: frames: the whole clips
CLIP_FRAMES = Fields(lambda ex, builder, step: {"frames": media.from_uint8(ex["frames"])},
                     lambda config, n: {"frames": ((n,) + _clip_shape(config), F32)}, note=_frames_note)


def _condition_build(ex: Mapping[str, Any], builder: BatchBuilder, step: int) -> dict[str, np.ndarray]:
    out = {"flow": flow_values(ex["motion_level"], builder.config.dit.flow_table)}
    if "f_md" in ex:  # precomputed T5 / CLIP features
        out["f_md"], out["f_v"] = np.asarray(ex["f_md"], np.float32), np.asarray(ex["f_v"], np.float32)
    else:
        out["t5_ids"] = builder.tools["t5"](_strs(ex["action"]))
        out["first_frame"] = media.from_uint8(ex["first_frame"])
    return out


def _feature_shapes(config: ml_collections.ConfigDict, rows: tuple[int, ...], prefix: str = "") -> Shapes:
    """E_a's inputs of ``rows`` clips: stored features, or the T5 ids and the first frame."""
    lt, dt = int(config.t5.max_length), int(config.t5.d_model)
    p, dv = int(config.rep.num_image_tokens), int(config.clip.vision_width)
    if config.train.precomputed_features:
        return {prefix + "f_md": (rows + (lt, dt), F32), prefix + "f_v": (rows + (p, dv), F32)}
    return {prefix + "t5_ids": (rows + (lt,), I32), prefix + "first_frame": (rows + _clip_shape(config)[1:], F32)}


def _target_shapes(config: ml_collections.ConfigDict, n: int) -> Shapes:
    """The target clip of ``n`` rows: its flow value and frames, or latents."""
    if config.train.encode_latents:
        return {"flow": ((n,), F32), "frames": ((n,) + _clip_shape(config), F32)}
    lat = (int(config.dit.num_latent_frames), int(config.dit.in_channels), int(config.dit.sample_height),
           int(config.dit.sample_width))
    return {"flow": ((n,), F32), "latents": ((n,) + lat, F32)}


def _clip(ex: Mapping[str, Any], rows: Any = slice(None)) -> dict[str, np.ndarray]:
    """The target clip of a loader batch (``rows`` picks one turn per row in turns batches): latents
    when stored, else the frames in [-1, 1]."""
    if "latents" in ex:
        return {"latents": np.asarray(ex["latents"], np.float32)[rows]}
    return {"frames": media.from_uint8(np.asarray(ex["frames"])[rows])}


#: decoder: the clip's E_a inputs and its motion's flow value
CLIP_CONDITION = Fields(_condition_build,
                        lambda config, n: {"flow": ((n,), F32), **_feature_shapes(config, (n,))},
                        setup=_t5_tools, note=_features_note)
#: decoder: the clip itself, to denoise
CLIP_TARGET = Fields(lambda ex, builder, step: _clip(ex),
                     lambda config, n: {k: v for k, v in _target_shapes(config, n).items() if k != "flow"},
                     note=_target_note)
#: reference: each clip's reference image
REFERENCE_FRAME = Fields(lambda ex, builder, step: {"reference_frame": builder.reference_frames(ex)},
                         lambda config, n: {"reference_frame": ((n,) + _clip_shape(config)[1:], U8)})


def _turns_build(ex: Mapping[str, Any], builder: BatchBuilder, step: int) -> dict[str, np.ndarray]:
    cfg = builder.config
    w = int(cfg.mllm.history_window)
    q = mllm.num_queries(cfg)
    num_turns = np.asarray(ex["num_turns"]).astype(np.int64)
    b, m = np.asarray(ex["states"]).shape[:2]
    instr = np.asarray(ex["instruction"]).reshape(b, m)
    seqs, target, hist = [], np.zeros(b, np.int32), np.zeros((b, max(w - 1, 1)), np.int32)
    for i in range(b):
        n = int(num_turns[i])
        states = np.asarray(ex["states"][i])
        seqs.append(mllm.build_sequence(builder.tools["mllm"], _strs(instr[i, :n]), [list(s) for s in states[:n - 1]],
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
        out["turn_t5_ids"] = builder.tools["t5"]([s for row in actions for s in _strs(row)]).reshape(b, m, -1)
        out["turn_first_frame"] = media.from_uint8(ex["first_frame"])
    out["target_turn"], out["history_turns"] = target, hist
    return out


def _turns_spec(config: ml_collections.ConfigDict, n: int) -> Shapes:
    length, m, w = int(config.train.max_seq_len), int(config.data.max_turns), int(config.mllm.history_window)
    tokens = {k: ((n, length), I32) for k in ("input_ids", "labels", "turn_ids")}
    masks = {k: ((n, length), BOOL) for k in ("cmp_mask", "gen_mask", "padding_mask")}
    return {**tokens, **masks, "target_turn": ((n,), I32), "history_turns": ((n, max(w - 1, 1)), I32),
            **_feature_shapes(config, (n, m), "turn_")}


def _turn_target_build(ex: Mapping[str, Any], builder: BatchBuilder, step: int) -> dict[str, np.ndarray]:
    b, m = np.asarray(ex["states"]).shape[:2]
    rows = (np.arange(b), np.asarray(ex["num_turns"]).astype(np.int64) - 1)  # each row's target turn
    levels = np.asarray(ex["motion_level"]) if "motion_level" in ex else np.asarray(ex["states"])[..., 0]
    return {"flow": flow_values(levels.reshape(b, m)[rows], builder.config.dit.flow_table), **_clip(ex, rows)}


def turn_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The turn batches' settings a resume must agree on (phases b and c)."""
    return {"max_turns": int(config.data.max_turns), "history_window": int(config.mllm.history_window)}


#: turns: the MLLM's token sequence of the turns and every turn's E_a inputs
TURN_SEQUENCE = Fields(_turns_build, _turns_spec, setup=_turn_tools, note=_features_note)
#: turns_clip: the target turn's clip and its flow value
TURN_TARGET = Fields(_turn_target_build, _target_shapes, note=_target_note)

VAE = BatchKind("vae", "clips", (VAE_WINDOWS,), settings=_vae_settings, dataset_key="vae_dataset_dir")
FRAMES = BatchKind("frames", "clips", (CLIP_FRAMES,))
DECODER = BatchKind("decoder", "clips", (CLIP_CONDITION, CLIP_TARGET), clip_target=True)
REFERENCE = BatchKind("reference", "clips", (CLIP_CONDITION, CLIP_TARGET, REFERENCE_FRAME), clip_target=True)
TURNS = BatchKind("turns", "turns", (TURN_SEQUENCE,), settings=turn_settings)
TURNS_CLIP = BatchKind("turns_clip", "turns", (TURN_SEQUENCE, TURN_TARGET), clip_target=True, settings=turn_settings)

#: kind name -> its record (module docstring)
KINDS: dict[str, BatchKind] = {k.name: k for k in (VAE, FRAMES, DECODER, REFERENCE, TURNS, TURNS_CLIP)}


def batch_kind(name: str) -> BatchKind:
    """The record of the batch kind ``name``.

    Raises:
      ValueError: an unknown name, naming the kinds.
    """
    if name not in KINDS:
        raise ValueError(f"unknown batch kind {name!r}; use one of {', '.join(KINDS)} "
                         f"(a training phase's batch: train.phases)")
    return KINDS[name]
