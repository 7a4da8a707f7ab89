"""AnimeGamer MLLM ``pytorch_model.bin`` (peft-wrapped Mistral + resamplers) -> GameStateMLLM state.

Key families (docs/mllm.md#checkpoint-keys), both peft naming generations accepted:

    llm.base_model.model.<hf name>.base_layer.weight          (peft >= 0.7)  -> <hf name>.weight
    llm.base_model.model.<hf name>.weight                     (older peft)   -> <hf name>.weight
    llm.base_model.model.<hf name>.lora_{A,B}.default.weight  (or without ".default")
                                                              -> <hf name>.lora_{A,B}.weight
    llm.base_model.model.<norm>.modules_to_save.default.weight -> <norm>.weight  (trained copy)
    llm.base_model.model.<norm>.original_module.weight        -> dropped (frozen original)
    input_resampler.proj.{0,2}.{weight,bias}   -> input_resampler.fc{1,2}.{kernel,bias}
    output_resampler.proj.{0,2}.{weight,bias}  -> output_resampler.fc{1,2}.{kernel,bias}

LoRA is kept (``lora_a``/``lora_b`` params, rank read from the checkpoint) or merged
(``W = W_base + (alpha / r) * B @ A``, docs/mllm.md#checkpoint-keys). A plain (non-peft) ``llm.model...``
layout is accepted too. Missing, unexpected and mis-shaped keys raise ``ConversionError`` with the lists.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.weights import ConversionError, check_keys, state_from_pure_dict, to_numpy
from animegamer_jax.models.mistral.convert import mistral_leaves, mistral_pure_dict
from animegamer_jax.models.mistral.mllm import GameStateMLLM, MLLMConfig

_LORA_RE = re.compile(r"^(?P<mod>.+)\.lora_(?P<ab>[AB])(?:\.default)?\.weight$")


def normalize_peft_keys(sd: Mapping[str, Any], llm_prefix: str = "llm.") -> tuple[dict[str, Any], dict[str, Any]]:
    """Splits a release state dict into (llm dict with HF names + normalized LoRA names, other keys).

    Raises:
      ConversionError: a key that appears twice after normalization (e.g. both peft generations).
    """
    llm: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, val in sd.items():
        if not key.startswith(llm_prefix):
            rest[key] = val
            continue
        k = key[len(llm_prefix):]
        if k.startswith("base_model.model."):
            k = k[len("base_model.model."):]
        if ".original_module." in k:
            continue
        k = k.replace(".modules_to_save.default.", ".").replace(".base_layer.", ".")
        m = _LORA_RE.match(k)
        if m:
            k = f"{m['mod']}.lora_{m['ab']}.weight"
        if k in llm:
            raise ConversionError(f"key {key!r} normalizes to {k!r}, which another key already gave")
        llm[k] = val
    return llm, rest


def _detect_rank(llm_sd: Mapping[str, Any]) -> int:
    ranks = {int(np.shape(v)[0]) for k, v in llm_sd.items() if k.endswith(".lora_A.weight")}
    if len(ranks) > 1:
        raise ConversionError(f"LoRA factors with different ranks {sorted(ranks)}")
    return ranks.pop() if ranks else 0


def _lora_targets(llm_sd: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(sorted({k.split(".")[-3] for k in llm_sd if k.endswith(".lora_A.weight")}))


def _merge(llm_sd: dict[str, Any], scaling: float) -> dict[str, Any]:
    out = {k: v for k, v in llm_sd.items() if ".lora_" not in k}
    for k in llm_sd:
        if k.endswith(".lora_A.weight"):
            mod = k[: -len(".lora_A.weight")]
            a = to_numpy(llm_sd[k])
            b = to_numpy(llm_sd[mod + ".lora_B.weight"])
            w = to_numpy(out[mod + ".weight"])
            out[mod + ".weight"] = w + scaling * (b @ a)
    return out


def _resampler_pure(rest: Mapping[str, Any], cfg: MLLMConfig, dt: Any) -> dict[str, Any]:
    d, r = cfg.llm.hidden_size, cfg.rep_dim
    exp = {
        "input_resampler.proj.0.weight": (d, r), "input_resampler.proj.0.bias": (d,),
        "input_resampler.proj.2.weight": (d, d), "input_resampler.proj.2.bias": (d,),
        "output_resampler.proj.0.weight": (r, d), "output_resampler.proj.0.bias": (r,),
        "output_resampler.proj.2.weight": (r, r), "output_resampler.proj.2.bias": (r,),
    }
    check_keys(rest, exp, "animegamer mllm (resamplers / non-llm keys)")

    def g(k: str) -> np.ndarray:
        return to_numpy(rest[k])

    out: dict[str, Any] = {}
    for name in ("input_resampler", "output_resampler"):
        out[name] = {
            "fc1": {"kernel": g(f"{name}.proj.0.weight").T.astype(dt), "bias": g(f"{name}.proj.0.bias").astype(dt)},
            "fc2": {"kernel": g(f"{name}.proj.2.weight").T.astype(dt), "bias": g(f"{name}.proj.2.bias").astype(dt)},
        }
    return out


def convert_animegamer_mllm(
    sd: Mapping[str, Any],
    cfg: MLLMConfig,
    *,
    merge_lora: bool = False,
    lora_alpha: float | None = None,
    llm_prefix: str = "llm.",
) -> tuple[MLLMConfig, nnx.State]:
    """Release MLLM state dict -> (config actually used, ``nnx.State`` of ``GameStateMLLM``).

    Args:
      sd: ``{name: tensor/array}`` from the release ``pytorch_model.bin``.
      cfg: base config (sizes, dtypes); LoRA rank and targets are taken from the checkpoint.
      merge_lora: fold ``(alpha/r) B A`` into the base weights; the result has ``lora_rank=0``.
      lora_alpha: LoRA alpha (default ``cfg.llm.lora_alpha``; the release uses 32 with r=32).

    Raises:
      ConversionError: missing / unexpected / mis-shaped keys (listed), mixed ranks.
    """
    llm_sd, rest = normalize_peft_keys(sd, llm_prefix)
    rank = _detect_rank(llm_sd)
    alpha = cfg.llm.lora_alpha if lora_alpha is None else float(lora_alpha)
    if rank and merge_lora:
        llm_sd = _merge(llm_sd, alpha / rank)
        llm_cfg = dataclasses.replace(cfg.llm, lora_rank=0)
    elif rank:
        llm_cfg = dataclasses.replace(cfg.llm, lora_rank=rank, lora_alpha=alpha, lora_targets=_lora_targets(llm_sd))
    else:
        llm_cfg = dataclasses.replace(cfg.llm, lora_rank=0)
    cfg = dataclasses.replace(cfg, llm=llm_cfg)
    pure = {"llm": mistral_pure_dict(llm_sd, llm_cfg)}
    dt = jnp.dtype(llm_cfg.param_dtype)
    pure.update(_resampler_pure(rest, cfg, dt))
    state = state_from_pure_dict(nnx.state(nnx.eval_shape(lambda: GameStateMLLM(cfg, rngs=nnx.Rngs(0)))), pure,
                                 "animegamer mllm")
    return cfg, state


def add_base_weights(sd: dict[str, Any], base_sd: Mapping[str, Any]) -> dict[str, Any]:
    """Fills the frozen base keys a trainable-subset ``.bin`` lacks from an HF Mistral state dict.

    ``sd`` (release names) is updated in place: every HF key of ``base_sd`` whose normalized name is
    absent from ``sd`` is added as ``llm.base_model.model.<key>``; keys the release already has (its
    resized embeddings / lm_head) win. Returns ``sd``.
    """
    llm_sd, _ = normalize_peft_keys(sd)
    for k in base_sd.keys():
        if k not in llm_sd:
            sd["llm.base_model.model." + k] = base_sd[k]
    return sd


def animegamer_mllm_leaves(sd: Mapping[str, Any], cfg: MLLMConfig, *, lora_alpha: float | None = None,
                           llm_prefix: str = "llm.") -> tuple[MLLMConfig, dict[tuple, Any]]:
    """:func:`convert_animegamer_mllm` (LoRA kept) as lazy leaves, for streaming writers.

    Returns:
      (config actually used, ``{our path: convert.Leaf or np.ndarray}``): the Mistral leaves under
      ``("llm", ...)`` evaluate one leaf / one layer at a time; the resamplers are arrays.

    Raises:
      ConversionError: missing / unexpected / mis-shaped keys (listed), mixed ranks.
    """
    llm_sd, rest = normalize_peft_keys(sd, llm_prefix)
    rank = _detect_rank(llm_sd)
    alpha = cfg.llm.lora_alpha if lora_alpha is None else float(lora_alpha)
    if rank:
        llm_cfg = dataclasses.replace(cfg.llm, lora_rank=rank, lora_alpha=alpha, lora_targets=_lora_targets(llm_sd))
    else:
        llm_cfg = dataclasses.replace(cfg.llm, lora_rank=0)
    cfg = dataclasses.replace(cfg, llm=llm_cfg)
    leaves: dict[tuple, Any] = {("llm",) + p: leaf for p, leaf in mistral_leaves(llm_sd, llm_cfg).items()}
    for name, sub in _resampler_pure(rest, cfg, np.float32).items():
        for fc, d in sub.items():
            for k, v in d.items():
                leaves[(name, fc, k)] = v
    return cfg, leaves
