"""Analytic FLOP model of one AnimeGamer game turn and one training step, and the MFU a time implies.

    python benchmarks/cost_model.py                                  # paper size, tables only
    python benchmarks/cost_model.py --turn_seconds=24 --peak_tflops=989   # MFU of the paper's 24 s/turn
    python benchmarks/cost_model.py --config=configs/tiny.py
    python benchmarks/cost_model.py --chip=tpu-v6e                 # + teacher vs few-step student turns on a v6e

Arithmetic on the config sections (no program is traced or compiled) (docs/mllm.md, docs/dit.md, docs/vae.md; sizes in
configs/animegamer_2b_7b.py). Conventions:
- A matmul [m, k] x [k, n] costs 2 m k n FLOPs; convolutions 2 x outputs x C_in x kernel volume.
  Norms, activations, softmax and the sampler arithmetic are not counted (< 1 % here).
- Attention scores and the attention-weighted sum cost 4 L_q L_k D_attn. Bidirectional attention
  (DiT, ViT, T5) counts the full square; causal attention counts the visible keys only.
- One game turn = MLLM pass A (prefill + greedy decode of ``max_new_tokens``), MLLM pass B (one
  forward with the query block), resamplers, ``num_sampling_steps`` x 2 CFG halves of the DiT, one
  VAE decode. The distilled student (``diffusion.sampler = "student"``, training phase d) makes
  ``num_sampling_steps`` (1, 2, 4 or 8) DiT calls and no CFG halves, each with one more embedding
  MLP (the guidance scale's); the "teacher vs student" table compares it with the teacher's
  sampler (``diffusion.sampler`` or, for a student config, ``student_grid_steps`` of DPM++ 2M).
- A training step counts model FLOPs as 3 x forward for every trained network (forward +
  backward w.r.t. activations and weights, the usual MFU convention) and 1 x forward for frozen
  feature extractors (VAE encoder, T5, CLIP). LoRA training skips most weight gradients, so real
  work is ~2 x forward plus rematerialization's extra forward; the 3x convention is kept so MFU
  figures compare with other codebases.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from animegamer_jax.aot.pieces import num_queries, turn_length  # noqa: E402
from animegamer_jax.config import load_config  # noqa: E402
from animegamer_jax.parallel.target import CHIPS  # noqa: E402

# Peak dense bf16 TFLOP/s per chip (vendor figures with sources in parallel/target.py), for --chip.
PEAK_TFLOPS = {(f"tpu-{c.name}" if c.name.startswith("v") else c.name): c.bf16_flops / 1e12 for c in CHIPS}


def _get(section: Any, key: str, default: Any = None) -> Any:
    if hasattr(section, "get"):
        return section.get(key, default)
    return getattr(section, key, default)


def linear(tokens: float, d_in: int, d_out: int) -> float:
    """FLOPs of a dense layer applied to ``tokens`` rows: 2 * tokens * d_in * d_out."""
    return 2.0 * tokens * d_in * d_out


def conv(out_elements: float, c_in: int, c_out: int, kernel_volume: int) -> float:
    """FLOPs of a convolution: 2 * (output positions) * C_out * C_in * kernel volume."""
    return 2.0 * out_elements * c_out * c_in * kernel_volume


# ---------------------------------------------------------------- DiT (docs/dit.md)

def dit_tokens(dit: Any, text_tokens: int) -> tuple[int, int]:
    """(video tokens, total tokens) of one DiT sample: 5 x 30 x 45 = 6750 and 6976 at paper size."""
    p = _get(dit, "patch_size", 2)
    video = _get(dit, "num_latent_frames", 5) * (_get(dit, "sample_height") // p) * (_get(dit, "sample_width") // p)
    return video, video + text_tokens


def dit_forward_flops(dit: Any, text_tokens: int, lora: bool = True, guidance: bool = False) -> dict[str, float]:
    """FLOPs of one DiT forward on one sample (B = 1).

    Args:
      dit: the ``cfg.dit`` section (hidden_size, num_layers, num_heads, head_dim, mlp_ratio,
        time_embed_dim, in/out_channels, patch_size, sample_height/width, num_latent_frames, lora_rank).
      text_tokens: conditioning tokens (226 at paper size).
      lora: count unmerged LoRA adapters on q, k, v and the output projection.
      guidance: the student's guidance-scale embedding MLP (``use_guidance``: Linear(D -> E), Linear(E -> E)).

    Returns:
      dict component -> FLOPs: ``blocks_linear``, ``blocks_attention``, ``lora``, ``embed_out``.
    """
    d = _get(dit, "hidden_size")
    layers = _get(dit, "num_layers")
    attn_d = _get(dit, "num_heads") * _get(dit, "head_dim")
    mlp = int(d * _get(dit, "mlp_ratio", 4.0))
    e = _get(dit, "time_embed_dim")
    p = _get(dit, "patch_size", 2)
    video, n = dit_tokens(dit, text_tokens)
    per_layer_linear = (linear(n, d, 3 * attn_d) + linear(n, attn_d, d) + linear(n, d, mlp)
                        + linear(n, mlp, d) + linear(1, e, 12 * d))
    per_layer_attn = 4.0 * n * n * attn_d
    r = _get(dit, "lora_rank", 0) if lora else 0
    per_layer_lora = 4 * (linear(n, d, r) + linear(n, r, d)) if r else 0.0
    embed_out = (linear(video, _get(dit, "in_channels") * p * p, d)  # patch embedding
                 + linear(video, d, p * p * _get(dit, "out_channels"))  # proj_out
                 + (3 if guidance else 2) * (linear(1, d, e) + linear(1, e, e))  # time + flow (+ guidance) MLPs
                 + linear(1, e, 2 * d))  # final adaLN
    return {"blocks_linear": layers * per_layer_linear, "blocks_attention": layers * per_layer_attn,
            "lora": layers * per_layer_lora, "embed_out": embed_out}


# ---------------------------------------------------------------- 3D VAE (docs/vae.md)

def _resnet(vol: float, c_in: int, c_out: int, spatial_norm_ch: int = 0) -> float:
    f = conv(vol, c_in, c_out, 27) + conv(vol, c_out, c_out, 27)
    if c_in != c_out:
        f += conv(vol, c_in, c_out, 1)  # 1x1x1 nin_shortcut
    if spatial_norm_ch:  # decoder SpatialNorm3D: conv_y and conv_b (1x1x1 from zq) per norm
        f += 2 * conv(vol, spatial_norm_ch, c_in, 1) + 2 * conv(vol, spatial_norm_ch, c_out, 1)
    return f


def vae_decode_flops(vae: Any, latent_t: int, latent_h: int, latent_w: int) -> float:
    """FLOPs of decoding one latent clip [latent_t, C, latent_h, latent_w] (CogVideoX decoder,
    docs/vae.md#building-blocks).

    Level order (highest channels first): mid (2 resnets), then per level ``layers_per_block + 1``
    resnets and an upsample (time x2 for the first ``log2(temporal_compression_ratio)`` levels,
    space x2 for all but the last), then SpatialNorm and ``conv_out``. Chunked decoding does not change
    the count. With odd T, time upsampling gives 1 + 2 (T - 1) frames.
    """
    chans = list(_get(vae, "block_out_channels"))[::-1]
    z = _get(vae, "latent_channels")
    n_res = _get(vae, "layers_per_block") + 1
    t_levels = int(round(_get(vae, "temporal_compression_ratio", 4))).bit_length() - 1
    t, h, w = latent_t, latent_h, latent_w
    vol = t * h * w
    f = conv(vol, z, chans[0], 27)  # conv_in
    f += 2 * _resnet(vol, chans[0], chans[0], z)  # mid block
    c_prev = chans[0]
    for i, c in enumerate(chans):
        for j in range(n_res):
            f += _resnet(t * h * w, c_prev if j == 0 else c, c, z)
        c_prev = c
        if i < len(chans) - 1:
            if i < t_levels:
                t = 1 + 2 * (t - 1) if t % 2 == 1 else 2 * t
            h, w = 2 * h, 2 * w
            f += conv(t * h * w, c, c, 9)  # per-frame 3x3 conv after nearest upsampling
    vol = t * h * w
    f += 2 * conv(vol, z, c_prev, 1)  # norm_out SpatialNorm
    f += conv(vol, c_prev, _get(vae, "in_channels", 3), 27)
    return f


def vae_encode_flops(vae: Any, frames: int, height: int, width: int) -> float:
    """FLOPs of encoding one clip [frames, height, width, 3] (CogVideoX encoder,
    docs/vae.md#building-blocks), mean + logvar out."""
    chans = list(_get(vae, "block_out_channels"))
    z = _get(vae, "latent_channels")
    n_res = _get(vae, "layers_per_block")
    t_levels = int(round(_get(vae, "temporal_compression_ratio", 4))).bit_length() - 1
    t, h, w = frames, height, width
    f = conv(t * h * w, _get(vae, "in_channels", 3), chans[0], 27)
    c_prev = chans[0]
    for i, c in enumerate(chans):
        for j in range(n_res):
            f += _resnet(t * h * w, c_prev if j == 0 else c, c)
        c_prev = c
        if i < len(chans) - 1:
            if i < t_levels:
                t = 1 + (t - 1) // 2 if t % 2 == 1 else t // 2
            h, w = h // 2, w // 2
            f += conv(t * h * w, c, c, 9)  # stride-2 3x3 conv per frame
    vol = t * h * w
    f += 2 * _resnet(vol, c_prev, c_prev)
    f += conv(vol, c_prev, 2 * z, 27)
    return f


# ---------------------------------------------------------------- Mistral + resamplers (docs/mllm.md)

def mistral_forward_flops(mllm: Any, new_tokens: int, context: int = 0, causal: bool = True,
                          logits_positions: int | None = None) -> dict[str, float]:
    """FLOPs of a Mistral forward over ``new_tokens`` positions after ``context`` cached ones.

    Args:
      mllm: the ``cfg.mllm`` section.
      new_tokens: positions computed in this call (prefill length, or 1 per decode step).
      context: positions already in the KV cache.
      causal: count only visible keys (query i sees context + i + 1 keys).
      logits_positions: positions that go through lm_head (default all new tokens).

    Returns:
      dict: ``linear`` (projections + MLP), ``attention``, ``lm_head``, ``lora``.
    """
    d = _get(mllm, "hidden_size")
    hd = _get(mllm, "head_dim")
    q_d, kv_d = _get(mllm, "num_heads") * hd, _get(mllm, "num_kv_heads") * hd
    inter = _get(mllm, "intermediate_size")
    layers = _get(mllm, "num_layers")
    n = new_tokens
    per_layer = (linear(n, d, q_d) + 2 * linear(n, d, kv_d) + linear(n, q_d, d) + 3 * linear(n, d, inter))
    if causal:
        keys = n * context + n * (n + 1) / 2.0
    else:
        keys = n * (context + n)
    window = _get(mllm, "sliding_window", 0)
    if window:
        keys = min(keys, n * float(window))
    attn = 4.0 * keys * q_d
    r = _get(mllm, "lora_rank", 0)
    lora = 0.0
    if r:
        dims = {"q_proj": (d, q_d), "k_proj": (d, kv_d), "v_proj": (d, kv_d), "o_proj": (q_d, d),
                "gate_proj": (d, inter), "up_proj": (d, inter), "down_proj": (inter, d)}
        for name in _get(mllm, "lora_targets", tuple(dims)):
            a, b = dims[name]
            lora += linear(n, a, r) + linear(n, r, b)
    lp = n if logits_positions is None else logits_positions
    return {"linear": layers * per_layer, "attention": layers * attn,
            "lm_head": linear(lp, d, _get(mllm, "vocab_size")), "lora": layers * lora}


def turn_sequence_length(cfg: Any, text_tokens: int = 25) -> tuple[int, int]:
    """(MLLM sequence length of one turn with a full window, query tokens) (docs/token_layout.md#per-turn-layout):
    :func:`animegamer_jax.aot.pieces.turn_length` and ``num_queries``."""
    return turn_length(cfg, text_tokens), num_queries(cfg)


def _total(parts: dict[str, float]) -> float:
    return float(sum(parts.values()))


TEACHER, STUDENT = "teacher", "student"
#: the student's step counts (diffusion/samplers.py STUDENT_STEPS)
STUDENT_STEPS = (1, 2, 4, 8)


def dit_sampling_flops(cfg: Any, text_tokens: int, kind: str, steps: int, lora: bool = True) -> dict[str, float]:
    """DiT FLOPs of one clip's sampling loop.

    Args:
      cfg: full config (section dit).
      text_tokens: conditioning tokens (226 at paper size).
      kind: ``"teacher"`` (each step runs the CFG batch of 2) or ``"student"`` (one call per step, the
        guidance embedding MLP included).
      steps: sampling steps.
      lora: unmerged LoRA adapters (False: merged, as play runs).

    Returns:
      dict: ``calls`` (DiT forwards of one sample), ``per_call`` and ``total`` FLOPs.

    Raises:
      ValueError: unknown ``kind`` or ``steps`` < 1.
    """
    if kind not in (TEACHER, STUDENT):
        raise ValueError(f"unknown sampler kind {kind!r}; use {TEACHER!r} or {STUDENT!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    dit = dict(cfg.dit) if hasattr(cfg.dit, "items") else dict(vars(cfg.dit))
    if not lora:
        dit["lora_rank"] = 0
    per_call = _total(dit_forward_flops(dit, text_tokens, guidance=kind == STUDENT))
    calls = steps * (2 if kind == TEACHER else 1)
    return {"calls": float(calls), "per_call": per_call, "total": calls * per_call}


def _sampling_of(cfg: Any) -> tuple[str, int]:
    """(kind, steps) of the config's clip sampler (``diffusion.sampler`` "student" or a teacher sampler)."""
    d = cfg.diffusion
    kind = STUDENT if str(_get(d, "sampler", "dpmpp_2m")) == "student" else TEACHER
    return kind, int(_get(d, "num_sampling_steps"))


def teacher_steps(cfg: Any) -> int:
    """The teacher's steps: ``num_sampling_steps`` of a teacher config, ``student_grid_steps`` (50) of a
    student config (the grid the student was distilled on)."""
    kind, steps = _sampling_of(cfg)
    return steps if kind == TEACHER else int(_get(cfg.diffusion, "student_grid_steps", 50))


def student_table_rows(cfg: Any, text_tokens: int = 25, steps: tuple[int, ...] = STUDENT_STEPS,
                       lora: bool = False) -> list[dict[str, Any]]:
    """Per-turn FLOPs of the teacher's sampler and of the student at each of ``steps``.

    Returns:
      [{"label", "kind", "steps", "calls", "dit", "turn", "ratio"}], the teacher first: ``dit`` = the
      sampling loop's DiT FLOPs, ``turn`` = the whole turn (:func:`turn_flops` with that sampler),
      ``ratio`` = teacher DiT FLOPs / this row's (1.0 for the teacher).
    """
    q = turn_sequence_length(cfg, text_tokens)[1]
    t_steps = teacher_steps(cfg)
    rest = {k: v for k, v in turn_flops(cfg, text_tokens, lora).items() if k != "dit"}
    rows = []
    for kind, n in [(TEACHER, t_steps)] + [(STUDENT, int(k)) for k in steps]:
        f = dit_sampling_flops(cfg, q, kind, n, lora)
        label = (f"teacher ({n} steps x CFG 2)" if kind == TEACHER else f"student ({n} step{'s' if n > 1 else ''})")
        rows.append({"label": label, "kind": kind, "steps": n, "calls": int(f["calls"]), "dit": f["total"],
                     "turn": _total(rest) + f["total"]})
    for r in rows:
        r["ratio"] = rows[0]["dit"] / r["dit"]
    return rows


def turn_flops(cfg: Any, text_tokens: int = 25, lora: bool = True) -> dict[str, float]:
    """FLOPs of one game turn (batch 1) by stage.

    Args:
      cfg: the full config (sections rep, mllm, dit, vae, diffusion).
      text_tokens: instruction tokens per turn (~25 for "Character: ...; Motion: ...; Background: ...").
      lora: unmerged LoRA adapters (False: merged before play).

    Returns:
      dict: ``mllm_pass_a`` (prefill + greedy decode with KV cache), ``mllm_pass_b``,
      ``resamplers``, ``dit`` (steps x 2 CFG halves; ``diffusion.sampler = "student"``: steps x 1
      call of the student, :func:`dit_sampling_flops`), ``vae_decode``.
    """
    seq, q = turn_sequence_length(cfg, text_tokens)
    mllm = cfg.mllm
    mcfg = dict(mllm) if hasattr(mllm, "items") else dict(vars(mllm))
    if not lora:
        mcfg["lora_rank"] = 0
    pass_a = _total(mistral_forward_flops(mcfg, seq, logits_positions=1))
    for i in range(max(0, _get(mllm, "max_new_tokens", 12) - 1)):
        pass_a += _total(mistral_forward_flops(mcfg, 1, context=seq + i))
    # pass B: one forward; the query block is bidirectional (a square of q x q extra visible keys)
    pass_b = _total(mistral_forward_flops(mcfg, seq, logits_positions=0))
    pass_b += 4.0 * (q * q / 2.0) * _get(mllm, "num_heads") * _get(mllm, "head_dim") * _get(mllm, "num_layers")
    d, rd = _get(mllm, "hidden_size"), _get(cfg.rep, "dim")
    w = max(1, _get(mllm, "history_window", 1))
    resamplers = (w - 1) * (linear(q, rd, d) + linear(q, d, d)) + linear(q, d, rd) + linear(q, rd, rd)
    kind, steps = _sampling_of(cfg)
    lt, lh, lw = _get(cfg.dit, "num_latent_frames", 5), _get(cfg.dit, "sample_height"), _get(cfg.dit, "sample_width")
    return {"mllm_pass_a": pass_a, "mllm_pass_b": pass_b, "resamplers": resamplers,
            "dit": dit_sampling_flops(cfg, q, kind, steps, lora)["total"],
            "vae_decode": vae_decode_flops(cfg.vae, lt, lh, lw)}


def clip_vision_flops(clip: Any) -> float:
    """FLOPs of the CLIP ViT up to the penultimate block, one image (197 tokens at ViT-B/16)."""
    d, m = _get(clip, "vision_width"), _get(clip, "vision_mlp_dim")
    p, s = _get(clip, "patch_size"), _get(clip, "image_size")
    n = (s // p) ** 2 + 1
    layers = _get(clip, "vision_layers") - 1
    per = linear(n, d, 3 * d) + linear(n, d, d) + linear(n, d, m) + linear(n, m, d) + 4.0 * n * n * d
    return layers * per + linear(n - 1, 3 * p * p, d)


def t5_encoder_flops(t5: Any) -> float:
    """FLOPs of the T5 v1.1 encoder on one padded text (30 tokens at paper size; gated-GELU FFN)."""
    d, f = _get(t5, "d_model"), _get(t5, "d_ff")
    a = _get(t5, "num_heads") * _get(t5, "d_kv")
    n = _get(t5, "max_length")
    per = linear(n, d, 3 * a) + linear(n, a, d) + 3 * linear(n, d, f) + 4.0 * n * n * a
    return _get(t5, "num_layers") * per


def shot_encoder_flops(cfg: Any) -> float:
    """FLOPs of E_a (text_proj on 30 tokens, ip_proj on 196 tokens), one sample."""
    rd = _get(cfg.rep, "dim")
    return (linear(_get(cfg.rep, "num_text_tokens"), _get(cfg.shot_encoder, "text_dim"), rd)
            + linear(_get(cfg.rep, "num_text_tokens"), rd, rd)
            + linear(_get(cfg.rep, "num_image_tokens"), _get(cfg.shot_encoder, "image_dim"), rd)
            + linear(_get(cfg.rep, "num_image_tokens"), rd, rd))


def train_step_flops(cfg: Any, phase: str, batch: int | None = None, turns: int = 5,
                     tokens_per_turn: int = 300) -> dict[str, float]:
    """Model FLOPs of one optimizer step (3 x forward for trained networks, 1 x for frozen ones).

    Args:
      cfg: full config.
      phase: "a1"/"a2"/"c" (decoder phases: VAE encode + T5 + CLIP + E_a + DiT on one noisy latent per
        sample; "c" conditions on stored MLLM outputs, so no T5/CLIP/E_a), "d" (a2's inputs with E_a
        frozen; the frozen teacher's CFG batch of 2 forwards, the student's target forward and its
        trained forward, 3x) or "b" (MLLM on ``turns`` x ``tokens_per_turn`` tokens per sample, the
        release's ``max_length`` 1500 for 5 turns).
      batch: global batch (default ``cfg.train.global_batch_size``).

    Returns:
      dict stage -> FLOPs for the whole global batch.

    Raises:
      ValueError: unknown phase.
    """
    b = batch or _get(cfg.train, "global_batch_size")
    if phase in ("a1", "a2", "c", "d"):
        q = _get(cfg.rep, "num_text_tokens") + _get(cfg.rep, "num_image_tokens")
        out = {"vae_encode": b * vae_encode_flops(cfg.vae, _get(cfg.data, "num_frames"),
                                                  _get(cfg.data, "height"), _get(cfg.data, "width"))}
        if phase != "c":
            out["t5_clip"] = b * (t5_encoder_flops(cfg.t5) + clip_vision_flops(cfg.clip))
            out["shot_encoder"] = (1 if phase == "d" else 3) * b * shot_encoder_flops(cfg)
        if phase == "d":
            out["teacher"] = 2 * b * _total(dit_forward_flops(cfg.dit, q))
            student = _total(dit_forward_flops(cfg.dit, q, guidance=True))
            out["student"] = (1 + 3) * b * student  # target forward (no gradient) + trained forward
            return out
        # a1 trains E_a (+ flow, LoRA) but still backpropagates through the whole DiT.
        out["dit"] = 3 * b * _total(dit_forward_flops(cfg.dit, q))
        return out
    if phase == "b":
        n = turns * tokens_per_turn
        q = _get(cfg.rep, "num_text_tokens") + _get(cfg.rep, "num_image_tokens")
        mllm = _total(mistral_forward_flops(cfg.mllm, n))
        d, rd = _get(cfg.mllm, "hidden_size"), _get(cfg.rep, "dim")
        res = turns * (linear(q, rd, d) + linear(q, d, d) + linear(q, d, rd) + linear(q, rd, rd))
        return {"mllm": 3 * b * mllm, "resamplers": 3 * b * res}
    raise ValueError(f"unknown phase {phase!r}; use a1, a2, b, c or d")


def mfu(flops: float, seconds: float, peak_flops_per_s: float, chips: int = 1) -> float:
    """Model FLOPs utilization: flops / (seconds * peak * chips), in [0, 1] for a feasible time."""
    if seconds <= 0 or peak_flops_per_s <= 0:
        raise ValueError("seconds and peak FLOP/s must be positive")
    return flops / (seconds * peak_flops_per_s * chips)


def _fmt(x: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if x >= scale:
            return f"{x / scale:8.3f} {unit}"
    return f"{x:8.0f} FLOP"


def table(title: str, parts: dict[str, float]) -> str:
    """A Markdown table of stage -> FLOPs with shares and the total."""
    total = _total(parts)
    lines = [f"### {title}", "| stage | FLOPs | share |", "|---|---:|---:|"]
    for k, v in parts.items():
        lines.append(f"| {k} | {_fmt(v)} | {100 * v / total:5.1f} % |")
    lines.append(f"| **total** | {_fmt(total)} | 100 % |")
    return "\n".join(lines)


def student_table(cfg: Any, text_tokens: int, peak_flops_per_s: float, chips: int = 1) -> str:
    """Markdown table of :func:`student_table_rows` (LoRA merged, as play runs) with each turn's time at
    100 % and 40 % of ``chips`` x ``peak_flops_per_s``."""
    rows = student_table_rows(cfg, text_tokens)
    at = f"{chips} x {peak_flops_per_s / 1e12:.0f} TFLOP/s"
    lines = ["### DiT sampling per turn: teacher vs few-step student (LoRA merged, as play runs)",
             f"| sampler | DiT calls | DiT FLOPs | teacher / this | turn FLOPs | turn s at 100 % / 40 % of {at} |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = r["turn"] / (peak_flops_per_s * chips)
        lines.append(f"| {r['label']} | {r['calls']} | {_fmt(r['dit'])} | {r['ratio']:.2f}x | {_fmt(r['turn'])} | "
                     f"{t:.3f} / {t / 0.4:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/animegamer_2b_7b.py")
    ap.add_argument("--text_tokens", type=int, default=25, help="instruction tokens per turn")
    ap.add_argument("--turn_seconds", type=float, default=0.0, help="measured s/turn -> MFU")
    ap.add_argument("--step_seconds", type=float, default=0.0, help="measured s/step (phase --phase) -> MFU")
    ap.add_argument("--phase", default="a2")
    ap.add_argument("--chip", default="h100", choices=sorted(PEAK_TFLOPS))
    ap.add_argument("--peak_tflops", type=float, default=0.0, help="overrides --chip")
    ap.add_argument("--chips", type=int, default=1)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    peak = (args.peak_tflops or PEAK_TFLOPS[args.chip]) * 1e12
    turn = turn_flops(cfg, args.text_tokens)
    seq, q = turn_sequence_length(cfg, args.text_tokens)
    dit_one = dit_forward_flops(cfg.dit, q)
    print(f"# Cost model: {args.config}\n")
    print(f"MLLM sequence per turn: {seq} tokens (window {cfg.mllm.history_window}, {q} queries); "
          f"DiT sequence: {dit_tokens(cfg.dit, q)[1]} tokens\n")
    print(table("DiT forward (one sample)", dit_one))
    print()
    kind, steps = _sampling_of(cfg)
    print(table(f"One game turn ({steps} steps x 2 CFG)" if kind == TEACHER else
                f"One game turn (student, {steps} steps, no CFG batch)", turn))
    total = _total(turn)
    print(f"\nturn time at 100 % MFU on {args.chips} x {peak / 1e12:.0f} TFLOP/s: "
          f"{total / (peak * args.chips):.2f} s; at 40 %: {total / (0.4 * peak * args.chips):.2f} s")
    if args.turn_seconds:
        print(f"measured {args.turn_seconds:.2f} s/turn -> MFU "
              f"{100 * mfu(total, args.turn_seconds, peak, args.chips):.1f} %")
    print()
    print(student_table(cfg, args.text_tokens, peak, args.chips))
    for phase in ("a2", "b", "c", "d"):
        parts = train_step_flops(cfg, phase)
        print()
        print(table(f"Train step, phase {phase} (global batch {cfg.train.global_batch_size})", parts))
        if args.step_seconds and phase == args.phase:
            print(f"measured {args.step_seconds:.2f} s/step -> MFU "
                  f"{100 * mfu(_total(parts), args.step_seconds, peak, args.chips):.1f} %")


if __name__ == "__main__":
    main()
