"""``mllm.history_attention = "turn_window"``: the MLLM's KV cache kept across turns.

Tiny config (fp32, CPU), W = 3, 6 turns of uneven instruction lengths, so turns 0..2 are evicted
on the way: the persistent cache (inference/mllm_turn.py ``mllm_turn_cached``, one prefill of the new
tokens per turn) against a full recompute of the whole game with the same turn-window mask
(``turn_layout`` of every turn + ``hybrid_attention_mask(..., turn_ids, W)``, and pass A greedy by
full forwards without any cache). Then the engine: a game whose cache is rebuilt by recompute
(undo, or a session restored from its stored turns) plays on exactly as an uninterrupted one.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.config import load_config
from animegamer_jax.inference import mllm_turn, turn_inputs
from animegamer_jax.inference.turn_model import CachedMLLM
from animegamer_jax.inference.turn_inputs import (CachePlan, TurnRecord, WindowSpec, build_cached_turn_input,
                                                  encode_instruction, stack_cached_inputs)
from animegamer_jax.models import attention as attn
from animegamer_jax.models.mistral.mllm import GameStateMLLM, collate, hybrid_attention_mask, turn_layout

W, TURNS, TOL = 3, 6, 1e-5
TEXTS = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
         "Character: Bunny; Motion: stretch; Background: meadow.",
         "Character: Bunny; Motion: quickly chase a bright yellow butterfly between tall flowers; "
         "Background: day forest.",
         "Character: Fox; Motion: sit; Background: night.",
         "Character: Fox; Motion: jump over the old wooden fence near the river; Background: dusk field.",
         "Character: Bunny and Fox; Motion: wave goodbye; Background: sunset hill."]


@pytest.fixture(scope="module")
def setup():
    cfg = load_config("configs/tiny.py")
    cfg.mllm.history_attention = "turn_window"
    cfg.mllm.history_window = W
    mllm = nnx.merge(*jax.jit(lambda: nnx.split(GameStateMLLM.from_config(cfg, rngs=nnx.Rngs(0))))())
    spec = WindowSpec.from_config(cfg)
    return cfg, mllm, spec


def _full_recompute(mllm, texts, history, q, t_dec, pad_to):
    """Pass B and greedy pass A over the whole game as one sequence, no cache, turn-window mask.
    Right-padded to ``pad_to`` (pads come after every real token: causal keeps them unseen), so
    each pass compiles once for all turns."""
    seq = turn_layout(texts, [r.states for r in history], num_queries=q, history_window=len(texts))
    n = len(seq.input_ids)
    hist = np.zeros((1, TURNS - 1, q, mllm.cfg.rep_dim), np.float32)
    if history:
        hist[0, :len(history)] = np.stack([r.rep for r in history])
    hist = jnp.asarray(hist)

    def pad(a, fill):
        return jnp.asarray(np.concatenate([a, np.full(pad_to - n, fill, a.dtype)])[None])

    ids = np.concatenate([seq.input_ids, np.full(pad_to - n, mllm_tokenizer.PAD_ID, np.int32)])
    cmp, turns = pad(seq.cmp_mask, False), pad(seq.turn_ids, seq.turn_ids[-1])  # decoded ids: current turn
    rep = _pass_b(mllm, jnp.asarray(ids[None]), pad(seq.gen_mask, False), cmp, hist, turns)
    grammar = mllm_tokenizer.AnimeGamerTokenizer.state_grammar()[:t_dec]
    toks, logits = [], []
    for t in range(t_dec):
        lg = np.asarray(_pass_a_logits(mllm, jnp.asarray(ids[None]), cmp, hist, turns, n - 1 + t))[0]
        allowed = np.full(lg.shape, -np.inf)
        allowed[list(grammar[t])] = 0.0
        tok = int(np.argmax(lg + allowed))
        toks.append(tok)
        logits.append(lg)
        ids[n + t] = tok
    return np.asarray(rep)[0], np.asarray(toks), np.stack(logits)


@nnx.jit
def _pass_b(mllm, ids, gen, cmp, hist, turns):
    return mllm(ids, gen_mask=gen, cmp_mask=cmp, history_reps=hist, turn_ids=turns, return_logits=False).rep


@nnx.jit
def _pass_a_logits(mllm, ids, cmp, hist, turns, at):
    x = mllm.embed_inputs(ids, cmp, hist)
    mask = attn.causal_mask(mllm.cfg.llm.window, q_seg=turns, k_seg=turns, seg_window=mllm.cfg.turn_window)
    out = mllm.llm(inputs_embeds=x, attention_mask=mask, return_logits=False)
    return mllm.llm.logits(jax.lax.dynamic_slice_in_dim(out.hidden, at, 1, axis=1))[:, 0]


@pytest.mark.slow
def test_persistent_cache_equals_full_recompute_6_turns_w3(setup):
    cfg, mllm, spec = setup
    q, plan = spec.num_queries, CachePlan.from_spec(spec)
    turn = jax.jit(lambda c, b: mllm_turn.mllm_turn_cached(mllm, c, b, plan, "query"))
    cache = turn_inputs.TurnKVCache.init(mllm.cfg.llm, 1, plan)
    ids = [encode_instruction(t, spec) for t in TEXTS]
    assert len({len(i) for i in ids}) == TURNS  # uneven turns: slots and positions are per turn
    # longest game sequence + decoded ids: one compiled full-recompute program
    pad_to = 1 + sum(len(i) + q + 19 for i in ids) + plan.decode_tokens
    history, rng, errs = [], np.random.default_rng(0), []
    for k in range(TURNS):
        batch = {n: jnp.asarray(v) for n, v in stack_cached_inputs(
            [build_cached_turn_input(history, ids[k], spec, cfg.rep.dim, plan)]).items()}
        states, rep, cache, logits = turn(cache, batch)
        ref_rep, ref_toks, ref_logits = _full_recompute(mllm, [list(i) for i in ids[:k + 1]], history, q,
                                                        plan.decode_tokens, pad_to)
        ref_states = ref_toks[[0, 3, 6, 9]] - mllm_tokenizer.STRENGTH_BASE_ID + mllm_tokenizer.STRENGTH_MIN
        assert tuple(np.asarray(states)[0]) == tuple(ref_states), (k, states, ref_states)
        errs.append(float(np.abs(np.asarray(logits)[0] - ref_logits).max()))
        np.testing.assert_allclose(np.asarray(logits)[0], ref_logits, atol=TOL, rtol=0, err_msg=f"turn {k}")
        np.testing.assert_allclose(np.asarray(rep)[0], ref_rep, atol=TOL, rtol=0, err_msg=f"turn {k}")
        # history s_a with some spread, so the resampled history slots carry information
        history.append(TurnRecord(ids[k], tuple(int(v) for v in np.asarray(states)[0]),
                                  np.asarray(rep)[0] + rng.normal(size=rep.shape[1:]).astype(np.float32)))
    print("max |logit diff| per turn", errs)
    # turns 0..2 are outside the last turn's window, and that mask differs from seeing everything
    seq = turn_layout([list(i) for i in ids], [r.states for r in history[:-1]], num_queries=q, history_window=TURNS)
    tid = jnp.asarray(seq.turn_ids[None])
    m = np.asarray(hybrid_attention_mask(jnp.asarray(seq.gen_mask[None]), None, None, tid, W)
                   .materialize(1, len(tid[0]), len(tid[0])))[0]
    cur = np.flatnonzero(seq.turn_ids == TURNS - 1)
    assert not m[cur][:, (seq.turn_ids >= 0) & (seq.turn_ids <= TURNS - 1 - W)].any()
    assert m[cur][:, seq.turn_ids == TURNS - W].any() and m[cur][:, 0].all()  # turn k-W+1 and <s> visible


def test_default_mode_is_the_release_layout(setup):
    """``window_recompute`` stays the default, and the turn-window mask needs turn ids."""
    cfg = load_config("configs/tiny.py")
    assert cfg.mllm.history_attention == "window_recompute"
    assert WindowSpec.from_config(cfg).history_attention == "window_recompute"
    m = GameStateMLLM.from_config(cfg, rngs=nnx.Rngs(0))
    assert m.cfg.turn_window is None
    _, mllm, _ = setup
    with pytest.raises(ValueError, match="turn_ids"):
        mllm(jnp.zeros((1, 8), jnp.int32), gen_mask=jnp.zeros((1, 8), bool))
    with pytest.raises(ValueError, match="mllm_turn_cached"):
        mllm.predict_states(jnp.zeros((1, 8), jnp.int32))


@pytest.mark.slow
def test_engine_cache_rebuilt_by_recompute_plays_on_equal(setup):
    """Uninterrupted game vs the same game undone at turn 4 and vs a session restored from its
    stored turns (no cache: rebuilt by recompute): equal states, s_a within 1e-5."""
    from animegamer_jax.game.engine import GameEngine
    from animegamer_jax.inference.instructions import Game, parse_instruction
    from animegamer_jax.game.turn_by_turn import TurnByTurnGame
    from animegamer_jax.inference.standin_model import StandinTurnModel

    cfg, mllm, _ = setup
    g, s = nnx.split(mllm)
    system = StandinTurnModel(cfg)
    system.params, system.kv_cache = {**system.params, "mllm": s}, CachedMLLM(g, mllm.cfg.llm, cfg)
    engine = GameEngine(cfg, system)
    turns = [parse_instruction(t) for t in TEXTS[:5]]
    full = engine.play([Game("g", tuple(turns), 7)])[0]["turns"]

    def play_turn(game, turn):
        ids = game.encode(turn)
        run, seed, ids, k = game.row(ids)
        states, rep, frames, timing = engine.step([run], [seed], [ids], [k])
        game.commit(turn, ids, states[0], rep[0], frames[0], timing)

    game = TurnByTurnGame(engine, "g", 7)
    for t in turns[:4]:
        play_turn(game, t)
    game.undo()  # the run is rebuilt from its kept turns, without a cache
    assert game.run.kv_cache is None
    rebuilt_before = engine.cache_rebuilds
    for t in turns[3:]:
        play_turn(game, t)
    assert engine.cache_rebuilds == rebuilt_before + 1
    restored = TurnByTurnGame(engine, "g", 7)  # e.g. a saved game loaded again: its stored turns
    for t, tr in zip(turns[:3], full[:3]):
        restored.commit(t, restored.encode(t), np.asarray(tr.states), tr.rep, tr.frames, {})
    for t in turns[3:]:
        play_turn(restored, t)
    for other in (game, restored):
        for k, (a, b) in enumerate(zip(full, other.results)):
            assert a.states == b.states, k
            np.testing.assert_allclose(b.rep, a.rep, atol=TOL, rtol=0, err_msg=f"turn {k}")
    assert engine.cache_sizes()["mllm"] == 0  # the cached turn ran, not the recompute program
    assert engine.mllm_cached_fn._cache_size() == 1  # one compile for every turn


def test_training_uses_the_turn_window_mask(setup):
    """The training loss reads ``turn_ids`` from ``collate``: with W covering every turn of the row
    it equals the default mask's loss; with W = 1 history turns are cut off and it differs."""
    cfg, mllm, spec = setup
    q = spec.num_queries
    ids = [list(encode_instruction(t, spec)) for t in TEXTS[:3]]
    seq = turn_layout(ids, [(1, 0, 0, 0), (2, 1, -1, 0)], num_queries=q, history_window=3, target_states=(3, 1, 0, -1))
    batch = {k: jnp.asarray(v) for k, v in collate([seq], pad_to=len(seq.input_ids) + 5).items()}
    assert batch["turn_ids"].shape == batch["input_ids"].shape
    rng = np.random.default_rng(1)
    batch["history_reps"] = jnp.asarray(rng.normal(size=(1, 2, q, cfg.rep.dim)), jnp.float32)
    batch["target_reps"] = jnp.asarray(rng.normal(size=(1, q, cfg.rep.dim)), jnp.float32)
    g, s = nnx.split(mllm)

    def loss(history_attention, w):
        m = nnx.merge(g, s)
        m.cfg = dataclasses.replace(m.cfg, history_attention=history_attention, history_window=w)
        return float(nnx.jit(lambda mm, b: mm.loss(b)[0])(m, batch))

    default, wide, narrow = loss("window_recompute", 3), loss("turn_window", 3), loss("turn_window", 1)
    assert abs(default - wide) < 1e-5 and abs(default - narrow) > 1e-4, (default, wide, narrow)
