"""GameStateMLLM: hybrid-mask forward vs torch with the same 4-D mask, peft conversion parity,
sequence builder (release layout), constrained state decoding, loss."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.models.mistral import mllm_convert
from animegamer_jax.weights import ConversionError, restore_state
from animegamer_jax.models.mistral import model as mistral
from animegamer_jax.models.mistral import mllm
from animegamer_jax.train.model import trainable_filter
from animegamer_jax.models.layers import LoRAParam
from tests.random_weights import random_model

V, D, REP, Q = 96, 64, 24, 6
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MLLM_TRAINABLE = trainable_filter("b", component="mllm")  # phase b's set, relative to the GameStateMLLM


def _base_cfg(window=None, vocab=V):
    llm = mistral.MistralConfig(vocab_size=vocab, hidden_size=D, intermediate_size=128, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=16, sliding_window=window, dtype="float32",
                            param_dtype="float32", lora_alpha=8.0)
    return mllm.MLLMConfig(llm=llm, rep_dim=REP, num_queries=Q, history_window=3)


def _release_like(window, vocab=V, seed=0, peft_model=True):
    """(torch peft model, input_resampler, output_resampler, release-style state dict)."""
    from peft import LoraConfig, get_peft_model
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    hc = MistralConfig(vocab_size=vocab, hidden_size=D, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=window,
                       rms_norm_eps=1e-5, attn_implementation="eager")
    base = MistralForCausalLM(hc).eval()
    with torch.no_grad():
        for p in base.parameters():
            p.mul_(4.0)
    lc = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS,
                    modules_to_save=["input_layernorm", "post_attention_layernorm", "norm"])
    pm = get_peft_model(base, lc).eval()
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
            if "modules_to_save" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    inp = torch.nn.Sequential(torch.nn.Linear(REP, D), torch.nn.GELU(), torch.nn.Linear(D, D))
    out = torch.nn.Sequential(torch.nn.Linear(D, REP), torch.nn.GELU(), torch.nn.Linear(REP, REP))
    sd = {"llm." + k: v.detach().numpy() for k, v in pm.state_dict().items()}
    sd.update({f"input_resampler.proj.{k}": v.detach().numpy() for k, v in inp.state_dict().items()})
    sd.update({f"output_resampler.proj.{k}": v.detach().numpy() for k, v in out.state_dict().items()})
    return pm, inp, out, sd


def _merge_state(cfg, state):
    return nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: mllm.GameStateMLLM(cfg, rngs=nnx.Rngs(0)))), state)


@pytest.fixture(scope="module")
def release():
    return _release_like(window=None)


def _ids(b, l, seed):
    return np.random.RandomState(seed).randint(3, V, (b, l))


@pytest.mark.parity
@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.slow
def test_peft_conversion_logits_parity(release, merge):
    pm, _, _, sd = release
    assert any(".base_layer." in k for k in sd) and any("modules_to_save.default" in k for k in sd)
    cfg, state = mllm_convert.convert_animegamer_mllm(sd, _base_cfg(), merge_lora=merge)
    assert cfg.llm.lora_rank == (0 if merge else 4)
    m = _merge_state(cfg, state)
    ids = _ids(2, 11, 0)
    with torch.no_grad():
        ref = pm(input_ids=torch.tensor(ids)).logits.numpy()
    got = np.asarray(m.llm(jnp.asarray(ids)).logits)
    err = np.abs(got - ref).max()
    print(f"peft parity (merge={merge}) max abs diff {err:.2e}")
    assert err <= 1e-4


def test_old_peft_naming_gives_same_state(release):
    _, _, _, sd = release
    old = {}
    for k, v in sd.items():
        k2 = k.replace(".base_layer.", ".").replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
        old[k2] = v
    _, s_new = mllm_convert.convert_animegamer_mllm(sd, _base_cfg())
    _, s_old = mllm_convert.convert_animegamer_mllm(old, _base_cfg())
    for (p, a), (_, b) in zip(nnx.to_flat_state(s_new), nnx.to_flat_state(s_old)):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(p))


def test_mllm_converter_reports_bad_keys(release):
    _, _, _, sd = release
    bad = dict(sd)
    del bad["output_resampler.proj.2.bias"]
    bad["visual_encoder.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ConversionError) as e:
        mllm_convert.convert_animegamer_mllm(bad, _base_cfg())
    assert "missing keys (1): ['output_resampler.proj.2.bias']" in str(e.value)
    assert "unexpected keys (1): ['visual_encoder.weight']" in str(e.value)
    bad = dict(sd)
    bad.pop("llm.base_model.model.model.layers.1.mlp.up_proj.lora_B.default.weight")
    with pytest.raises(ConversionError, match=r"missing keys \(1\): \['model.layers.1.mlp.up_proj.lora_B.weight'\]"):
        mllm_convert.convert_animegamer_mllm(bad, _base_cfg())


def _torch_release_mask(attn_1d, window):
    """The release's custom 4-D mask (docs/token_layout.md#masks), written independently: additive float [B, 1, L, L]."""
    b, l = attn_1d.shape
    allowed = torch.tril(torch.ones(l, l, dtype=torch.bool))
    if window:
        i = torch.arange(l)
        allowed = allowed & ((i[:, None] - i[None, :]) < window)
    allowed = allowed[None].repeat(b, 1, 1)
    for r in range(b):
        neg = torch.nonzero(attn_1d[r] == -1).flatten()
        if len(neg):
            f, t = int(neg[0]), int(neg[-1])
            allowed[r, f:t + 1, f:t + 1] = True
    allowed = allowed & ((1 - attn_1d.abs()) == 0)[:, None, :]
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[:, None]


@pytest.mark.parity
@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.slow
def test_hybrid_mask_forward_matches_torch(window):
    pm, inp, outr, sd = _release_like(window, seed=3)
    cfg, state = mllm_convert.convert_animegamer_mllm(sd, dataclasses.replace(_base_cfg(window)))
    m = _merge_state(cfg, state)
    b, l = 2, 24
    ids = _ids(b, l, 1)
    gen = np.zeros((b, l), bool)
    gen[0, 14:14 + Q] = True
    gen[1, 15:15 + Q] = True
    cmp = np.zeros((b, l), bool)
    cmp[:, 3:3 + Q] = True
    hist = np.random.RandomState(2).normal(size=(b, 1, Q, REP)).astype(np.float32)
    attn = np.where(gen, -1, 1)
    with torch.no_grad():
        emb = pm.get_input_embeddings()(torch.tensor(ids)).clone()
        proj = inp(torch.tensor(hist[:, 0]))
        emb[torch.tensor(cmp)] = proj.reshape(-1, D)
        o = pm(inputs_embeds=emb, attention_mask=_torch_release_mask(torch.tensor(attn), window),
               output_hidden_states=True)
        h_ref = o.hidden_states[-1]
        rep_q = outr(h_ref[torch.tensor(gen)].reshape(b, Q, D)).numpy()
        rep_last = outr(h_ref[:, -Q:]).numpy()
    out = m(jnp.asarray(ids), gen_mask=jnp.asarray(gen), cmp_mask=jnp.asarray(cmp), history_reps=jnp.asarray(hist))
    errs = [np.abs(np.asarray(out.logits) - o.logits.numpy()).max(),
            np.abs(np.asarray(out.hidden) - h_ref.numpy()).max(),
            np.abs(np.asarray(out.rep) - rep_q).max(),
            np.abs(np.asarray(m.readout(out.hidden, jnp.asarray(gen), "last")) - rep_last).max()]
    print(f"hybrid forward (window={window}) max abs diffs logits/hidden/rep_query/rep_last: {errs}")
    assert max(errs) <= 1e-4
    # the block is live: a purely causal forward gives other query hidden states
    causal = np.asarray(m.llm(inputs_embeds=m.embed_inputs(jnp.asarray(ids), jnp.asarray(cmp), jnp.asarray(hist))).hidden)
    assert np.abs(causal[0, 14:19] - np.asarray(out.hidden)[0, 14:19]).max() > 1e-3


def test_hybrid_mask_structure():
    gen = np.zeros((1, 10), bool)
    gen[0, 4:7] = True
    m = np.asarray(mllm.hybrid_mask(jnp.asarray(gen), None))[0]
    assert m[4, 6] and m[5, 6] and not m[3, 4] and m[7, 6] and not m[6, 7]
    assert np.array_equal(m[:4, :4], np.tril(np.ones((4, 4), bool)))


@pytest.fixture(scope="module")
def tok():
    return mllm_tokenizer.AnimeGamerTokenizer()


def test_build_sequence_release_layout(tok):
    instr = ["Character: Qiqi; Motion: run; Background: day town.",
             "Character: Qiqi; Motion: sit; Background: night room.",
             "Character: Qiqi; Motion: jump; Background: day park.",
             "Character: Qiqi; Motion: fly; Background: sky."]
    states = [(1, 2, -1, 0), (3, 0, 1, -2), (2, -3, 3, 1)]
    s = mllm.build_sequence(tok, instr, states, num_queries=226, history_window=3)
    n = [len(tok.encode_plain(t)) for t in instr]
    assert s.num_history == 2
    assert len(s.input_ids) == 1 + (1 + n[1] + 230 + 14) + (1 + n[2] + 230 + 14) + (1 + n[3] + 230 + 1)
    assert s.input_ids[0] == mllm_tokenizer.BOS_ID and s.input_ids[-1] == mllm_tokenizer.ML_ID
    assert s.cmp_mask.sum() == 2 * 226 and s.gen_mask.sum() == 226
    g = np.nonzero(s.gen_mask)[0]
    assert list(s.input_ids[g]) == list(range(mllm_tokenizer.FRAME_BASE_ID, mllm_tokenizer.FRAME_BASE_ID + 226))
    assert s.input_ids[g[0] - 1] == mllm_tokenizer.FRAME_ID and s.input_ids[g[-1] + 1] == mllm_tokenizer.FRAME_END_ID
    world = tok.world_ids(*states[1])
    start = 1 + 1 + n[1] + 230
    assert list(s.input_ids[start:start + 14]) == world and world[-3:] == [mllm_tokenizer.ST_END_ID, mllm_tokenizer.ST_END_ID, mllm_tokenizer.TURN_END_ID]
    assert (s.labels == mllm.IGNORE_INDEX).all()
    rel = mllm.build_sequence(tok, instr, states, num_queries=226, history_window=3, release_history_states=True)
    assert list(rel.input_ids[start:start + 14]) == tok.world_ids(0, 0, 0, 0)
    w1 = mllm.build_sequence(tok, instr, states, num_queries=226, history_window=1)
    assert w1.num_history == 0 and len(w1.input_ids) == 1 + 1 + n[3] + 230 + 1
    tr = mllm.build_sequence(tok, instr[:1], (), num_queries=226, target_states=(2, -1, 0, 4))
    lab = tr.labels[tr.labels != mllm.IGNORE_INDEX]
    assert tok.parse_states(lab) == (2, -1, 0, 4) and list(tr.input_ids[-11:]) == list(lab)
    with pytest.raises(ValueError, match="history turns need"):
        mllm.build_sequence(tok, instr, states[:1])


@pytest.mark.slow
def test_predict_states_grammar_and_loss(tok):
    cfg = _base_cfg(vocab=mllm_tokenizer.VOCAB_SIZE)
    cfg = dataclasses.replace(cfg, llm=dataclasses.replace(cfg.llm, hidden_size=32, intermediate_size=64,
                                                           head_dim=8), num_queries=8)
    m = random_model(lambda: mllm.GameStateMLLM(cfg, rngs=nnx.Rngs(0)), scale=0.3)
    instr = ["Character: Qiqi; Motion: run; Background: day town.", "Character: Qiqi; Motion: sit; Background: room."]
    s = mllm.build_sequence(tok, instr, [(1, 2, 3, 4)], num_queries=8, history_window=2)
    batch = mllm.collate([s])
    hist = jnp.asarray(np.random.RandomState(0).normal(size=(1, 1, 8, REP)), jnp.float32)
    states, ids = m.predict_states(jnp.asarray(batch["input_ids"]), cmp_mask=jnp.asarray(batch["cmp_mask"]),
                                   history_reps=hist)
    grammar = tok.state_grammar()
    assert ids.shape == (1, 11) and all(int(ids[0, t]) in grammar[t] for t in range(11))
    assert tuple(states[0]) == tok.parse_states(ids[0])
    # loss = CE + alpha MSE (+ cos), checked against a direct numpy computation
    t = mllm.build_sequence(tok, instr, [(1, 2, 3, 4)], num_queries=8, history_window=2, target_states=(2, 1, -1, 0))
    b = {k: jnp.asarray(v) for k, v in mllm.collate([t]).items()}
    b["history_reps"] = hist
    b["target_reps"] = jnp.asarray(np.random.RandomState(1).normal(size=(1, 8, REP)), jnp.float32)
    m2 = random_model(lambda: mllm.GameStateMLLM(dataclasses.replace(cfg, rec_loss_scale=0.5, cos_loss_scale=0.5),
                                                rngs=nnx.Rngs(0)))
    total, parts = m2.loss(b)
    out = m2(b["input_ids"], gen_mask=b["gen_mask"], cmp_mask=b["cmp_mask"], history_reps=hist)
    lg = np.asarray(out.logits)[0]
    lab = np.asarray(b["labels"])[0]
    pos = np.nonzero(lab != mllm.IGNORE_INDEX)[0]
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    ce = np.mean([lse[p - 1] - lg[p - 1, lab[p]] for p in pos])
    rec, tgt = np.asarray(out.rep), np.asarray(b["target_reps"])
    mse = np.mean((rec - tgt) ** 2)
    cos = np.mean(1 - (rec * tgt).sum(-1) / (np.linalg.norm(rec, axis=-1) * np.linalg.norm(tgt, axis=-1)))
    np.testing.assert_allclose([parts["ce"], parts["mse"], parts["cos"], total],
                               [ce, mse, cos, ce + 0.5 * mse + 0.5 * cos], rtol=1e-4)
    assert len(pos) == 11


def test_trainable_filter_includes_resamplers():
    m = nnx.eval_shape(lambda: mllm.GameStateMLLM(
        dataclasses.replace(_base_cfg(), llm=dataclasses.replace(_base_cfg().llm, lora_rank=2)), rngs=nnx.Rngs(0)))
    names = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(m, MLLM_TRAINABLE))}
    assert "input_resampler.fc1.kernel" in names and "output_resampler.fc2.bias" in names
    assert "llm.layers.q_proj.lora_a" in names and "llm.layers.q_proj.kernel" not in names
    assert len(jax.tree.leaves(nnx.state(m, LoRAParam))) == 14


def test_from_tiny_config_shapes():
    from configs import tiny

    c = tiny.get_config()
    cfg = mllm.MLLMConfig.from_config(c)
    assert cfg.llm.attention_impl is None and cfg.num_queries == c.rep.num_text_tokens + c.rep.num_image_tokens
    m = nnx.eval_shape(lambda: mllm.GameStateMLLM(cfg, rngs=nnx.Rngs(0)))
    assert m.llm.layers.q_proj.kernel.shape == (c.mllm.num_layers, c.mllm.hidden_size, c.mllm.num_heads, c.mllm.head_dim)
    assert m.llm.layers.gate_proj.lora_a.shape == (c.mllm.num_layers, c.mllm.hidden_size, c.mllm.lora_rank)
    assert m.input_resampler.fc1.kernel.shape == (c.rep.dim, c.mllm.hidden_size)
    assert m.output_resampler.fc2.kernel.shape == (c.rep.dim, c.rep.dim)


def test_mllm_cli_roundtrip(tmp_path):
    """The release-.bin CLI on a tiny-config peft checkpoint: its orbax output restores to the same state."""
    from peft import LoraConfig, get_peft_model
    from transformers import MistralConfig, MistralForCausalLM

    from configs import tiny
    from animegamer_jax.commands.convert import main as convert_main
    from animegamer_jax.models.mistral import convert as mistral_convert

    c = tiny.get_config()
    m = c.mllm
    torch.manual_seed(0)
    hc = MistralConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                       num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                       num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim)
    pm = get_peft_model(MistralForCausalLM(hc), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    sd = {"llm." + k: v for k, v in pm.state_dict().items()}
    d, r = m.hidden_size, c.rep.dim
    for name, (a, b) in {"input_resampler": (r, d), "output_resampler": (d, r)}.items():
        sd[f"{name}.proj.0.weight"], sd[f"{name}.proj.0.bias"] = torch.randn(b, a), torch.randn(b)
        sd[f"{name}.proj.2.weight"], sd[f"{name}.proj.2.bias"] = torch.randn(b, b), torch.randn(b)
    torch.save(sd, tmp_path / "pytorch_model.bin")
    assert convert_main(["animegamer-mllm", str(tmp_path / "pytorch_model.bin"), str(tmp_path / "out"),
                         "--config", "configs/tiny.py", "--param_dtype", "float32", "--lora_alpha", "4"]) == 0
    cfg, state = mllm_convert.convert_animegamer_mllm({k: v.numpy() for k, v in sd.items()},
                                             mllm.MLLMConfig.from_config(c, param_dtype="float32"), lora_alpha=4.0)
    assert (cfg.llm.lora_rank, cfg.llm.lora_targets, cfg.llm.lora_alpha) == (2, ("q_proj", "v_proj"), 4.0)
    back = restore_state(state, str(tmp_path / "out" / "params"))
    for (p, a), (_, b) in zip(nnx.to_flat_state(state), nnx.to_flat_state(back)):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(p))


@pytest.mark.slow
def test_train_step_updates_only_trainable_set():
    """Grads flow through the scanned layers; an optimizer on trainable_filter leaves base kernels frozen."""
    import optax

    cfg = _base_cfg()
    cfg = dataclasses.replace(cfg, llm=dataclasses.replace(cfg.llm, lora_rank=2))
    m = random_model(lambda: mllm.GameStateMLLM(cfg, rngs=nnx.Rngs(0)))
    opt = nnx.Optimizer(m, optax.adam(1e-2), wrt=MLLM_TRAINABLE)
    rng = np.random.RandomState(0)
    b, l = 2, 16
    gen = np.zeros((b, l), bool)
    gen[:, 4:4 + Q] = True
    lab = np.full((b, l), mllm.IGNORE_INDEX)
    lab[:, 12:] = rng.randint(3, V, (b, 4))
    batch = {"input_ids": jnp.asarray(rng.randint(3, V, (b, l))), "gen_mask": jnp.asarray(gen),
             "labels": jnp.asarray(lab), "target_reps": jnp.asarray(rng.normal(size=(b, Q, REP)), jnp.float32)}

    @nnx.jit
    def step(model, optimizer):
        grad_fn = nnx.value_and_grad(lambda mm: mm.loss(batch)[0], argnums=nnx.DiffState(0, MLLM_TRAINABLE))
        loss, grads = grad_fn(model)
        optimizer.update(model, grads)
        return loss

    kernel0 = np.asarray(m.llm.layers.q_proj.kernel[...]).copy()
    lora0 = np.asarray(m.llm.layers.q_proj.lora_b[...]).copy()
    losses = [float(step(m, opt)) for _ in range(3)]
    assert losses[2] < losses[0]
    np.testing.assert_array_equal(np.asarray(m.llm.layers.q_proj.kernel[...]), kernel0)
    assert np.abs(np.asarray(m.llm.layers.q_proj.lora_b[...]) - lora0).max() > 1e-4


def test_last_readout_skips_right_padding():
    """readout="last" reads the last Q *valid* positions of each row, never pads (docs/token_layout.md#read-out)."""
    import types

    import jax.numpy as jnp
    import numpy as np

    from animegamer_jax.models.mistral.mllm import GameStateMLLM

    q, length = 3, 8
    fake = types.SimpleNamespace(cfg=types.SimpleNamespace(readout="last", num_queries=q),
                                 output_resampler=lambda h: h)
    hidden = jnp.arange(2 * length, dtype=jnp.float32).reshape(2, length, 1)
    pad = jnp.asarray([[True] * 8, [True] * 5 + [False] * 3])
    gen = jnp.zeros((2, length), bool)
    out = np.asarray(GameStateMLLM.readout(fake, hidden, gen, "last", pad))[..., 0]
    np.testing.assert_array_equal(out, [[5, 6, 7], [10, 11, 12]])  # row 1: positions 2..4 of 8..15
    unpadded = np.asarray(GameStateMLLM.readout(fake, hidden, gen, "last"))[..., 0]
    np.testing.assert_array_equal(unpadded, [[5, 6, 7], [13, 14, 15]])  # the release's hidden[:, -q:]
