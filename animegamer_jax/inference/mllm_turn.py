"""The MLLM's turn: GameStateMLLM on one turn's inputs -> the four states and s_a.

(docs/token_layout.md, models/mistral/mllm.py.) The history query slots take the projected history
representations (``embed_inputs``); pass B is one forward with the hybrid mask (+ the padding mask:
sequences are right-padded to one length per game shape) and the representation is read at the
turn's ``read_idx`` (the query positions, or the release's last 226 valid positions), then
``output_resampler``; pass A is the release's purely causal greedy decoding over the same
embeddings, constrained to the state grammar (``AnimeGamerTokenizer.state_grammar``) and run with a
KV cache inside one ``lax.scan``: prefill of the padded prompt, then one token per step at RoPE
position ``last_idx + t`` with the padding keys masked, so each row decodes as if unpadded. States
are read from the generated ids at positions 0, 3, 6, 9 (docs/token_layout.md#state-fields) by
:func:`mllm_turn`. With ``mllm.history_attention = "turn_window"`` the turn is
:func:`mllm_turn_cached` instead: the game's KV cache is kept between turns
(inference/turn_inputs.py ``CachePlan``, ``TurnKVCache``) and only the new tokens are prefilled,
once for both passes (see there for what is shared). In ``reference`` mode pass A is the release's
free greedy decoding (its logits processor, up to ``game.reference_max_new_tokens`` ids) and the
states come from its text parser on the host (inference/release_decoding.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from animegamer_jax import mllm_tokenizer
from animegamer_jax.inference import release_decoding
from animegamer_jax.inference.turn_inputs import CachePlan, TurnKVCache
from animegamer_jax.models import attention
from animegamer_jax.models.mistral import model as mistral
from animegamer_jax.models.mistral.mllm import hybrid_attention_mask

#: number of generated ids needed to read the four states (positions 0, 3, 6, 9)
STATE_TOKENS = 10


def _greedy_pass_a(llm, x: jax.Array, ids: jax.Array, last: jax.Array, num_tokens: int, pick) -> jax.Array:
    """Causal greedy decoding of ``num_tokens`` ids after each row's ``last`` position (pass A).

    One prefill of the right-padded prompt into a KV cache, then one token per ``lax.scan`` step at
    RoPE position ``last + t`` with the padding keys masked, so each row decodes as if unpadded.
    ``pick(t, logits [B, V] fp32, prev [B]) -> next ids [B]`` chooses each token.
    Returns int32 [B, num_tokens].
    """
    b, n = ids.shape
    cache = mistral.KVCache.init(llm.cfg, b, n + num_tokens - 1)
    out = llm(inputs_embeds=x, cache=cache, return_logits=False)
    h_last = jnp.take_along_axis(out.hidden, last[:, None, None], axis=1)
    logits = llm.logits(h_last)[:, 0].astype(jnp.float32)
    tok0 = pick(0, logits, jnp.take_along_axis(ids, last[:, None], axis=1)[:, 0]).astype(jnp.int32)
    k_pos = jnp.arange(n + num_tokens - 1)
    key_ok = (k_pos[None, :] <= last[:, None]) | (k_pos[None, :] >= n)  # drop the padding keys

    def step(carry, t):
        tok, cache = carry
        o = llm(tok[:, None], positions=(last + t)[:, None], cache=cache, padding_mask=key_ok)
        nxt = pick(t, o.logits[:, -1].astype(jnp.float32), tok).astype(jnp.int32)
        return (nxt, o.cache), nxt

    _, toks = jax.lax.scan(step, (tok0, out.cache), jnp.arange(1, num_tokens, dtype=jnp.int32))
    return jnp.concatenate([tok0[:, None], toks.T], axis=1)


def mllm_turn(mllm, batch: dict[str, jax.Array], window: int, decoding: str = "constrained",
              max_new_tokens: int = 200) -> tuple[jax.Array, jax.Array]:
    """One MLLM turn on a padded batch (see the module docstring).

    Args:
      mllm: a ``GameStateMLLM``.
      batch: ``inference.turn_inputs.stack_inputs`` arrays (ids, attention_mask, cmp_mask, gen_mask,
        hist_reps [B, W-1, Q, D], read_idx [B, Q], last_idx [B]).
      window: W (static); 1 means no history slots.
      decoding: ``"constrained"`` (state grammar, 10 ids, states read at positions 0, 3, 6, 9) or
        ``"free"`` (the release: ``max_new_tokens`` greedy ids after the release's logits processor,
        inference/release_decoding.py; the caller parses them on the host with
        ``release_decoding.states_from_generated``).

    Returns:
      ``constrained``: (states int32 [B, 4] = ML, SC, ET, ST; rep float32 [B, Q, D]);
      ``free``: (generated ids int32 [B, max_new_tokens]; rep).
    """
    ids = batch["ids"]
    valid = batch["attention_mask"] != 0
    if window > 1:
        x = mllm.embed_inputs(ids, batch["cmp_mask"], batch["hist_reps"])
    else:
        x = mllm.embed_inputs(ids, None, None)
    # pass B: hybrid mask, representation at read_idx
    mask = hybrid_attention_mask(batch["gen_mask"], mllm.cfg.llm.window, valid)
    hidden = mllm.llm(inputs_embeds=x, attention_mask=mask, return_logits=False).hidden
    read = jnp.take_along_axis(hidden, batch["read_idx"][:, :, None], axis=1)
    rep = mllm.output_resampler(read).astype(jnp.float32)
    # pass A: causal greedy decoding with a KV cache
    llm = mllm.llm
    if decoding == "free":
        def pick_free(t, logits, prev):
            return jnp.argmax(release_decoding.video_token_logits(prev, logits), axis=-1)

        return _greedy_pass_a(llm, x, ids, batch["last_idx"], int(max_new_tokens), pick_free), rep
    if decoding != "constrained":
        raise ValueError(f"decoding must be 'constrained' or 'free', got {decoding!r}")
    grammar = mllm_tokenizer.AnimeGamerTokenizer.state_grammar()[:STATE_TOKENS]
    allowed = np.zeros((STATE_TOKENS, llm.cfg.vocab_size), bool)
    for t, ok in enumerate(grammar):
        allowed[t, list(ok)] = True
    allowed = jnp.asarray(allowed)

    def pick_constrained(t, logits, prev):
        return jnp.argmax(jnp.where(allowed[t], logits, -jnp.inf), axis=-1)

    toks = _greedy_pass_a(llm, x, ids, batch["last_idx"], STATE_TOKENS, pick_constrained)  # [B, 10]
    states = toks[:, jnp.array([0, 3, 6, 9])] - mllm_tokenizer.STRENGTH_BASE_ID + mllm_tokenizer.STRENGTH_MIN
    return states.astype(jnp.int32), rep


def _cached_forward(llm, cache: TurnKVCache, x, pos, turn, slots, new_valid, window: int, *,
                    block: tuple[jax.Array, jax.Array] | None = None, hide: jax.Array | None = None):
    """Writes N new tokens at ``slots`` and runs them against the whole cache.

    x [B, N, D] embeddings; pos, turn, slots int32 [B, N]; new_valid bool [B, N]; block
    (first, last) positions of the bidirectional query block [B] or None (purely causal); hide
    bool [S] slots hidden from this call (the other pass's scratch). Mask: causal + Mistral's
    sliding window + the turn window W (``AttentionMask.seg_window``, ``<s>`` a sink).
    Returns (hidden [B, N, D] post-norm, cache).
    """
    rows = jnp.arange(x.shape[0])[:, None]
    cache = cache.replace(k_pos=cache.k_pos.at[rows, slots].set(pos), k_turn=cache.k_turn.at[rows, slots].set(turn),
                          valid=cache.valid.at[rows, slots].set(new_valid))
    kv_valid = cache.valid if hide is None else cache.valid & ~hide[None]
    first, last = (None, None) if block is None else block
    mask = attention.causal_mask(llm.cfg.window, q_pos=pos, k_pos=cache.k_pos, kv_valid=kv_valid, block_first=first,
                            block_last=last, q_seg=turn, k_seg=cache.k_turn, seg_window=window)
    out = llm(inputs_embeds=x, positions=pos, attention_mask=mask, return_logits=False,
              cache=mistral.KVCache(cache.k, cache.v, jnp.zeros((), jnp.int32)), cache_slots=slots)
    return out.hidden, cache.replace(k=out.cache.k, v=out.cache.v)


def _scratch(plan: CachePlan, start: int, n: int) -> jax.Array:
    return jnp.zeros((plan.size,), bool).at[start:start + n].set(True)


def mllm_prefill_cached(mllm, cache: TurnKVCache, batch: dict[str, jax.Array], plan: CachePlan,
                        readout: str = "query") -> tuple[jax.Array, TurnKVCache]:
    """The shared prefill of a cached turn (also what rebuilds a cache by recompute).

    Writes the previous turn's history suffix (its s_a through ``input_resampler`` and its
    world ids), the current turn's prefix and its query block under the hybrid mask (pass B, in
    scratch B) in one forward over the cache; returns (s_a float32 [B, Q, D], cache). ``batch``:
    inference/turn_inputs.py ``stack_cached_inputs``. Scratch A (last turn's pass A) is emptied first.
    """
    q = plan.num_queries
    x = mllm.embed_inputs(batch["ids"], batch["cmp_mask"], batch["hist_rep"][:, None])
    cache = cache.replace(valid=cache.valid & ~_scratch(plan, plan.scratch_a, plan.block + plan.decode_tokens)[None])
    hidden, cache = _cached_forward(mllm.llm, cache, x, batch["positions"], batch["turn_ids"], batch["slots"],
                                    batch["valid"], plan.window, block=(batch["block_first"], batch["block_last"]))
    blk = hidden[:, -plan.block:]
    read = blk[:, :q] if readout == "query" else blk[:, plan.block - q:]
    return mllm.output_resampler(read).astype(jnp.float32), cache


def mllm_turn_cached(mllm, cache: TurnKVCache, batch: dict[str, jax.Array], plan: CachePlan,
                     readout: str = "query") -> tuple[jax.Array, jax.Array, TurnKVCache, jax.Array]:
    """One MLLM turn on the game's persistent cache (``history_attention = "turn_window"``).

    Shared by passes A and B (one prefill, :func:`mllm_prefill_cached`): everything before the
    current query block, i.e. the history turns (cached from earlier turns), the previous turn's
    suffix and the current prefix ``<TURN> text <img><frame>``: both passes see these tokens
    with the same causal (+ turn window) mask, so their keys/values are the same. Not shared:
    the query block and ``</frame></img><ML>``, which pass B sees bidirectionally (hybrid mask)
    and pass A causally, so from layer 1 on their keys differ; pass A recomputes these Q + 3
    tokens in scratch A (scratch B hidden from it), then decodes the ``plan.decode_tokens``
    state ids one per step, constrained to the state grammar.

    Args:
      mllm: a ``GameStateMLLM``; cache: :class:`TurnKVCache` of the game(s) (``CachePlan``
        slots); batch: inference/turn_inputs.py ``stack_cached_inputs``; readout: "query" | "last".

    Returns:
      (states int32 [B, 4], rep float32 [B, Q, D], cache, pass-A logits float32 [B, T, V]).
    """
    rep, cache = mllm_prefill_cached(mllm, cache, batch, plan, readout)
    llm = mllm.llm
    b, n = batch["ids"].shape
    nb = plan.block
    xa = mllm.embed_inputs(batch["ids"][:, n - nb:], None, None)  # the block holds no history slot
    pos_a, turn_a = batch["positions"][:, n - nb:], batch["turn_ids"][:, n - nb:]
    slots_a = jnp.broadcast_to(plan.scratch_a + jnp.arange(nb, dtype=jnp.int32), (b, nb))
    hide_b = _scratch(plan, plan.scratch_b, nb)
    hidden, cache = _cached_forward(llm, cache, xa, pos_a, turn_a, slots_a, jnp.ones((b, nb), bool), plan.window,
                                    hide=hide_b)
    grammar = mllm_tokenizer.AnimeGamerTokenizer.state_grammar()[:plan.decode_tokens]
    allowed = np.zeros((len(grammar), llm.cfg.vocab_size), bool)
    for t, ok in enumerate(grammar):
        allowed[t, list(ok)] = True
    allowed = jnp.asarray(allowed)

    def pick(t, logits):
        return jnp.argmax(jnp.where(allowed[t], logits, -jnp.inf), axis=-1).astype(jnp.int32)

    logits0 = llm.logits(hidden[:, -1:])[:, 0]
    tok0 = pick(0, logits0)
    cur = batch["turn"][:, None]

    def step(carry, t):
        tok, c = carry
        pos = (batch["ml_pos"] + t)[:, None]
        slot = jnp.broadcast_to(plan.scratch_a + nb + t - 1, (b, 1)).astype(jnp.int32)
        h, c = _cached_forward(llm, c, llm.embed(tok[:, None]), pos, cur, slot, jnp.ones((b, 1), bool),
                               plan.window, hide=hide_b)
        lg = llm.logits(h)[:, 0]
        nxt = pick(t, lg)
        return (nxt, c), (nxt, lg)

    (_, cache), (toks, lgs) = jax.lax.scan(step, (tok0, cache), jnp.arange(1, plan.decode_tokens, dtype=jnp.int32))
    toks = jnp.concatenate([tok0[:, None], toks.T], axis=1)
    logits = jnp.concatenate([logits0[:, None], jnp.moveaxis(lgs, 0, 1)], axis=1)
    states = toks[:, jnp.array([0, 3, 6, 9])] - mllm_tokenizer.STRENGTH_BASE_ID + mllm_tokenizer.STRENGTH_MIN
    return states.astype(jnp.int32), rep, cache, logits
