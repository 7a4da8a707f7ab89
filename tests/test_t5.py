"""T5 v1.1 encoder parity vs HF T5EncoderModel (tiny, fp32) through the converter from a saved
file, loud conversion errors, fp32 default, full-size eval_shape."""

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import jax
import jax.numpy as jnp

from animegamer_jax.weights import restore_state
from animegamer_jax.models.t5 import convert as t5_convert
from animegamer_jax.models.t5 import model as t5_model
from tests.convert_checks import assert_names_bad_keys

VOCAB = 100


def _hf_t5():
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                feed_forward_proj="gated-gelu", relative_attention_num_buckets=8,
                                relative_attention_max_distance=20, dropout_rate=0.0)
    model = transformers.T5EncoderModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


def test_relative_position_buckets_match_hf():
    from transformers.models.t5.modeling_t5 import T5Attention

    for length, nb, md in ((40, 8, 20), (300, 32, 128)):
        ctx = torch.arange(length)[:, None]
        mem = torch.arange(length)[None, :]
        ref = T5Attention._relative_position_bucket(mem - ctx, bidirectional=True, num_buckets=nb, max_distance=md)
        np.testing.assert_array_equal(t5_model.relative_position_buckets(length, length, nb, md), ref.numpy())


@pytest.mark.parity
@pytest.mark.slow
def test_t5_parity_from_saved_file(tmp_path):
    hf = _hf_t5()
    hf.save_pretrained(tmp_path / "hf")
    cfg = t5_convert.config_from_hf(hf.config.to_dict())
    from animegamer_jax.commands.convert import main as convert_main

    assert convert_main(["t5", str(tmp_path / "hf"), str(tmp_path / "orbax"),
                         f"--hf_config={tmp_path / 'hf' / 'config.json'}"]) == 0
    abstract = nnx.eval_shape(lambda: t5_model.T5Encoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    model = nnx.merge(graphdef, restore_state(abstract, tmp_path / "orbax"))

    rng = np.random.default_rng(0)
    ids = rng.integers(2, VOCAB, size=(2, 30))
    ids[0, 12:] = 0  # pads, attended (no mask) as in the release
    ids[0, 11] = 1
    mask = (np.arange(30)[None] <= np.array([[11], [29]])).astype(np.int64)
    run = nnx.jit(lambda m, t, a: (m(t), m(t, a)))
    ours, ours_masked = run(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask))
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids)).last_hidden_state.numpy()
        ref_masked = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    assert ours.dtype == jnp.float32
    err, err_m = np.abs(np.asarray(ours) - ref).max(), np.abs(np.asarray(ours_masked) - ref_masked).max()
    assert err <= 1e-5 and err_m <= 1e-5, (err, err_m)
    # The mask matters for the padded row only.
    assert np.abs(np.asarray(ours)[0] - np.asarray(ours_masked)[0]).max() > 1e-3
    np.testing.assert_allclose(np.asarray(ours)[1], np.asarray(ours_masked)[1], atol=1e-6)


def test_converter_handles_prefix_embeddings_and_decoder():
    hf = _hf_t5()
    cfg = t5_convert.config_from_hf(hf.config.to_dict())
    sd = dict(hf.state_dict())
    sd.setdefault("shared.weight", sd["encoder.embed_tokens.weight"])
    only_shared = {k: v for k, v in sd.items() if k != "encoder.embed_tokens.weight"}
    sat = {"conditioner.embedders.0.transformer." + k: v for k, v in only_shared.items()}
    sat["conditioner.embedders.0.transformer.decoder.block.0.layer.0.SelfAttention.q.weight"] = torch.zeros(32, 32)
    a = t5_convert.convert_t5(only_shared, cfg)
    b = t5_convert.convert_t5(sat, cfg)
    np.testing.assert_array_equal(np.asarray(a["blocks"]["attn"]["q"][...]), np.asarray(b["blocks"]["attn"]["q"][...]))
    np.testing.assert_array_equal(np.asarray(a["shared"][...]), sd["shared.weight"].numpy())


def test_converter_is_loud():
    hf = _hf_t5()
    cfg = t5_convert.config_from_hf(hf.config.to_dict())
    sd = dict(hf.state_dict())
    assert_names_bad_keys(lambda bad: t5_convert.convert_t5(bad, cfg), sd, drop=["encoder.block.1.layer.1.DenseReluDense.wi_1.weight"],
                          put={"encoder.block.0.layer.0.SelfAttention.q.bias": torch.zeros(32),
                               "encoder.final_layer_norm.weight": torch.ones(16)},
                          expect=["missing source keys (1): ['encoder.block.1.layer.1.DenseReluDense.wi_1.weight']",
                                  "unexpected source keys", "'encoder.block.0.layer.0.SelfAttention.q.bias'",
                                  "final_layer_norm.scale: source gives (16,), model expects (32,)"])
    clash = dict(sd, **{"shared.weight": sd["encoder.embed_tokens.weight"] + 1})
    with pytest.raises(t5_convert.ConversionError, match="differ"):
        t5_convert.convert_t5(clash, cfg)
    with pytest.raises(ValueError, match="gated-gelu"):
        t5_convert.config_from_hf({**hf.config.to_dict(), "feed_forward_proj": "relu"})


def test_default_is_fp32_and_full_size_eval_shape():
    from configs import animegamer_2b_7b, tiny

    assert t5_model.T5Config().dtype == "float32"
    full = t5_model.T5Config.from_config(animegamer_2b_7b.get_config().t5)
    assert full.dtype == "float32"
    model = nnx.eval_shape(lambda: t5_model.T5Encoder(full, rngs=nnx.Rngs(0)))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    # t5-v1_1-xxl encoder (HF T5EncoderModel): 4,762,310,656 params (embedding counted once).
    assert n == 4_762_310_656, n
    out = jax.eval_shape(lambda m, t: m(t), model, jax.ShapeDtypeStruct((2, 30), jnp.int32))
    assert out.shape == (2, 30, 4096) and out.dtype == jnp.float32
    small = nnx.eval_shape(lambda: t5_model.T5Encoder.from_config(tiny.get_config().t5, rngs=nnx.Rngs(0)))
    y = jax.eval_shape(lambda m, t: m(t), small, jax.ShapeDtypeStruct((1, 8), jnp.int32))
    assert y.dtype == jnp.float32 and y.shape == (1, 8, 32)
