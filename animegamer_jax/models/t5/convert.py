"""HF ``T5EncoderModel`` / ``T5ForConditionalGeneration`` state dicts -> our :class:`T5Encoder`.

Source names (HF ``modeling_t5.py``), weights (out, in) for ``y = x W^T``:
``shared.weight`` and/or ``encoder.embed_tokens.weight`` [V, D] (hub T5 v1.1 files carry either or
both; transformers 5 ties them), ``encoder.block.{i}.layer.0.SelfAttention.{q,k,v,o}.weight``,
``encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight`` [buckets, N],
``encoder.block.{i}.layer.0.layer_norm.weight``,
``encoder.block.{i}.layer.1.DenseReluDense.{wi_0,wi_1,wo}.weight``,
``encoder.block.{i}.layer.1.layer_norm.weight``, ``encoder.final_layer_norm.weight``.

A leading prefix before ``encoder.`` / ``shared.`` (e.g. SAT's
``conditioner.embedders.0.transformer.``) is detected and stripped. Decoder and ``lm_head`` keys
of a full seq2seq checkpoint are skipped on purpose (only the encoder is used). Anything else
unused, missing or mis-shaped raises :class:`ConversionError` with every offending key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.models.mistral.convert import Leaf, evaluate_leaf
from animegamer_jax.models.t5.model import T5Config, T5Encoder
from animegamer_jax.weights import ConversionError, StateDictReader, fill_state, to_numpy

_Q_KEY = "encoder.block.0.layer.0.SelfAttention.q.weight"


def _detect_prefix(keys) -> str:
    for k in keys:
        if k.endswith(_Q_KEY):
            return k[: -len(_Q_KEY)]
    return ""


def t5_leaves(state_dict: Mapping[str, Any], cfg: T5Config) -> tuple[dict[tuple, Any], StateDictReader, str]:
    """The key map of :func:`convert_t5` as lazy leaves: ``{our path: Leaf | array | None}``.

    Stacked block leaves are ``models.mistral.convert.Leaf`` objects read one layer at a time; a leaf whose source
    keys are absent is None (the reader lists them in ``missing``). Also returns the reader (used /
    missing source keys) and the detected key prefix.

    Raises:
      ConversionError: embedding copies (``shared`` vs ``encoder.embed_tokens``) that disagree.
    """
    prefix = _detect_prefix(state_dict)
    sd = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    skipped_outside = [k for k in state_dict if not k.startswith(prefix)]
    r = StateDictReader(sd, ignore=lambda k: k.startswith(("decoder.", "lm_head.")))
    d, n, h, L, ff = cfg.d_model, cfg.num_heads, cfg.d_kv, cfg.num_layers, cfg.d_ff

    emb_keys = [k for k in ("encoder.embed_tokens.weight", "shared.weight") if k in sd]
    if not emb_keys:
        r.missing.append("shared.weight (or encoder.embed_tokens.weight)")
        emb = None
    else:
        embs = [r.get(k) for k in emb_keys]
        if len(embs) == 2 and embs[0].shape == embs[1].shape and not np.array_equal(embs[0], embs[1]):
            raise ConversionError("T5: shared.weight and encoder.embed_tokens.weight differ; which one the encoder "
                                  "uses is ambiguous")
        emb = embs[0]

    def stack(fmt: str, shape: tuple[int, ...], fn=lambda a: a):
        keys = [fmt.format(i) for i in range(L)]
        absent = [k for k in keys if k not in r.sd]
        if absent:
            r.missing.extend(absent)
            return None
        r.used.update(keys)
        return Leaf(lambda i: np.asarray(fn(to_numpy(r.sd[keys[i]]))), shape, L)

    f = "encoder.block.{}.layer."
    values = {
        ("shared",): emb,
        ("relative_attention_bias",): r.get("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        ("final_layer_norm", "scale"): r.get("encoder.final_layer_norm.weight"),
        ("blocks", "attn_norm", "scale"): stack(f + "0.layer_norm.weight", (d,)),
        ("blocks", "ffn_norm", "scale"): stack(f + "1.layer_norm.weight", (d,)),
        ("blocks", "attn", "o"): stack(f + "0.SelfAttention.o.weight", (n, h, d), lambda w: w.T.reshape(n, h, d)),
        ("blocks", "ffn", "wi_0"): stack(f + "1.DenseReluDense.wi_0.weight", (d, ff), lambda w: w.T),
        ("blocks", "ffn", "wi_1"): stack(f + "1.DenseReluDense.wi_1.weight", (d, ff), lambda w: w.T),
        ("blocks", "ffn", "wo"): stack(f + "1.DenseReluDense.wo.weight", (ff, d), lambda w: w.T),
    }
    for name in "qkv":
        values[("blocks", "attn", name)] = stack(f + f"0.SelfAttention.{name}.weight", (d, n, h),
                                                 lambda w: w.T.reshape(d, n, h))
    if skipped_outside:
        r.sd.update({k: None for k in skipped_outside})
    return values, r, prefix


def convert_t5(state_dict: Mapping[str, Any], cfg: T5Config) -> nnx.State:
    """Converts an HF T5 (v1.1, gated-GELU) encoder state dict to the Param state of ``T5Encoder(cfg)``.

    Returns:
      ``nnx.State`` of Params (float32 numpy leaves).

    Raises:
      ConversionError: missing / unexpected / mis-shaped keys (all listed), or embedding copies
        (``shared`` vs ``encoder.embed_tokens``) that disagree.
    """
    lazy, r, prefix = t5_leaves(state_dict, cfg)
    values = {}
    for p, v in lazy.items():
        if isinstance(v, Leaf):
            try:
                v = evaluate_leaf(v, np.float32)
            except ValueError:  # a mis-shaped source: stack as given so fill_state names the shape
                v = np.stack([v.fn(i) for i in range(v.layers)])
        values[p] = v
    abstract = nnx.eval_shape(lambda: T5Encoder(cfg, rngs=nnx.Rngs(0)))
    return fill_state(abstract, values, r, f"T5 encoder (prefix {prefix!r})")


def config_from_hf(hf_config: Mapping[str, Any], **overrides: Any) -> T5Config:
    """T5Config from an HF T5 ``config.json`` dict.

    Raises:
      ValueError: a feed-forward other than ``gated-gelu`` (T5 v1.1); ours implements only that.
    """
    ff = hf_config.get("feed_forward_proj", "relu")
    if ff != "gated-gelu":
        raise ValueError(f"T5 feed_forward_proj {ff!r} is not supported; T5 v1.1 uses 'gated-gelu'")
    kw = dict(
        vocab_size=hf_config["vocab_size"], d_model=hf_config["d_model"], d_kv=hf_config["d_kv"],
        d_ff=hf_config["d_ff"],
        num_layers=hf_config["num_layers"], num_heads=hf_config["num_heads"],
        relative_attention_num_buckets=hf_config.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf_config.get("relative_attention_max_distance", 128),
        layer_norm_eps=hf_config.get("layer_norm_epsilon", 1e-6),
    )
    kw.update(overrides)
    return T5Config(**kw)


def load_t5(state_dict: Mapping[str, Any], cfg: T5Config) -> T5Encoder:
    """Builds ``T5Encoder(cfg)`` from ``state_dict`` through :func:`convert_t5` (no random init)."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: T5Encoder(cfg, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, jax.tree.map(jnp.asarray, convert_t5(state_dict, cfg)))

