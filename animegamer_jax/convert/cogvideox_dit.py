"""Checkpoint converters for the CogVideoX / AnimeGamer DiT: diffusers and SAT -> our NNX state (orbax).

Sources (architecture.md §7.1, §7.2):
  * diffusers `CogVideoXTransformer3DModel` state dicts (`diffusion_pytorch_model*.safetensors`).
    `patch_embed.text_proj` (a single Linear(4096 -> D)) has no counterpart in our DiT, whose 226-token
    prefix is the already-projected representation s_a; it is returned among the extras so a caller
    can apply it to T5 states itself. diffusers has no flow embedding and no LoRA: those parameters
    keep the model's init (flow last layer and LoRA B are zero-initialized, so both are no-ops).
  * SAT checkpoints (`<iter>/mp_rank_00_model_states.pt`, state dict under `module`, DiT keys under
    `model.diffusion_model.`), with the `.original` infix of LoRA-wrapped layers and LoRA
    `matrix_A.{i}` / `matrix_B.{i}` (kept as LoRA params when the target config has `lora_rank > 0`,
    merged into the base weights with scaling `lora_alpha / r` otherwise). The AnimeGamer extras of
    `mixins.patch_embed` (`text_proj`, `ip_proj`, `*_mix_layer_norm`, `mix_proj`) belong to the shot
    encoder and are returned as extras; `mixins.pos_embed.pos_embedding` is dropped (recomputed).

Every converter fails loudly (ConversionError) naming missing, unexpected and mis-shaped keys.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax import paths
from animegamer_jax.models.cogvideox_dit import CogVideoXDiT, DiTConfig

SAT_PREFIX = "model.diffusion_model."
Flat = dict[tuple[str, ...], np.ndarray]


class ConversionError(ValueError):
    """A checkpoint does not match the target configuration (message lists every offending key)."""


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor (bf16/fp16 included) -> float32 numpy
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _check(sd: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], optional: set[str],
           source: str) -> None:
    missing = sorted(k for k in expected if k not in sd and k not in optional)
    unexpected = sorted(k for k in sd if k not in expected)
    misshaped = sorted(f"{k}: got {tuple(np.shape(sd[k]))}, expected {expected[k]}"
                       for k in sd if k in expected and tuple(np.shape(sd[k])) != tuple(expected[k]))
    if missing or unexpected or misshaped:
        parts = [f"{source} state dict does not match the DiT config:"]
        for name, items in (("missing keys", missing), ("unexpected keys", unexpected),
                            ("mis-shaped keys", misshaped)):
            if items:
                parts.append(f"  {name} ({len(items)}): " + ", ".join(items[:20]) + (" ..." if len(items) > 20 else ""))
        raise ConversionError("\n".join(parts))


def _dims(cfg: DiTConfig) -> tuple[int, ...]:
    p = cfg.patch_size
    return (cfg.hidden_size, cfg.time_embed_dim, cfg.mlp_dim, cfg.num_heads, cfg.head_dim,
            cfg.in_channels, cfg.out_channels, p)


def diffusers_expected_shapes(cfg: DiTConfig, text_embed_dim: int) -> dict[str, tuple[int, ...]]:
    """diffusers key -> shape for a `CogVideoXTransformer3DModel` matching `cfg` (sin-cos, patch 2-D)."""
    D, E, F, N, H, C, Co, p = _dims(cfg)
    s = {
        "patch_embed.proj.weight": (D, C, p, p), "patch_embed.proj.bias": (D,),
        "patch_embed.text_proj.weight": (D, text_embed_dim), "patch_embed.text_proj.bias": (D,),
        "time_embedding.linear_1.weight": (E, D), "time_embedding.linear_1.bias": (E,),
        "time_embedding.linear_2.weight": (E, E), "time_embedding.linear_2.bias": (E,),
        "norm_final.weight": (D,), "norm_final.bias": (D,),
        "norm_out.linear.weight": (2 * D, E), "norm_out.linear.bias": (2 * D,),
        "norm_out.norm.weight": (D,), "norm_out.norm.bias": (D,),
        "proj_out.weight": (Co * p * p, D), "proj_out.bias": (Co * p * p,),
    }
    for l in range(cfg.num_layers):
        b = f"transformer_blocks.{l}."
        for n in ("norm1", "norm2"):
            s[b + n + ".linear.weight"] = (6 * D, E)
            s[b + n + ".linear.bias"] = (6 * D,)
            s[b + n + ".norm.weight"] = (D,)
            s[b + n + ".norm.bias"] = (D,)
        for n in ("to_q", "to_k", "to_v", "to_out.0"):
            s[b + f"attn1.{n}.weight"] = (D, D)
            s[b + f"attn1.{n}.bias"] = (D,)
        for n in ("norm_q", "norm_k"):
            s[b + f"attn1.{n}.weight"] = (H,)
            s[b + f"attn1.{n}.bias"] = (H,)
        s[b + "ff.net.0.proj.weight"] = (F, D)
        s[b + "ff.net.0.proj.bias"] = (F,)
        s[b + "ff.net.2.weight"] = (D, F)
        s[b + "ff.net.2.bias"] = (D,)
    return s


# Diffusers norm1.linear holds SAT adaLN chunks 0,1,2 (video msa) then 6,7,8 (text msa); norm2 the mlp ones.
_NORM1_CHUNKS = (0, 1, 2, 6, 7, 8)
_NORM2_CHUNKS = (3, 4, 5, 9, 10, 11)


def _top_level(cfg: DiTConfig, get: Any, patch_w: str, patch_b: str, t1: str, t2: str, fn: str,
               ada: str, on: str, po: str) -> Flat:
    D, E, F, N, H, C, Co, p = _dims(cfg)
    flat: Flat = {
        ("patch_kernel",): get(patch_w + ".weight").reshape(D, -1).T,
        ("patch_bias",): get(patch_b + ".bias"),
        ("time_embed", "linear_1_kernel"): get(t1 + ".weight").T,
        ("time_embed", "linear_1_bias"): get(t1 + ".bias"),
        ("time_embed", "linear_2_kernel"): get(t2 + ".weight").T,
        ("time_embed", "linear_2_bias"): get(t2 + ".bias"),
        ("final_norm_scale",): get(fn + ".weight"),
        ("final_norm_bias",): get(fn + ".bias"),
        ("out_adaln_kernel",): get(ada + ".weight").T.reshape(E, 2, D),
        ("out_adaln_bias",): get(ada + ".bias").reshape(2, D),
        ("out_norm_scale",): get(on + ".weight"),
        ("out_norm_bias",): get(on + ".bias"),
        ("proj_out_kernel",): get(po + ".weight").T,
        ("proj_out_bias",): get(po + ".bias"),
    }
    return flat


def _stack(per_layer: list[dict[str, np.ndarray]]) -> Flat:
    return {("blocks", k): np.stack([d[k] for d in per_layer]) for k in per_layer[0]}


def from_diffusers(state_dict: Mapping[str, Any], cfg: DiTConfig) -> tuple[Flat, dict[str, np.ndarray]]:
    """Converts a diffusers `CogVideoXTransformer3DModel` state dict (architecture.md §7.2).

    Args:
      state_dict: diffusers key -> tensor/array (torch tensors accepted).
      cfg: target DiT config (the sizes must match the checkpoint).

    Returns:
      (params, extras): params maps our parameter paths to float32 numpy arrays (everything except
      the flow embedding and LoRA, which diffusers does not have); extras holds
      `text_proj.weight` [D, text_dim] and `text_proj.bias` [D] (torch layout).

    Raises:
      ConversionError: missing / unexpected / mis-shaped keys (all listed), or a RoPE / learned
        position / 3-D patch checkpoint (keys that a sin-cos model does not have).
    """
    sd = {k: _np(v) for k, v in state_dict.items() if not k.endswith("pos_embedding")}
    text_dim = sd["patch_embed.text_proj.weight"].shape[1] if "patch_embed.text_proj.weight" in sd else 0
    _check(sd, diffusers_expected_shapes(cfg, text_dim), set(), "diffusers")
    D, E, F, N, H, C, Co, p = _dims(cfg)
    get = sd.__getitem__
    flat = _top_level(cfg, get, "patch_embed.proj", "patch_embed.proj", "time_embedding.linear_1",
                      "time_embedding.linear_2", "norm_final", "norm_out.linear", "norm_out.norm", "proj_out")
    layers = []
    for l in range(cfg.num_layers):
        b = f"transformer_blocks.{l}."
        ada_w = np.zeros((E, 12, D), np.float32)
        ada_b = np.zeros((12, D), np.float32)
        for n, chunks in (("norm1", _NORM1_CHUNKS), ("norm2", _NORM2_CHUNKS)):
            w = get(b + n + ".linear.weight").reshape(6, D, E)
            bb = get(b + n + ".linear.bias").reshape(6, D)
            for j, c in enumerate(chunks):
                ada_w[:, c] = w[j].T
                ada_b[c] = bb[j]
        qkv_w = np.stack([get(b + f"attn1.to_{n}.weight").T.reshape(D, N, H) for n in "qkv"], axis=1)
        qkv_b = np.stack([get(b + f"attn1.to_{n}.bias").reshape(N, H) for n in "qkv"], axis=0)
        layers.append({
            "norm1_scale": get(b + "norm1.norm.weight"), "norm1_bias": get(b + "norm1.norm.bias"),
            "norm2_scale": get(b + "norm2.norm.weight"), "norm2_bias": get(b + "norm2.norm.bias"),
            "adaln_kernel": ada_w, "adaln_bias": ada_b,
            "qkv_kernel": qkv_w, "qkv_bias": qkv_b,
            "q_norm_scale": get(b + "attn1.norm_q.weight"), "q_norm_bias": get(b + "attn1.norm_q.bias"),
            "k_norm_scale": get(b + "attn1.norm_k.weight"), "k_norm_bias": get(b + "attn1.norm_k.bias"),
            "out_kernel": get(b + "attn1.to_out.0.weight").T.reshape(N, H, D),
            "out_bias": get(b + "attn1.to_out.0.bias"),
            "mlp_in_kernel": get(b + "ff.net.0.proj.weight").T, "mlp_in_bias": get(b + "ff.net.0.proj.bias"),
            "mlp_out_kernel": get(b + "ff.net.2.weight").T, "mlp_out_bias": get(b + "ff.net.2.bias"),
        })
    flat.update(_stack(layers))
    extras = {"text_proj.weight": sd["patch_embed.text_proj.weight"],
              "text_proj.bias": sd["patch_embed.text_proj.bias"]}
    return {k: np.asarray(v, np.float32) for k, v in flat.items()}, extras


def sat_expected_shapes(cfg: DiTConfig, lora_rank: int) -> dict[str, tuple[int, ...]]:
    """SAT DiT key (prefix stripped, `.original` removed) -> shape (architecture.md §7.2).

    `lora_rank` > 0 adds `matrix_A.{i}` [r, D] / `matrix_B.{i}` [D, r] for q/k/v (i = 0, 1, 2) and dense (i = 0).
    """
    D, E, F, N, H, C, Co, p = _dims(cfg)
    s = {
        "time_embed.0.weight": (E, D), "time_embed.0.bias": (E,),
        "time_embed.2.weight": (E, E), "time_embed.2.bias": (E,),
        "mixins.patch_embed.proj.weight": (D, C, p, p), "mixins.patch_embed.proj.bias": (D,),
        "transformer.final_layernorm.weight": (D,), "transformer.final_layernorm.bias": (D,),
        "mixins.final_layer.norm_final.weight": (D,), "mixins.final_layer.norm_final.bias": (D,),
        "mixins.final_layer.adaLN_modulation.1.weight": (2 * D, E),
        "mixins.final_layer.adaLN_modulation.1.bias": (2 * D,),
        "mixins.final_layer.linear.weight": (Co * p * p, D), "mixins.final_layer.linear.bias": (Co * p * p,),
    }
    if cfg.use_flow:
        s.update({"flow_embed.0.weight": (E, D), "flow_embed.0.bias": (E,),
                  "flow_embed.2.weight": (E, E), "flow_embed.2.bias": (E,)})
    for l in range(cfg.num_layers):
        t = f"transformer.layers.{l}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            s[t + n + ".weight"] = (D,)
            s[t + n + ".bias"] = (D,)
        s[t + "attention.query_key_value.weight"] = (3 * D, D)
        s[t + "attention.query_key_value.bias"] = (3 * D,)
        s[t + "attention.dense.weight"] = (D, D)
        s[t + "attention.dense.bias"] = (D,)
        if lora_rank:
            for i in range(3):
                s[t + f"attention.query_key_value.matrix_A.{i}"] = (lora_rank, D)
                s[t + f"attention.query_key_value.matrix_B.{i}"] = (D, lora_rank)
            s[t + "attention.dense.matrix_A.0"] = (lora_rank, D)
            s[t + "attention.dense.matrix_B.0"] = (D, lora_rank)
        s[t + "mlp.dense_h_to_4h.weight"] = (F, D)
        s[t + "mlp.dense_h_to_4h.bias"] = (F,)
        s[t + "mlp.dense_4h_to_h.weight"] = (D, F)
        s[t + "mlp.dense_4h_to_h.bias"] = (D,)
        a = "mixins.adaln_layer."
        s[a + f"adaLN_modulations.{l}.1.weight"] = (12 * D, E)
        s[a + f"adaLN_modulations.{l}.1.bias"] = (12 * D,)
        for n in ("query_layernorm_list", "key_layernorm_list"):
            s[a + f"{n}.{l}.weight"] = (H,)
            s[a + f"{n}.{l}.bias"] = (H,)
    return s


_SAT_EXTRA = re.compile(r"^mixins\.patch_embed\.(text_proj|ip_proj|mix_proj|\w+_mix_layer_norm)\.")


def from_sat(state_dict: Mapping[str, Any], cfg: DiTConfig) -> tuple[Flat, dict[str, np.ndarray]]:
    """Converts an AnimeGamer / CogVideoX SAT DiT state dict (architecture.md §4.6, §7.2).

    Args:
      state_dict: the checkpoint dict (`{"module": {...}}` accepted), keys with or without the
        `model.diffusion_model.` prefix; keys of other engine parts (VAE, T5, CLIP) are ignored.
      cfg: target config. With `cfg.lora_rank > 0` LoRA matrices are loaded as LoRA params (their
        rank must equal cfg.lora_rank); with 0 they are merged: `W += (lora_alpha / r) B A` per q/k/v
        chunk and for dense.

    Returns:
      (params, extras): our parameter paths -> float32 arrays (all parameters), and the shot-encoder
      extras (`text_proj.*`, `ip_proj.*`, `*_mix_layer_norm.*`, `mix_proj.*`) by name without
      `mixins.patch_embed.`.

    Raises:
      ConversionError: missing / unexpected / mis-shaped keys, LoRA rank mismatch.
    """
    if "module" in state_dict and isinstance(state_dict["module"], Mapping):
        state_dict = state_dict["module"]
    if any(k.startswith(SAT_PREFIX) for k in state_dict):
        state_dict = {k[len(SAT_PREFIX):]: v for k, v in state_dict.items() if k.startswith(SAT_PREFIX)}
    sd: dict[str, np.ndarray] = {}
    extras: dict[str, np.ndarray] = {}
    for k, v in state_dict.items():
        if k == "mixins.pos_embed.pos_embedding":
            continue
        if _SAT_EXTRA.match(k):
            extras[k[len("mixins.patch_embed."):]] = _np(v)
            continue
        sd[k.replace(".original.", ".")] = _np(v)
    ranks = {v.shape[0] for k, v in sd.items() if ".matrix_A." in k}
    if len(ranks) > 1:
        raise ConversionError(f"SAT state dict has LoRA matrices of several ranks {sorted(ranks)}")
    r = ranks.pop() if ranks else 0
    if r and cfg.lora_rank and r != cfg.lora_rank:
        raise ConversionError(f"SAT LoRA rank {r} does not match cfg.lora_rank {cfg.lora_rank}")
    if cfg.lora_rank and not r:
        raise ConversionError(f"cfg.lora_rank={cfg.lora_rank} but the SAT state dict has no LoRA matrix_A/matrix_B")
    _check(sd, sat_expected_shapes(cfg, r), set(), "SAT")

    D, E, F, N, H, C, Co, p = _dims(cfg)
    get = sd.__getitem__
    scaling = cfg.lora_alpha / r if r else 0.0
    flat = _top_level(cfg, get, "mixins.patch_embed.proj", "mixins.patch_embed.proj", "time_embed.0",
                      "time_embed.2", "transformer.final_layernorm", "mixins.final_layer.adaLN_modulation.1",
                      "mixins.final_layer.norm_final", "mixins.final_layer.linear")
    if cfg.use_flow:
        flat.update({
            ("flow_embed", "linear_1_kernel"): get("flow_embed.0.weight").T,
            ("flow_embed", "linear_1_bias"): get("flow_embed.0.bias"),
            ("flow_embed", "linear_2_kernel"): get("flow_embed.2.weight").T,
            ("flow_embed", "linear_2_bias"): get("flow_embed.2.bias"),
        })
    layers = []
    for l in range(cfg.num_layers):
        t = f"transformer.layers.{l}."
        a = "mixins.adaln_layer."
        qkv = get(t + "attention.query_key_value.weight").astype(np.float64).reshape(3, D, D)
        dense = get(t + "attention.dense.weight").astype(np.float64)
        d = {
            "norm1_scale": get(t + "input_layernorm.weight"), "norm1_bias": get(t + "input_layernorm.bias"),
            "norm2_scale": get(t + "post_attention_layernorm.weight"),
            "norm2_bias": get(t + "post_attention_layernorm.bias"),
            "adaln_kernel": get(a + f"adaLN_modulations.{l}.1.weight").reshape(12, D, E).transpose(2, 0, 1),
            "adaln_bias": get(a + f"adaLN_modulations.{l}.1.bias").reshape(12, D),
            "qkv_bias": get(t + "attention.query_key_value.bias").reshape(3, N, H),
            "q_norm_scale": get(a + f"query_layernorm_list.{l}.weight"),
            "q_norm_bias": get(a + f"query_layernorm_list.{l}.bias"),
            "k_norm_scale": get(a + f"key_layernorm_list.{l}.weight"),
            "k_norm_bias": get(a + f"key_layernorm_list.{l}.bias"),
            "out_bias": get(t + "attention.dense.bias"),
            "mlp_in_kernel": get(t + "mlp.dense_h_to_4h.weight").T, "mlp_in_bias": get(t + "mlp.dense_h_to_4h.bias"),
            "mlp_out_kernel": get(t + "mlp.dense_4h_to_h.weight").T, "mlp_out_bias": get(t + "mlp.dense_4h_to_h.bias"),
        }
        if r:
            qa = np.stack([get(t + f"attention.query_key_value.matrix_A.{i}") for i in range(3)])  # [3, r, D]
            qb = np.stack([get(t + f"attention.query_key_value.matrix_B.{i}") for i in range(3)])  # [3, D, r]
            da, db = get(t + "attention.dense.matrix_A.0"), get(t + "attention.dense.matrix_B.0")
            if cfg.lora_rank:
                d["qkv_lora_a"] = qa.transpose(0, 2, 1)
                d["qkv_lora_b"] = qb.transpose(0, 2, 1).reshape(3, r, N, H)
                d["out_lora_a"] = da.T.reshape(N, H, r)
                d["out_lora_b"] = db.T
            else:
                qkv = qkv + scaling * np.einsum("kor,kri->koi", qb.astype(np.float64), qa.astype(np.float64))
                dense = dense + scaling * (db.astype(np.float64) @ da.astype(np.float64))
        d["qkv_kernel"] = qkv.transpose(2, 0, 1).reshape(D, 3, N, H)
        d["out_kernel"] = dense.T.reshape(N, H, D)
        layers.append(d)
    flat.update(_stack(layers))
    return {k: np.asarray(v, np.float32) for k, v in flat.items()}, extras


def load_params(model: CogVideoXDiT, params: Flat, keep_init: tuple[str, ...] = ()) -> CogVideoXDiT:
    """Writes converted `params` into `model` (in place) after checking every path and shape.

    Args:
      model: a built CogVideoXDiT.
      params: output of `from_diffusers` / `from_sat`.
      keep_init: top-level path names allowed to be absent (they keep the model's init), e.g.
        `("flow_embed", "lora")` for diffusers checkpoints; "lora" matches the LoRA factors.

    Raises:
      ConversionError: missing, unexpected or mis-shaped parameter paths.
    """
    state = nnx.state(model, nnx.Param)
    target = {tuple(str(p) for p in path): v for path, v in state.flat_state()}

    def allowed(path: tuple[str, ...]) -> bool:
        return any(k in path or (k == "lora" and "lora" in path[-1]) for k in keep_init)

    expected = {p: tuple(v.get_raw_value().shape) for p, v in target.items()}
    missing = sorted(".".join(p) for p in expected if p not in params and not allowed(p))
    unexpected = sorted(".".join(p) for p in params if p not in expected)
    misshaped = sorted(f"{'.'.join(p)}: got {params[p].shape}, expected {expected[p]}"
                       for p in params if p in expected and tuple(params[p].shape) != expected[p])
    if missing or unexpected or misshaped:
        raise ConversionError(
            "converted parameters do not match the model:"
            + (f"\n  missing: {', '.join(missing)}" if missing else "")
            + (f"\n  unexpected: {', '.join(unexpected)}" if unexpected else "")
            + (f"\n  mis-shaped: {', '.join(misshaped)}" if misshaped else ""))
    for path, var in target.items():
        if path in params:
            var.set_value(jnp.asarray(params[path], var.get_raw_value().dtype))
    return model


def build_model(cfg: DiTConfig, params: Flat, keep_init: tuple[str, ...] = (), seed: int = 0) -> CogVideoXDiT:
    """Builds a CogVideoXDiT from converted params (see `load_params`)."""
    return load_params(CogVideoXDiT(cfg, rngs=nnx.Rngs(seed)), params, keep_init)


def read_torch_state_dict(path: str) -> dict[str, Any]:
    """Reads a diffusers directory / `.safetensors` file or a SAT checkpoint directory / `.pt` file.

    A SAT directory holds `latest` (iteration or `release`) and `<it>/mp_rank_00_model_states.pt`.
    Raises FileNotFoundError when nothing known is found.
    """
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "latest")):
            with open(os.path.join(path, "latest")) as f:
                it = f.read().strip()
            return read_torch_state_dict(os.path.join(path, it, "mp_rank_00_model_states.pt"))
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors or SAT `latest` under {path}")
        out: dict[str, Any] = {}
        for f in files:
            out.update(read_torch_state_dict(os.path.join(path, f)))
        return out
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file
        try:
            return dict(load_file(path))
        except TypeError:  # bf16 tensors need torch
            from safetensors.torch import load_file as load_torch
            return dict(load_torch(path))
    import torch
    return torch.load(path, map_location="cpu", weights_only=False)


def save_orbax(model: CogVideoXDiT, directory: str) -> None:
    """Saves the model's Param state as an orbax checkpoint (item `dit`) plus its DiTConfig."""
    import json

    import orbax.checkpoint as ocp

    directory = paths.makedirs(directory)  # local or a URL (gs://...)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(directory / "dit", nnx.state(model, nnx.Param).to_pure_dict(), force=True)
    (directory / "dit_config.json").write_text(json.dumps(dataclasses.asdict(model.cfg), indent=1))


def load_orbax(directory: str) -> CogVideoXDiT:
    """Restores a model written by `save_orbax`."""
    import json

    import orbax.checkpoint as ocp

    directory = paths.as_path(directory)
    cfg = DiTConfig(**json.loads((directory / "dit_config.json").read_text()))
    model = nnx.eval_shape(lambda: CogVideoXDiT(cfg, rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state.to_pure_dict())
    with ocp.StandardCheckpointer() as ckpt:
        pure = ckpt.restore(directory / "dit", abstract)
    state.replace_by_pure_dict(pure)
    nnx.update(model, state)
    return model


def convert(kind: str, src: str, dst: str, cfg: DiTConfig) -> dict[str, np.ndarray]:
    """Converts a `kind` ("diffusers" or "sat") checkpoint at `src` to an orbax directory `dst`.

    Returns the extras (shot-encoder / text-projection weights), which the caller converts further.
    """
    sd = read_torch_state_dict(src)
    if kind == "diffusers":
        params, extras = from_diffusers(sd, cfg)
        model = build_model(cfg, params, keep_init=("flow_embed", "lora"))
    elif kind == "sat":
        params, extras = from_sat(sd, cfg)
        model = build_model(cfg, params)
    else:
        raise ValueError(f"unknown checkpoint kind {kind!r}; use 'diffusers' or 'sat'")
    save_orbax(model, dst)
    return extras


def main(argv: list[str] | None = None) -> None:
    """CLI: `python -m animegamer_jax.convert.cogvideox_dit --kind sat --src DIR --dst DIR [--config PY]`.

    The DiT sizes come from the config's `dit` section (default configs/animegamer_2b_7b.py); extras
    (text/ip projections, mix LayerNorms) are saved beside the checkpoint as `dit_extras.npz`.
    """
    import argparse
    import importlib.util

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--kind", choices=("sat", "diffusers"), required=True)
    ap.add_argument("--src", required=True, help="SAT checkpoint dir / .pt, or diffusers dir / .safetensors")
    ap.add_argument("--dst", required=True, help="output directory (orbax item `dit` + dit_config.json)")
    ap.add_argument("--config", default="configs/animegamer_2b_7b.py")
    args = ap.parse_args(argv)
    spec = importlib.util.spec_from_file_location("dit_cfg", args.config)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = DiTConfig.from_config(mod.get_config().dit)
    extras = convert(args.kind, args.src, args.dst, cfg)
    with paths.as_path(paths.join(args.dst, "dit_extras.npz")).open("wb") as f:
        np.savez(f, **extras)
    print(f"wrote {args.dst}: DiT {cfg.num_layers} layers x {cfg.hidden_size}, extras {sorted(extras)}")


if __name__ == "__main__":
    main()
