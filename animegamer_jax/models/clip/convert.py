"""open_clip / HF CLIP state dicts -> our :mod:`animegamer_jax.models.clip.model` parameters.

Two source layouts (auto-detected, or forced with ``layout=``):

* **open_clip** (``ViT-B-16`` / ``laion2b_s34b_b88k``, what the release loads, docs/encoders.md#clip-image-tower):
  ``visual.conv1.weight``, ``visual.class_embedding``, ``visual.positional_embedding``,
  ``visual.ln_pre``, ``visual.transformer.resblocks.{i}.{ln_1, attn.in_proj_weight/bias,
  attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}``, ``visual.ln_post``, ``visual.proj`` [D, E],
  ``token_embedding``, ``positional_embedding``, ``transformer.resblocks.{i}...``, ``ln_final``,
  ``text_projection`` [D, E], ``logit_scale``.
* **HF** ``CLIPModel`` / ``CLIPVisionModel``: ``vision_model.embeddings.{patch_embedding,
  class_embedding, position_embedding}``, ``vision_model.pre_layrnorm``,
  ``vision_model.encoder.layers.{i}.{self_attn.{q,k,v,out}_proj, layer_norm1, mlp.fc1, mlp.fc2,
  layer_norm2}``, ``vision_model.post_layernorm``, ``visual_projection`` [E, D], ``text_model.*``,
  ``text_projection`` [E, D], ``logit_scale``; the ``vision_model.`` prefix may be absent.

Conversion is strict: any target parameter left unfilled, any source key left unused, and any
shape mismatch raises :class:`ConversionError` naming every offending key. With
``vision_only=True`` the text tower / projection keys of a full checkpoint are skipped on purpose
(the release deletes the text tower).

The activation is not in the weights: read it from the checkpoint's config
(:func:`config_from_hf` / :func:`config_from_open_clip`); OpenAI CLIP uses ``quick_gelu``, the
laion2b ViT-B-16 exact ``gelu``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.weights import ConversionError, StateDictReader, fill_state
from animegamer_jax.models.clip.model import CLIP, CLIPConfig, CLIPVisionTransformer

def detect_layout(state_dict: Mapping[str, Any]) -> str:
    """Returns ``"open_clip"`` or ``"hf"`` from the key names."""
    keys = list(state_dict)
    if any(k.startswith(("visual.", "conv1.", "transformer.resblocks.")) or k == "class_embedding" for k in keys):
        return "open_clip"
    return "hf"


def _blocks_open_clip(r: StateDictReader, prefix: str, n: int, d: int, heads: int) -> dict[tuple, Any]:
    hd = d // heads
    f = prefix + "resblocks.{}."
    in_w = r.stack(f + "attn.in_proj_weight", n)
    in_b = r.stack(f + "attn.in_proj_bias", n)
    out: dict[tuple, Any] = {}
    for j, name in enumerate("qkv"):
        # in_proj_weight rows are [q; k; v], each (D_out, D_in) for y = x W^T.
        out[("attn", f"{name}_kernel")] = (None if in_w is None else
                                           in_w[:, j * d:(j + 1) * d].transpose(0, 2, 1).reshape(n, d, heads, hd))
        out[("attn", f"{name}_bias")] = None if in_b is None else in_b[:, j * d:(j + 1) * d].reshape(n, heads, hd)
    out[("attn", "o_kernel")] = r.stack(f + "attn.out_proj.weight", n, lambda w: w.T.reshape(heads, hd, d))
    out[("attn", "o_bias")] = r.stack(f + "attn.out_proj.bias", n)
    for ours, theirs in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
        out[(ours, "scale")] = r.stack(f + theirs + ".weight", n)
        out[(ours, "bias")] = r.stack(f + theirs + ".bias", n)
    for ours in ("c_fc", "c_proj"):
        out[(ours, "kernel")] = r.stack(f + f"mlp.{ours}.weight", n, lambda w: w.T)
        out[(ours, "bias")] = r.stack(f + f"mlp.{ours}.bias", n)
    return out


def _blocks_hf(r: StateDictReader, prefix: str, n: int, d: int, heads: int) -> dict[tuple, Any]:
    hd = d // heads
    f = prefix + "encoder.layers.{}."
    out: dict[tuple, Any] = {}
    for name in "qkv":
        out[("attn", f"{name}_kernel")] = r.stack(f + f"self_attn.{name}_proj.weight", n,
                                                  lambda w: w.T.reshape(d, heads, hd))
        out[("attn", f"{name}_bias")] = r.stack(f + f"self_attn.{name}_proj.bias", n, lambda b: b.reshape(heads, hd))
    out[("attn", "o_kernel")] = r.stack(f + "self_attn.out_proj.weight", n, lambda w: w.T.reshape(heads, hd, d))
    out[("attn", "o_bias")] = r.stack(f + "self_attn.out_proj.bias", n)
    for ours, theirs in (("ln_1", "layer_norm1"), ("ln_2", "layer_norm2")):
        out[(ours, "scale")] = r.stack(f + theirs + ".weight", n)
        out[(ours, "bias")] = r.stack(f + theirs + ".bias", n)
    for ours, theirs in (("c_fc", "fc1"), ("c_proj", "fc2")):
        out[(ours, "kernel")] = r.stack(f + f"mlp.{theirs}.weight", n, lambda w: w.T)
        out[(ours, "bias")] = r.stack(f + f"mlp.{theirs}.bias", n)
    return out


def _ln(r: StateDictReader, ours: tuple, theirs: str) -> dict[tuple, Any]:
    return {ours + ("scale",): r.get(theirs + ".weight"), ours + ("bias",): r.get(theirs + ".bias")}


def _prefixed(base: tuple, d: Mapping[tuple, Any]) -> dict[tuple, Any]:
    return {base + k: v for k, v in d.items()}


def _conv(w: np.ndarray | None) -> np.ndarray | None:
    # torch conv [D, C, p, p] -> ours [p, p, C, D], matching the (row, col, channel) patch flattening.
    return None if w is None else w.transpose(2, 3, 1, 0)


def _vision_values(r: StateDictReader, cfg: CLIPConfig, layout: str) -> dict[tuple, Any]:
    d, n, h = cfg.vision_width, cfg.vision_layers, cfg.vision_heads
    if layout == "open_clip":
        p = "visual."
        v = {
            ("conv1",): _conv(r.get(p + "conv1.weight")),
            ("class_embedding",): r.get(p + "class_embedding"),
            ("positional_embedding",): r.get(p + "positional_embedding"),
            **_ln(r, ("ln_pre",), p + "ln_pre"),
            **_ln(r, ("ln_post",), p + "ln_post"),
            **_prefixed(("blocks",), _blocks_open_clip(r, p + "transformer.", n, d, h)),
        }
    else:
        p = "vision_model." if any(k.startswith("vision_model.") for k in r.sd) else ""
        v = {
            ("conv1",): _conv(r.get(p + "embeddings.patch_embedding.weight")),
            ("class_embedding",): r.get(p + "embeddings.class_embedding"),
            ("positional_embedding",): r.get(p + "embeddings.position_embedding.weight"),
            **_ln(r, ("ln_pre",), p + "pre_layrnorm"),
            **_ln(r, ("ln_post",), p + "post_layernorm"),
            **_prefixed(("blocks",), _blocks_hf(r, p, n, d, h)),
        }
    return v


def _text_values(r: StateDictReader, cfg: CLIPConfig, layout: str) -> dict[tuple, Any]:
    d, n, h = cfg.text_width, cfg.text_layers, cfg.text_heads
    if layout == "open_clip":
        return {
            ("text", "token_embedding"): r.get("token_embedding.weight"),
            ("text", "positional_embedding"): r.get("positional_embedding"),
            **_ln(r, ("text", "ln_final"), "ln_final"),
            **_prefixed(("text", "blocks"), _blocks_open_clip(r, "transformer.", n, d, h)),
            ("visual_projection",): r.get("visual.proj"),
            ("text_projection",): r.get("text_projection"),
            ("logit_scale",): r.get("logit_scale"),
        }
    p = "text_model."
    vp, tp = r.get("visual_projection.weight"), r.get("text_projection.weight")
    return {
        ("text", "token_embedding"): r.get(p + "embeddings.token_embedding.weight"),
        ("text", "positional_embedding"): r.get(p + "embeddings.position_embedding.weight"),
        **_ln(r, ("text", "ln_final"), p + "final_layer_norm"),
        **_prefixed(("text", "blocks"), _blocks_hf(r, p, n, d, h)),
        ("visual_projection",): None if vp is None else vp.T,
        ("text_projection",): None if tp is None else tp.T,
        ("logit_scale",): r.get("logit_scale"),
    }


def _is_text_key(k: str) -> bool:
    return k.startswith(("text_model.", "text_projection", "visual_projection", "logit_scale", "token_embedding",
                         "positional_embedding", "transformer.", "ln_final", "visual.proj"))


def convert_clip(state_dict: Mapping[str, Any], cfg: CLIPConfig, *, vision_only: bool = False,
                 layout: str = "auto") -> nnx.State:
    """Converts an open_clip or HF CLIP state dict to the Param state of our model.

    Args:
      state_dict: name -> torch tensor / numpy array.
      cfg: target sizes (must match the checkpoint; the activation is not checked by weights).
      vision_only: target :class:`CLIPVisionTransformer` (f_v extraction); text tower and
        projection keys in the source are then skipped. Else target :class:`CLIP`.
      layout: ``"auto"``, ``"open_clip"`` or ``"hf"``.

    Returns:
      ``nnx.State`` of Params (float32 numpy leaves) for ``CLIP(cfg)`` or
      ``CLIPVisionTransformer(cfg)``; apply with ``nnx.update(model, state)``.

    Raises:
      ConversionError: missing / unexpected / mis-shaped keys (all listed), or a bad layout.
    """
    if layout == "auto":
        layout = detect_layout(state_dict)
    if layout not in ("open_clip", "hf"):
        raise ConversionError(f"unknown CLIP layout {layout!r}; use 'open_clip' or 'hf'")
    reader = StateDictReader(state_dict, ignore=_is_text_key if vision_only else (lambda k: False))
    if vision_only:
        values = _vision_values(reader, cfg, layout)
        abstract = nnx.eval_shape(lambda: CLIPVisionTransformer(cfg, rngs=nnx.Rngs(0)))
        what = f"CLIP vision tower ({layout} layout)"
    else:
        values = {**_prefixed(("visual",), _vision_values(reader, cfg, layout)), **_text_values(reader, cfg, layout)}
        abstract = nnx.eval_shape(lambda: CLIP(cfg, rngs=nnx.Rngs(0)))
        what = f"CLIP ({layout} layout)"
    return fill_state(abstract, values, reader, what)


def config_from_hf(hf_config: Mapping[str, Any], **overrides: Any) -> CLIPConfig:
    """CLIPConfig from an HF ``CLIPConfig`` dict (``config.json``); the activation comes from
    ``vision_config.hidden_act``. ``overrides`` (e.g. ``dtype``) win."""
    v, t = hf_config.get("vision_config", hf_config), hf_config.get("text_config", {})
    kw = dict(
        image_size=v["image_size"], patch_size=v["patch_size"], vision_width=v["hidden_size"],
        vision_layers=v["num_hidden_layers"], vision_heads=v["num_attention_heads"],
        vision_mlp_dim=v["intermediate_size"], hidden_act=v.get("hidden_act", "quick_gelu"),
        layer_norm_eps=v.get("layer_norm_eps", 1e-5),
        embed_dim=hf_config.get("projection_dim", v.get("projection_dim", 512)),
    )
    if t:
        kw.update(
            text_width=t["hidden_size"], text_layers=t["num_hidden_layers"], text_heads=t["num_attention_heads"],
            text_mlp_dim=t["intermediate_size"], text_vocab_size=t["vocab_size"],
            text_context_length=t["max_position_embeddings"],
        )
        eos = t.get("eos_token_id")
        # HF pools at argmax(ids) when eos_token_id == 2 (legacy configs), else at the first eos.
        kw["eot_token_id"] = None if eos in (None, 2) else int(eos)
    kw.update(overrides)
    return CLIPConfig(**kw)


def config_from_open_clip(model_cfg: Mapping[str, Any], **overrides: Any) -> CLIPConfig:
    """CLIPConfig from an open_clip model config (``model_configs/ViT-B-16.json`` layout):
    ``{"embed_dim", "quick_gelu"?, "vision_cfg": {image_size, layers, width, patch_size, mlp_ratio?},
    "text_cfg": {context_length, vocab_size, width, heads, layers}}``. Vision heads = width // 64
    (open_clip's ``head_width`` default)."""
    v, t = model_cfg["vision_cfg"], model_cfg.get("text_cfg", {})
    vw = v["width"]
    kw = dict(
        image_size=v["image_size"], patch_size=v["patch_size"], vision_width=vw, vision_layers=v["layers"],
        vision_heads=vw // v.get("head_width", 64), vision_mlp_dim=int(vw * v.get("mlp_ratio", 4.0)),
        embed_dim=model_cfg["embed_dim"], hidden_act="quick_gelu" if model_cfg.get("quick_gelu") else "gelu",
    )
    if t:
        tw = t["width"]
        kw.update(text_width=tw, text_layers=t["layers"], text_heads=t["heads"],
                  text_mlp_dim=int(tw * t.get("mlp_ratio", 4.0)), text_vocab_size=t["vocab_size"],
                  text_context_length=t["context_length"])
    kw.update(overrides)
    return CLIPConfig(**kw)


def load_clip(state_dict: Mapping[str, Any], cfg: CLIPConfig, *, vision_only: bool = False,
              layout: str = "auto") -> nnx.Module:
    """Builds ``CLIP(cfg)`` (or the vision tower) and loads ``state_dict`` through :func:`convert_clip`."""
    cls = CLIPVisionTransformer if vision_only else CLIP
    # Merge into an abstract model: no random init (all variables are Params, all converted).
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))))
    state = convert_clip(state_dict, cfg, vision_only=vision_only, layout=layout)
    return nnx.merge(graphdef, jax.tree.map(jnp.asarray, state))
