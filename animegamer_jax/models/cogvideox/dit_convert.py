"""Checkpoint converters for the CogVideoX / AnimeGamer DiT: diffusers and SAT -> our NNX state (orbax).

Sources (docs/checkpoints.md#release-files, docs/dit.md#checkpoint-keys):
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
import json
import re
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.weights import (ConversionError, check_keys, raise_key_problems, restore_state, save_state,
                                    to_numpy)
from animegamer_jax.models.cogvideox.dit import CogVideoXDiT, DiTConfig

SAT_PREFIX = "model.diffusion_model."
Flat = dict[tuple[str, ...], np.ndarray]


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


def _stack(per_layer: list[Flat]) -> Flat:
    return {("blocks",) + k: np.stack([d[k] for d in per_layer]) for k in per_layer[0]}


def _heads(w: np.ndarray, cfg: DiTConfig) -> np.ndarray:
    """torch Linear(D -> N*H) weight [N*H, D] -> our head-split kernel [D, N, H]."""
    return w.T.reshape(cfg.hidden_size, cfg.num_heads, cfg.head_dim)


def _block_params(cfg: DiTConfig, norm1: tuple, norm2: tuple, adaln: tuple, qkv_w: list, qkv_b: list,
                  norm_q: tuple, norm_k: tuple, out: tuple, ff_in: tuple, ff_out: tuple) -> Flat:
    """Our block paths (models/cogvideox/dit.py `DiTBlock`) from torch-layout pieces; the one key table.

    Every argument is (weight, bias) in torch layout, except `adaln` (kernel [E, 12, D], bias [12, D],
    already in SAT chunk order) and `qkv_w` / `qkv_b` (three [D, D] / [D] for q, k, v).
    """
    N, H = cfg.num_heads, cfg.head_dim
    flat: Flat = {("norm1", "scale"): norm1[0], ("norm1", "bias"): norm1[1],
                  ("norm2", "scale"): norm2[0], ("norm2", "bias"): norm2[1],
                  ("adaln", "kernel"): adaln[0], ("adaln", "bias"): adaln[1],
                  ("attn1", "norm_q", "scale"): norm_q[0], ("attn1", "norm_q", "bias"): norm_q[1],
                  ("attn1", "norm_k", "scale"): norm_k[0], ("attn1", "norm_k", "bias"): norm_k[1],
                  ("attn1", "to_out", "kernel"): out[0].T.reshape(N, H, -1), ("attn1", "to_out", "bias"): out[1],
                  ("ff", "proj_in", "kernel"): ff_in[0].T, ("ff", "proj_in", "bias"): ff_in[1],
                  ("ff", "proj_out", "kernel"): ff_out[0].T, ("ff", "proj_out", "bias"): ff_out[1]}
    for n, w, bias in zip(("to_q", "to_k", "to_v"), qkv_w, qkv_b):
        flat[("attn1", n, "kernel")] = _heads(w, cfg)
        flat[("attn1", n, "bias")] = bias.reshape(N, H)
    return flat


def block_from_diffusers(sd: Mapping[str, np.ndarray], prefix: str, cfg: DiTConfig) -> Flat:
    """One diffusers `CogVideoXBlock` (keys under `prefix`) -> our `DiTBlock` paths (docs/dit.md#checkpoint-keys).

    diffusers' `norm1.linear` / `norm2.linear` (6 chunks each) are merged into the 12-chunk `adaln`.
    """
    D, E = cfg.hidden_size, cfg.time_embed_dim
    get = lambda k: sd[prefix + k]  # noqa: E731
    ada_w = np.zeros((E, 12, D), np.float32)
    ada_b = np.zeros((12, D), np.float32)
    for n, chunks in (("norm1", _NORM1_CHUNKS), ("norm2", _NORM2_CHUNKS)):
        w = get(n + ".linear.weight").reshape(6, D, E)
        bb = get(n + ".linear.bias").reshape(6, D)
        for j, c in enumerate(chunks):
            ada_w[:, c] = w[j].T
            ada_b[c] = bb[j]
    pair = lambda k: (get(k + ".weight"), get(k + ".bias"))  # noqa: E731
    return _block_params(
        cfg, pair("norm1.norm"), pair("norm2.norm"), (ada_w, ada_b),
        [get(f"attn1.to_{n}.weight") for n in "qkv"], [get(f"attn1.to_{n}.bias") for n in "qkv"],
        pair("attn1.norm_q"), pair("attn1.norm_k"), pair("attn1.to_out.0"), pair("ff.net.0.proj"), pair("ff.net.2"))


def from_diffusers(state_dict: Mapping[str, Any], cfg: DiTConfig) -> tuple[Flat, dict[str, np.ndarray]]:
    """Converts a diffusers `CogVideoXTransformer3DModel` state dict (docs/dit.md#checkpoint-keys).

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
    sd = {k: to_numpy(v) for k, v in state_dict.items() if not k.endswith("pos_embedding")}
    text_dim = sd["patch_embed.text_proj.weight"].shape[1] if "patch_embed.text_proj.weight" in sd else 0
    check_keys(sd, diffusers_expected_shapes(cfg, text_dim), "diffusers DiT", limit=20)
    D, E, F, N, H, C, Co, p = _dims(cfg)
    get = sd.__getitem__
    flat = _top_level(cfg, get, "patch_embed.proj", "patch_embed.proj", "time_embedding.linear_1",
                      "time_embedding.linear_2", "norm_final", "norm_out.linear", "norm_out.norm", "proj_out")
    layers = [block_from_diffusers(sd, f"transformer_blocks.{l}.", cfg) for l in range(cfg.num_layers)]
    flat.update(_stack(layers))
    extras = {"text_proj.weight": sd["patch_embed.text_proj.weight"],
              "text_proj.bias": sd["patch_embed.text_proj.bias"]}
    return {k: np.asarray(v, np.float32) for k, v in flat.items()}, extras


def sat_expected_shapes(cfg: DiTConfig, lora_rank: int) -> dict[str, tuple[int, ...]]:
    """SAT DiT key (prefix stripped, `.original` removed) -> shape (docs/dit.md#checkpoint-keys).

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


def sat_prepare(state_dict: Mapping[str, Any], cfg: DiTConfig) -> tuple[dict[str, Any], dict[str, np.ndarray], int]:
    """The checks of :func:`from_sat`: (DiT keys without prefix / `.original`, shot-encoder extras, LoRA rank).

    Values stay as given (e.g. memory-mapped tensors, read later by :func:`sat_layer`).

    Raises:
      ConversionError: missing / unexpected / mis-shaped keys, LoRA rank mismatch.
    """
    if "module" in state_dict and isinstance(state_dict["module"], Mapping):
        state_dict = state_dict["module"]
    if any(k.startswith(SAT_PREFIX) for k in state_dict):
        state_dict = {k[len(SAT_PREFIX):]: v for k, v in state_dict.items() if k.startswith(SAT_PREFIX)}
    sd: dict[str, Any] = {}
    extras: dict[str, np.ndarray] = {}
    for k, v in state_dict.items():
        if k == "mixins.pos_embed.pos_embedding":
            continue
        if _SAT_EXTRA.match(k):
            extras[k[len("mixins.patch_embed."):]] = to_numpy(v)
            continue
        sd[k.replace(".original.", ".")] = v
    ranks = {int(np.shape(v)[0]) for k, v in sd.items() if ".matrix_A." in k}
    if len(ranks) > 1:
        raise ConversionError(f"SAT state dict has LoRA matrices of several ranks {sorted(ranks)}")
    r = ranks.pop() if ranks else 0
    if r and cfg.lora_rank and r != cfg.lora_rank:
        raise ConversionError(f"SAT LoRA rank {r} does not match cfg.lora_rank {cfg.lora_rank}")
    if cfg.lora_rank and not r:
        raise ConversionError(f"cfg.lora_rank={cfg.lora_rank} but the SAT state dict has no LoRA matrix_A/matrix_B")
    check_keys(sd, sat_expected_shapes(cfg, r), "SAT DiT", limit=20)
    return sd, extras, r


def sat_top_level(sd: Mapping[str, Any], cfg: DiTConfig) -> Flat:
    """The non-block parameters of a prepared SAT state dict (:func:`sat_prepare`), float32."""
    get = lambda k: to_numpy(sd[k])  # noqa: E731
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
    return {k: np.asarray(v, np.float32) for k, v in flat.items()}


def sat_layer(sd: Mapping[str, Any], cfg: DiTConfig, r: int, l: int) -> Flat:
    """Block ``l``'s parameters: our ``DiTBlock`` paths (``("attn1", "to_q", "kernel")``, ...; the
    model's ``blocks/<path>`` leaves without the layer axis), float32.

    LoRA: kept as ``lora_a`` / ``lora_b`` leaves of ``attn1.to_q/to_k/to_v/to_out`` when
    ``cfg.lora_rank > 0``, else merged into the base weights, ``W += (lora_alpha / r) B A`` per
    q/k/v chunk and for dense (docs/dit.md#lora).
    """
    D, E, F, N, H, C, Co, p = _dims(cfg)
    get = lambda k: to_numpy(sd[k])  # noqa: E731
    scaling = cfg.lora_alpha / r if r else 0.0
    t = f"transformer.layers.{l}."
    a = "mixins.adaln_layer."
    pair = lambda k: (get(k + ".weight"), get(k + ".bias"))  # noqa: E731
    qkv = get(t + "attention.query_key_value.weight").astype(np.float64).reshape(3, D, D)
    dense = get(t + "attention.dense.weight").astype(np.float64)
    lora: Flat = {}
    if r:
        qa = [get(t + f"attention.query_key_value.matrix_A.{i}") for i in range(3)]  # [r, D] each
        qb = [get(t + f"attention.query_key_value.matrix_B.{i}") for i in range(3)]  # [D, r] each
        da, db = get(t + "attention.dense.matrix_A.0"), get(t + "attention.dense.matrix_B.0")
        if cfg.lora_rank:
            for n, A, B in zip(("to_q", "to_k", "to_v"), qa, qb):
                lora[("attn1", n, "lora_a")] = A.T
                lora[("attn1", n, "lora_b")] = B.T.reshape(r, N, H)
            lora[("attn1", "to_out", "lora_a")] = da.T.reshape(N, H, r)
            lora[("attn1", "to_out", "lora_b")] = db.T
        else:
            qkv = qkv + scaling * np.stack([B.astype(np.float64) @ A.astype(np.float64) for A, B in zip(qa, qb)])
            dense = dense + scaling * (db.astype(np.float64) @ da.astype(np.float64))
    ada = (get(a + f"adaLN_modulations.{l}.1.weight").reshape(12, D, E).transpose(2, 0, 1),
           get(a + f"adaLN_modulations.{l}.1.bias").reshape(12, D))
    d = _block_params(
        cfg, pair(t + "input_layernorm"), pair(t + "post_attention_layernorm"), ada,
        list(qkv), list(get(t + "attention.query_key_value.bias").reshape(3, D)),
        pair(a + f"query_layernorm_list.{l}"), pair(a + f"key_layernorm_list.{l}"),
        (dense, get(t + "attention.dense.bias")), pair(t + "mlp.dense_h_to_4h"), pair(t + "mlp.dense_4h_to_h"))
    d.update(lora)
    return {k: np.asarray(v, np.float32) for k, v in d.items()}


def from_sat(state_dict: Mapping[str, Any], cfg: DiTConfig) -> tuple[Flat, dict[str, np.ndarray]]:
    """Converts an AnimeGamer / CogVideoX SAT DiT state dict (docs/dit.md#lora, docs/dit.md#checkpoint-keys).

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
    sd, extras, r = sat_prepare(state_dict, cfg)
    flat = sat_top_level(sd, cfg)
    flat.update(_stack([sat_layer(sd, cfg, r, l) for l in range(cfg.num_layers)]))
    return flat, extras


def _check_params(expected: Mapping[tuple[str, ...], tuple[int, ...]], params: Flat,
                  keep_init: tuple[str, ...]) -> None:
    def allowed(path: tuple[str, ...]) -> bool:
        return any(k in path or (k == "lora" and "lora" in path[-1]) for k in keep_init)

    raise_key_problems(
        "converted parameters do not match the model:", sep="\n  ",
        missing=[".".join(p) for p in expected if p not in params and not allowed(p)],
        unexpected=[".".join(p) for p in params if p not in expected],
        mis_shaped=[f"{'.'.join(p)}: got {params[p].shape}, expected {expected[p]}"
                    for p in params if p in expected and tuple(params[p].shape) != expected[p]])


def load_params(model: nnx.Module, params: Flat, keep_init: tuple[str, ...] = ()) -> nnx.Module:
    """Writes converted `params` into `model` (in place) after checking every path and shape.

    Args:
      model: a built CogVideoXDiT (or one `DiTBlock`, with `block_from_diffusers` params).
      params: output of `from_diffusers` / `from_sat`.
      keep_init: top-level path names allowed to be absent (they keep the model's init), e.g.
        `("flow_embed", "lora")` for diffusers checkpoints; "lora" matches the LoRA factors.

    Raises:
      ConversionError: missing, unexpected or mis-shaped parameter paths.
    """
    state = nnx.state(model, nnx.Param)
    target = {tuple(str(p) for p in path): v for path, v in state.flat_state()}
    _check_params({p: tuple(v.get_raw_value().shape) for p, v in target.items()}, params, keep_init)
    for path, var in target.items():
        if path in params:
            var.set_value(jnp.asarray(params[path], var.get_raw_value().dtype))
    return model


def params_to_state(cfg: DiTConfig, params: Flat) -> nnx.State:
    """The ``nnx.State`` of ``CogVideoXDiT(cfg)`` holding converted `params` (no random init: the
    module is only shape-evaluated). Every parameter must be given (no ``keep_init``).

    Raises:
      ConversionError: missing, unexpected or mis-shaped parameter paths.
    """
    state = nnx.state(nnx.eval_shape(lambda: CogVideoXDiT(cfg, rngs=nnx.Rngs(0))))
    flat = [(tuple(str(p) for p in path), v) for path, v in nnx.to_flat_state(state)]
    _check_params({p: tuple(v.get_raw_value().shape) for p, v in flat}, params, ())
    return nnx.from_flat_state([(p, v.replace(np.asarray(params[p], v.get_raw_value().dtype))) for p, v in flat])


def build_model(cfg: DiTConfig, params: Flat, keep_init: tuple[str, ...] = (), seed: int = 0) -> CogVideoXDiT:
    """Builds a CogVideoXDiT from converted params (see `load_params`)."""
    return load_params(CogVideoXDiT(cfg, rngs=nnx.Rngs(seed)), params, keep_init)


def save_orbax(model: CogVideoXDiT, directory: str) -> None:
    """Saves the model's Param state as an orbax checkpoint (item `dit`) plus its DiTConfig."""
    directory = paths.as_path(directory)  # local (made absolute) or a URL (gs://...)
    fileio.makedirs(directory)
    save_state(nnx.state(model, nnx.Param), directory / "dit")
    (directory / "dit_config.json").write_text(json.dumps(dataclasses.asdict(model.cfg), indent=1))


def load_orbax(directory: str) -> CogVideoXDiT:
    """Restores a model written by `save_orbax`."""
    directory = paths.as_path(directory)
    cfg = DiTConfig(**json.loads((directory / "dit_config.json").read_text()))
    model = nnx.eval_shape(lambda: CogVideoXDiT(cfg, rngs=nnx.Rngs(0)))
    nnx.update(model, restore_state(model, directory / "dit"))
    return model


def convert_dit(state_dict: Mapping[str, Any], cfg: DiTConfig, kind: str) -> tuple[CogVideoXDiT, dict[str, np.ndarray]]:
    """A `kind` ("diffusers" or "sat") DiT state dict -> (the model, the extras).

    The extras (shot-encoder / text-projection weights) are returned as arrays for the caller to
    convert further. A diffusers checkpoint has no flow embedding or LoRA: those keep their init.

    Raises:
      ConversionError: keys missing, unexpected or of the wrong shape (every one named).
      ValueError: an unknown `kind`.
    """
    if kind == "diffusers":
        params, extras = from_diffusers(state_dict, cfg)
        return build_model(cfg, params, keep_init=("flow_embed", "lora")), extras
    if kind == "sat":
        params, extras = from_sat(state_dict, cfg)
        return build_model(cfg, params), extras
    raise ValueError(f"unknown checkpoint kind {kind!r}; use 'diffusers' or 'sat'")


# ---------------------------------------------------------------------------------------------
# Migration of checkpoints written before the DiT blocks became NNX modules (same arrays, new nesting).

#: old stacked name -> new path inside `blocks` (the q/k/v entries are split along their "3" axis)
_LEGACY_BLOCK_NAMES: dict[str, tuple[str, ...]] = {
    "norm1_scale": ("norm1", "scale"), "norm1_bias": ("norm1", "bias"),
    "norm2_scale": ("norm2", "scale"), "norm2_bias": ("norm2", "bias"),
    "adaln_kernel": ("adaln", "kernel"), "adaln_bias": ("adaln", "bias"),
    "q_norm_scale": ("attn1", "norm_q", "scale"), "q_norm_bias": ("attn1", "norm_q", "bias"),
    "k_norm_scale": ("attn1", "norm_k", "scale"), "k_norm_bias": ("attn1", "norm_k", "bias"),
    "out_kernel": ("attn1", "to_out", "kernel"), "out_bias": ("attn1", "to_out", "bias"),
    "out_lora_a": ("attn1", "to_out", "lora_a"), "out_lora_b": ("attn1", "to_out", "lora_b"),
    "mlp_in_kernel": ("ff", "proj_in", "kernel"), "mlp_in_bias": ("ff", "proj_in", "bias"),
    "mlp_out_kernel": ("ff", "proj_out", "kernel"), "mlp_out_bias": ("ff", "proj_out", "bias"),
}
#: old fused q/k/v name -> (leaf name, axis of the q/k/v index in the stacked array)
_LEGACY_QKV: dict[str, tuple[str, int]] = {
    "qkv_kernel": ("kernel", 2), "qkv_bias": ("bias", 1), "qkv_lora_a": ("lora_a", 1), "qkv_lora_b": ("lora_b", 1),
}


def is_legacy_blocks(blocks: Mapping[str, Any]) -> bool:
    """True when a DiT `blocks` pure dict has the old flat stacked names (`qkv_kernel`, ...)."""
    return "qkv_kernel" in blocks


def migrate_legacy_blocks(blocks: Mapping[str, Any]) -> dict[str, Any]:
    """Old flat `blocks` dict (`DiTBlocks`: `qkv_kernel` [num_layers, D, 3, N, H], ...) -> the `DiTBlock` nesting.

    Every array is kept bit for bit; the fused q/k/v arrays are split into `attn1.to_q/to_k/to_v`.

    Raises:
      ConversionError: a name that is neither an old block name nor q/k/v (listed).
    """
    unknown = sorted(k for k in blocks if k not in _LEGACY_BLOCK_NAMES and k not in _LEGACY_QKV)
    if unknown:
        raise ConversionError(f"not an old DiT block dict: unknown names {unknown}")
    out: dict[str, Any] = {}

    def put(path: tuple[str, ...], value: Any) -> None:
        d = out
        for p in path[:-1]:
            d = d.setdefault(p, {})
        d[path[-1]] = value

    for name, value in blocks.items():
        if name in _LEGACY_QKV:
            leaf, axis = _LEGACY_QKV[name]
            for i, n in enumerate(("to_q", "to_k", "to_v")):
                put(("attn1", n, leaf), np.take(np.asarray(value), i, axis=axis))
        else:
            put(_LEGACY_BLOCK_NAMES[name], value)
    return out
