"""Mistral port: logits parity vs transformers via the real converter, KV cache, LoRA, peft, 7B shapes."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from animegamer_jax.models.mistral import convert as mistral_convert
from animegamer_jax.models.mistral import model as mistral
from animegamer_jax.weights import load_state_dict, restore_state, save_state
from animegamer_jax.models.layers import LoRAParam, merge_lora
from tests.random_weights import random_model
from tests.convert_checks import assert_names_bad_keys

VOCAB = 96


@nnx.jit
def _logits(model, ids):
    return model(ids).logits


def _hf_model(sliding_window, seed=0):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    hc = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=sliding_window,
                       max_position_embeddings=256, rope_theta=10000.0, attn_implementation="eager")
    m = MistralForCausalLM(hc).eval()
    with torch.no_grad():  # non-trivial norm weights and larger projections so errors show
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.mul_(4.0)
    return m


def _ours_from_dir(path):
    cfg, state = mistral_convert.convert_hf_checkpoint(path, dtype="float32", param_dtype="float32")
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: mistral.Mistral(cfg, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, state)


@pytest.fixture(scope="module")
def window_pair(tmp_path_factory):
    """HF model with sliding window 5 (< the sequence lengths used), saved and converted."""
    tm = _hf_model(sliding_window=5)
    d = str(tmp_path_factory.mktemp("hf_sw5"))
    tm.save_pretrained(d)
    assert os.path.exists(os.path.join(d, "model.safetensors"))
    return tm, _ours_from_dir(d)


@pytest.mark.parity
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.slow
def test_logits_parity_vs_transformers(window, tmp_path):
    tm = _hf_model(window, seed=1)
    tm.save_pretrained(str(tmp_path))
    ours = _ours_from_dir(str(tmp_path))
    assert ours.cfg.window == window
    ids = np.random.RandomState(0).randint(0, VOCAB, (2, 13))
    with torch.no_grad():
        ref = tm(torch.tensor(ids)).logits.numpy()
    got = np.asarray(_logits(ours, jnp.asarray(ids)))
    err = np.abs(got - ref).max()
    print(f"logits max abs diff (window={window}): {err:.2e}, ref scale {np.abs(ref).max():.2f}")
    assert err <= 1e-4


@pytest.mark.slow
def test_sliding_window_changes_logits(window_pair):
    """The window is live: removing it changes late positions but not the first `window` ones."""
    _, ours = window_pair
    ids = jnp.asarray(np.random.RandomState(1).randint(0, VOCAB, (1, 12)))
    full = mistral.causal_window_mask(jnp.arange(12)[None], jnp.arange(12)[None], None)
    a, b = (np.asarray(x) for x in nnx.jit(lambda mod, x, m: (mod(x).logits, mod(x, attention_mask=m).logits))(ours, ids, full))
    np.testing.assert_allclose(a[:, :5], b[:, :5], atol=1e-5)
    assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-3


def test_converter_reports_bad_keys(window_pair, tmp_path):
    tm, _ = window_pair
    sd = {k: v.numpy() for k, v in tm.state_dict().items()}
    cfg = mistral_convert.config_from_hf(json.loads(tm.config.to_json_string()), dtype="float32", param_dtype="float32")
    assert_names_bad_keys(lambda bad: mistral_convert.convert_mistral(bad, cfg), sd, drop=["model.layers.1.mlp.up_proj.weight"],
                          put={"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32),
                               "model.norm.weight": np.ones(63, np.float32)},
                          expect=["missing keys (1): ['model.layers.1.mlp.up_proj.weight']",
                                  "unexpected keys (1): ['model.layers.0.self_attn.q_proj.bias']",
                                  "model.norm.weight: got (63,), expected (64,)"])


def test_v01_config_form():
    """Mistral-7B-v0.1 config.json: top-level rope_theta, no head_dim."""
    hf = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
          "sliding_window": 4096, "tie_word_embeddings": False}
    c = mistral_convert.config_from_hf(hf)
    assert (c.head_dim, c.rope_theta, c.window, c.num_kv_heads) == (128, 10000.0, 4096, 8)


def test_orbax_roundtrip(window_pair, tmp_path):
    _, ours = window_pair
    state = nnx.state(ours)
    save_state(state, str(tmp_path / "ckpt"))
    back = restore_state(state, str(tmp_path / "ckpt"))
    for (p, a), (_, b) in zip(nnx.to_flat_state(state), nnx.to_flat_state(back)):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(p))


@pytest.mark.slow
def test_cached_greedy_equals_uncached(window_pair):
    """16 cached greedy steps (prompt 6, window 5: crosses the window) == one uncached forward."""
    _, ours = window_pair
    prompt = jnp.asarray(np.random.RandomState(2).randint(0, VOCAB, (2, 6)))
    n_exec = mistral._decode_step._cache_size()
    toks, step_logits = mistral.greedy_generate(ours, 16, input_ids=prompt, cache_len=24)
    full = jnp.concatenate([prompt, toks[:, :-1]], axis=1)
    ref = np.asarray(_logits(ours, full))[:, 5:]
    err = np.abs(np.asarray(step_logits) - ref).max()
    print(f"cached vs uncached logits max abs diff: {err:.2e}")
    assert err <= 1e-4
    np.testing.assert_array_equal(np.asarray(toks), ref.argmax(-1))
    assert mistral._decode_step._cache_size() == n_exec + 1  # one executable for all 15 decode steps


@pytest.mark.slow
def test_long_prompt_generate_equals_uncached(window_pair):
    """A prompt long enough for the causal query blocks (fresh cache, ``empty_cache``): the cached
    greedy steps equal one uncached forward."""
    from animegamer_jax.models import attention

    _, ours = window_pair
    n = attention.CAUSAL_SPLIT_MIN + 20
    prompt = jnp.asarray(np.random.RandomState(5).randint(0, VOCAB, (1, n)))
    toks, step_logits = mistral.greedy_generate(ours, 4, input_ids=prompt)
    full = jnp.concatenate([prompt, toks[:, :-1]], axis=1)
    ref = np.asarray(_logits(ours, full))[:, n - 1:]
    assert np.abs(np.asarray(step_logits) - ref).max() <= 1e-4
    np.testing.assert_array_equal(np.asarray(toks), ref.argmax(-1))


@pytest.mark.slow
def test_unstacked_decode_equals_scanned(window_pair):
    """``decode_layers="unstacked"`` (CPU's "auto": per-layer weights split once, looped) generates the
    scanned path's tokens and logits; the split is reused until the stacked weights change."""
    _, ours = window_pair
    prompt = jnp.asarray(np.random.RandomState(3).randint(0, VOCAB, (2, 6)))
    gd, st = nnx.split(ours)
    scan = nnx.merge(gd, st)
    scan.cfg = dataclasses.replace(ours.cfg, decode_layers="scan")
    unst = nnx.merge(gd, st)
    unst.cfg = dataclasses.replace(ours.cfg, decode_layers="unstacked")
    assert mistral.unstacked_layers(scan) is None
    per = mistral.unstacked_layers(unst)
    assert len(per) == ours.cfg.num_layers and mistral.unstacked_layers(unst) is per  # split once
    t_scan, l_scan = mistral.greedy_generate(scan, 12, input_ids=prompt, cache_len=24)
    t_unst, l_unst = mistral.greedy_generate(unst, 12, input_ids=prompt, cache_len=24)
    np.testing.assert_array_equal(np.asarray(t_unst), np.asarray(t_scan))
    np.testing.assert_allclose(np.asarray(l_unst), np.asarray(l_scan), atol=1e-5, rtol=0)
    q = unst.layers.q_proj.kernel
    q.value = q.value * 2.0  # a weight update: the cached split is stale and must be redone
    per2 = mistral.unstacked_layers(unst)
    assert per2 is not per
    np.testing.assert_array_equal(np.asarray(per2[1]["q_proj"]["kernel"][...]), np.asarray(q[...][1]))
    # generating after the update uses the new weights: equal to a scanned copy of the updated model
    t_new, l_new = mistral.greedy_generate(unst, 12, input_ids=prompt, cache_len=24)
    ref = nnx.merge(*nnx.split(unst))
    ref.cfg = dataclasses.replace(ours.cfg, decode_layers="scan")
    t_ref, l_ref = mistral.greedy_generate(ref, 12, input_ids=prompt, cache_len=24)
    assert np.abs(np.asarray(l_new) - np.asarray(l_unst)).max() > 1e-3
    np.testing.assert_allclose(np.asarray(l_new), np.asarray(l_ref), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="decode_layers"):
        bad = nnx.merge(gd, st)
        bad.cfg = dataclasses.replace(ours.cfg, decode_layers="loop")
        mistral.unstacked_layers(bad)


def _lora_cfg(rank=4):
    return mistral.MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=8, sliding_window=None, dtype="float32",
                             param_dtype="float32", lora_rank=rank, lora_alpha=8.0)


def _randomize_lora(model, seed=0):
    rng = np.random.RandomState(seed)
    for path, v in nnx.to_flat_state(nnx.state(model, LoRAParam)):
        v[...] = jnp.asarray(rng.normal(0, 0.3, v.shape), jnp.float32)


@pytest.mark.slow
def test_lora_merge_equals_unmerged():
    m = random_model(lambda: mistral.Mistral(_lora_cfg(), rngs=nnx.Rngs(0)))
    for path, v in nnx.to_flat_state(nnx.state(m, LoRAParam)):  # a fresh adapter: B = 0
        if path[-1] == "lora_b":
            v[...] = jnp.zeros(v.shape)
    ids = jnp.asarray(np.random.RandomState(3).randint(0, VOCAB, (2, 7)))
    base = np.asarray(_logits(m, ids))
    _randomize_lora(m)
    unmerged = np.asarray(_logits(m, ids))
    assert np.abs(unmerged - base).max() > 1e-2  # the adapter is active
    merge_lora(m)
    assert not jax.tree.leaves(nnx.state(m, LoRAParam))
    np.testing.assert_allclose(np.asarray(_logits(m, ids)), unmerged, atol=1e-4)


@pytest.mark.slow
def test_lora_dropout_only_with_rng():
    m = random_model(lambda: mistral.Mistral(dataclasses.replace(_lora_cfg(), lora_dropout=0.5), rngs=nnx.Rngs(0)))
    _randomize_lora(m)
    ids = jnp.asarray(np.random.RandomState(4).randint(0, VOCAB, (1, 5)))
    fwd = nnx.jit(lambda mod, x, key: mod(x, dropout_rng=key).logits)
    a = np.asarray(_logits(m, ids))
    b = np.asarray(fwd(m, ids, jax.random.key(0)))
    c = np.asarray(fwd(m, ids, jax.random.key(1)))
    assert np.abs(a - b).max() > 1e-3 and np.abs(b - c).max() > 1e-3


def test_trainable_filter_selects_paper_set():
    from animegamer_jax.train.model import trainable_filter

    trainable = trainable_filter("b", component="mllm")  # matches names: selects a bare Mistral's set too
    m = nnx.eval_shape(lambda: mistral.Mistral(_lora_cfg(), rngs=nnx.Rngs(0)))
    names = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(m, trainable))}
    assert "embed_tokens" in names and "lm_head" in names and "norm.weight" in names
    assert "layers.input_layernorm.weight" in names and "layers.post_attention_layernorm.weight" in names
    assert "layers.q_proj.lora_a" in names and "layers.down_proj.lora_b" in names
    assert not any(n.endswith("kernel") for n in names)
    frozen = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(m, nnx.All(nnx.Param, nnx.Not(trainable))))}
    assert frozen == {f"layers.{n}.kernel" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}


_FULL_SIZE = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, json
    import numpy as np
    from flax import nnx
    from configs import animegamer_2b_7b
    from animegamer_jax.weights import count_params
    from animegamer_jax.models.mistral import model as mistral
    from animegamer_jax.models.mistral.mllm import GameStateMLLM
    from animegamer_jax.parallel import mesh as parallel_mesh
    cfg = animegamer_2b_7b.get_config()
    m0 = nnx.eval_shape(lambda: mistral.Mistral.from_config(cfg.mllm, rngs=nnx.Rngs(0), lora_rank=0, vocab_size=32000))
    mm = nnx.eval_shape(lambda: GameStateMLLM.from_config(cfg, rngs=nnx.Rngs(0)))
    st = nnx.state(mm, nnx.Param)
    mesh = parallel_mesh.make_mesh((1, 8, 1, 1))
    sh = parallel_mesh.param_shardings(st, mesh, parallel_mesh.DEFAULT_RULES)
    flat = nnx.to_flat_state(st)
    shs = {p: (s[...] if isinstance(s, nnx.Variable) else s) for p, s in nnx.to_flat_state(sh)}
    unsharded, per_device, total = [], 0, 0
    for path, v in flat:
        shard = shs[path].shard_shape(v.shape)
        per_device += int(np.prod(shard))
        total += v.size
        if v.size >= 2**24 and tuple(shard) == tuple(v.shape):
            unsharded.append(".".join(map(str, path)))
    from animegamer_jax.models.layers import LoRAParam
    print(json.dumps({
        "base_v0.1": count_params(nnx.state(m0, nnx.Param)),
        "mllm_total": count_params(st),
        "lora": count_params(nnx.state(mm, LoRAParam)),
        "resamplers": count_params(nnx.state(mm.input_resampler, nnx.Param)) + count_params(nnx.state(mm.output_resampler, nnx.Param)),
        "per_device_fraction": per_device / total, "n_params": len(flat), "n_shardings": len(shs), "unsharded_large": unsharded,
        "q_spec": str(shs[("llm", "layers", "q_proj", "kernel")].spec),
    }))
    """
)


@pytest.mark.slow
def test_full_size_eval_shape_and_fsdp_shardings():
    """7B shapes via eval_shape in a subprocess with 8 host devices (conftest already imported jax)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _FULL_SIZE], capture_output=True, text=True, cwd=root,
                       env={**os.environ, "PYTHONPATH": root}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    print(info)
    assert info["base_v0.1"] == 7_241_732_096  # Mistral-7B-v0.1
    d, rep = 4096, 1920
    resamplers = (rep * d + d + d * d + d) + (d * rep + rep + rep * rep + rep)
    assert info["resamplers"] == resamplers
    lora = 32 * 32 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 14336) + (14336 + 4096))
    assert info["lora"] == lora
    assert info["mllm_total"] == 7_241_732_096 + 284 * 4096 * 2 + resamplers + lora
    assert info["n_params"] == info["n_shardings"]
    assert info["unsharded_large"] == []  # no parameter of >= 16M elements replicated
    assert info["per_device_fraction"] < 0.14  # ~1/8 per fsdp device (LoRA B and norms replicated)
    assert "fsdp" in info["q_spec"]


def test_load_state_dict_formats(window_pair, tmp_path):
    """Sharded safetensors with index, pytorch_model.bin and a bare file all load the same tensors."""
    tm, _ = window_pair
    ref = {k: v.numpy() for k, v in tm.state_dict().items()}
    tm.save_pretrained(str(tmp_path / "sharded"), max_shard_size="100KB")
    assert os.path.exists(tmp_path / "sharded" / "model.safetensors.index.json")
    torch.save(tm.state_dict(), tmp_path / "pytorch_model.bin")
    for src in (str(tmp_path / "sharded"), str(tmp_path), str(tmp_path / "pytorch_model.bin")):
        got = load_state_dict(src)
        assert sorted(got) == sorted(ref), src
        for k in ref:
            np.testing.assert_array_equal(got[k], ref[k], err_msg=f"{src}: {k}")
