"""HF Mistral checkpoints -> our :class:`animegamer_jax.models.mistral.model.Mistral` state (orbax).

Reads ``model.safetensors``, sharded ``model-0000x-of-0000y.safetensors`` with
``model.safetensors.index.json``, ``pytorch_model.bin`` (or its sharded index) and the HF
``config.json`` (both the transformers-5 form with ``rope_parameters`` / explicit ``head_dim`` and
the Mistral-7B-v0.1 form with top-level ``rope_theta``; docs/mllm.md#checkpoint-keys).

Key map (HF ``nn.Linear`` weights are [out, in]; ours keep head axes, see models/mistral/model.py)::

    model.embed_tokens.weight                 [V, D]     -> embed_tokens            [V, D]
    model.layers.{i}.self_attn.q_proj.weight  [N*H, D]   -> layers.q_proj.kernel[i] [D, N, H]
    model.layers.{i}.self_attn.{k,v}_proj     [K*H, D]   -> layers.{k,v}_proj.kernel[i] [D, K, H]
    model.layers.{i}.self_attn.o_proj.weight  [D, N*H]   -> layers.o_proj.kernel[i] [N, H, D]
    model.layers.{i}.mlp.{gate,up}_proj       [F, D]     -> layers.{gate,up}_proj.kernel[i] [D, F]
    model.layers.{i}.mlp.down_proj.weight     [D, F]     -> layers.down_proj.kernel[i] [F, D]
    model.layers.{i}.{input,post_attention}_layernorm.weight [D] -> layers.*.weight[i]
    model.norm.weight [D] -> norm.weight;  lm_head.weight [V, D] -> lm_head [D, V]

LoRA factors in normalized peft form ``<module>.lora_A.weight [r, in]`` / ``lora_B.weight [out, r]``
map to ``lora_a [*in, r]`` / ``lora_b [r, *out]`` (see models/mistral/mllm_convert.py for peft names).
Every missing, unexpected or mis-shaped key raises :class:`ConversionError` listing the keys.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.weights import ConversionError, check_keys, load_state_dict, state_from_pure_dict, to_numpy
from animegamer_jax.models.mistral.model import Mistral, MistralConfig

# Non-parameter buffers that old checkpoints carry; safe to drop.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

_PROJ = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> MistralConfig:
    """MistralConfig from an HF ``config.json`` dict (rope_theta top-level or in rope_parameters)."""
    rope = hf.get("rope_parameters") or {}
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    kw = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
        head_dim=head_dim,
        rope_theta=float(theta),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        sliding_window=hf.get("sliding_window") or None,
    )
    if hf.get("tie_word_embeddings"):
        raise ConversionError("tied word embeddings are not supported (Mistral has an untied lm_head)")
    kw.update(overrides)
    return MistralConfig(**kw)


def load_hf_config(path: str) -> dict[str, Any]:
    """Reads ``config.json`` from an HF model directory."""
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def _expected_keys(cfg: MistralConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """HF-layout key -> shape for the model described by cfg (LoRA keys included when rank > 0)."""
    d, n, kv, h, f, v = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.intermediate_size, cfg.vocab_size)
    io = {
        "q_proj": (d, n * h), "k_proj": (d, kv * h), "v_proj": (d, kv * h), "o_proj": (n * h, d),
        "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d),
    }
    exp = {f"{prefix}model.embed_tokens.weight": (v, d), f"{prefix}model.norm.weight": (d,),
           f"{prefix}lm_head.weight": (v, d)}
    for i in range(cfg.num_layers):
        lp = f"{prefix}model.layers.{i}."
        exp[lp + "input_layernorm.weight"] = (d,)
        exp[lp + "post_attention_layernorm.weight"] = (d,)
        for name, hf in _PROJ.items():
            fin, fout = io[name]
            exp[lp + hf + ".weight"] = (fout, fin)
            if cfg.lora_rank and name in cfg.lora_targets:
                exp[lp + hf + ".lora_A.weight"] = (cfg.lora_rank, fin)
                exp[lp + hf + ".lora_B.weight"] = (fout, cfg.lora_rank)
    return exp


@dataclasses.dataclass(frozen=True)
class Leaf:
    """How to compute one converted leaf: ``fn()`` (whole) or ``fn(i)`` per layer (``layers`` > 0),
    giving float32 arrays of ``shape`` (per layer when stacked); stored as ``dtype``."""

    fn: Any
    shape: tuple[int, ...]
    layers: int = 0


def mistral_leaves(sd: Mapping[str, Any], cfg: MistralConfig, prefix: str = "") -> dict[tuple, Leaf]:
    """The key map of :func:`mistral_pure_dict` as lazy leaves (our path -> :class:`Leaf`).

    Each leaf reads only its own source tensors when evaluated, so a converter can write one leaf
    (or one layer of one leaf) at a time.

    Raises:
      ConversionError: missing / unexpected / mis-shaped keys (all listed).
    """
    check_keys(sd, _expected_keys(cfg, prefix), "mistral", ignore=lambda k: k.endswith(_IGNORED_SUFFIXES))
    d, n, kv, h, f, v = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.intermediate_size, cfg.vocab_size)
    out_shape = {"q_proj": (n, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (d,),
                 "gate_proj": (f,), "up_proj": (f,), "down_proj": (d,)}
    in_shape = {"q_proj": (d,), "k_proj": (d,), "v_proj": (d,), "o_proj": (n, h),
                "gate_proj": (d,), "up_proj": (d,), "down_proj": (f,)}
    L = cfg.num_layers

    def get(k: str) -> np.ndarray:
        return to_numpy(sd[prefix + k])

    leaves: dict[tuple, Leaf] = {
        ("embed_tokens",): Leaf(lambda: get("model.embed_tokens.weight"), (v, d)),
        ("norm", "weight"): Leaf(lambda: get("model.norm.weight"), (d,)),
        ("lm_head",): Leaf(lambda: get("lm_head.weight").T, (d, v)),
    }
    for norm in ("input_layernorm", "post_attention_layernorm"):
        leaves[("layers", norm, "weight")] = Leaf(
            lambda i, norm=norm: get(f"model.layers.{i}.{norm}.weight"), (d,), L)
    for name, hf in _PROJ.items():
        ins, outs = in_shape[name], out_shape[name]
        leaves[("layers", name, "kernel")] = Leaf(
            lambda i, hf=hf, ins=ins, outs=outs: get(f"model.layers.{i}.{hf}.weight").T.reshape(ins + outs),
            ins + outs, L)
        if cfg.lora_rank and name in cfg.lora_targets:
            r = cfg.lora_rank
            leaves[("layers", name, "lora_a")] = Leaf(
                lambda i, hf=hf, ins=ins: get(f"model.layers.{i}.{hf}.lora_A.weight").T.reshape(ins + (r,)),
                ins + (r,), L)
            leaves[("layers", name, "lora_b")] = Leaf(
                lambda i, hf=hf, outs=outs: get(f"model.layers.{i}.{hf}.lora_B.weight").T.reshape((r,) + outs),
                (r,) + outs, L)
    return leaves


def evaluate_leaf(leaf: Leaf, dtype: Any) -> np.ndarray:
    """A :class:`Leaf`'s full array in ``dtype`` (stacked leaves filled layer by layer)."""
    if not leaf.layers:
        return np.asarray(leaf.fn()).astype(dtype)
    out = np.empty((leaf.layers,) + leaf.shape, dtype)
    for i in range(leaf.layers):
        out[i] = leaf.fn(i)
    return out


def mistral_pure_dict(sd: Mapping[str, Any], cfg: MistralConfig, prefix: str = "") -> dict[str, Any]:
    """HF-layout state dict -> nested pure dict of numpy arrays in our layout (param_dtype).

    Args:
      sd: ``{name: array}`` with HF names (optionally under ``prefix``) and, when
        ``cfg.lora_rank > 0``, normalized LoRA names ``<module>.lora_{A,B}.weight``.
      cfg: target model config.

    Raises:
      ConversionError: missing / unexpected / mis-shaped keys (all listed).
    """
    dt = jnp.dtype(cfg.param_dtype) if isinstance(cfg.param_dtype, str) else cfg.param_dtype
    out: dict[str, Any] = {}
    for path, leaf in mistral_leaves(sd, cfg, prefix).items():
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = evaluate_leaf(leaf, dt)
    return out


def convert_mistral(sd: Mapping[str, Any], cfg: MistralConfig, prefix: str = "") -> nnx.State:
    """HF Mistral state dict -> ``nnx.State`` of ``Mistral(cfg)`` (see module docstring for the map)."""
    pure = mistral_pure_dict(sd, cfg, prefix)
    return state_from_pure_dict(nnx.state(nnx.eval_shape(lambda: Mistral(cfg, rngs=nnx.Rngs(0)))), pure, "mistral")


def convert_hf_checkpoint(src: str, **overrides: Any) -> tuple[MistralConfig, nnx.State]:
    """HF directory (config.json + weights) -> (config, state), nothing written.

    ``overrides`` set MistralConfig fields (e.g. ``param_dtype="bfloat16"``, ``vocab_size=32284``
    for an already resized checkpoint).

    Raises:
      ConversionError: the weights do not fit config.json (every bad key named).
    """
    cfg = config_from_hf(load_hf_config(src), **overrides)
    return cfg, convert_mistral(load_state_dict(src), cfg)
