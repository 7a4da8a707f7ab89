"""The MLLM's turn: GameStateMLLM on one turn's inputs -> the four states and s_a.

(docs/token_layout.md, models/mistral/mllm.py.) The history query slots take the projected history
representations (``embed_inputs``); pass B is one forward with the hybrid mask (+ the padding mask:
sequences are right-padded to one length per game shape) and the representation is read at the
turn's ``read_idx`` (the query positions, or the release's last 226 valid positions), then
``output_resampler``; pass A is the release's purely causal greedy decoding over the same
embeddings, constrained to the state grammar (``AnimeGamerTokenizer.state_grammar``) and run with a
KV cache inside one ``lax.scan``: prefill of the padded prompt, then per step the chosen id and the
grammar's fixed ids after it in one forward (jump-forward: the ten state ids cost prefill + 3
forwards; the same ids as one id per step) at RoPE positions ``last_idx + 1 + ..`` with the padding
keys masked, so each row decodes as if unpadded. States
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

from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.inference import release_decoding
from animegamer_jax.inference.turn_inputs import CachePlan, TurnKVCache
from animegamer_jax.models import attention
from animegamer_jax.models.mistral import model as mistral
from animegamer_jax.models.mistral.mllm import hybrid_attention_mask

#: number of generated ids needed to read the four states (positions 0, 3, 6, 9)
STATE_TOKENS = 10


def jump_schedule(grammar) -> np.ndarray:
    """The ids fed after each chosen one when decoding ``grammar`` (allowed ids per position).

    A grammar of free positions (several allowed ids), each followed by the same number k-1 of fixed
    positions (one allowed id), ending with a free one, e.g. the states' ``free f f free f f free f f
    free``, gives int32 [num_steps, k-1] (num_steps = the free positions after the first): step s of
    :func:`_decode` feeds the chosen id and row s in one forward.

    Raises: ValueError for a grammar not of that shape.
    """
    free = [t for t, ok in enumerate(grammar) if len(ok) != 1]
    k = free[1] - free[0] if len(free) > 1 else 1
    if not free or free[0] != 0 or free != list(range(0, len(grammar), k)) or (len(grammar) - 1) % k:
        raise ValueError(f"grammar is not free ids each followed by {k - 1} fixed ids: {grammar!r}")
    return np.asarray([[grammar[f + j][0] for j in range(1, k)] for f in free[:-1]], np.int32).reshape(len(free) - 1,
                                                                                                       k - 1)


def _allowed(grammar, vocab_size: int) -> jax.Array:
    """bool [len(grammar), V]: the ids allowed at each generated position."""
    allowed = np.zeros((len(grammar), vocab_size), bool)
    for t, ok in enumerate(grammar):
        allowed[t, list(ok)] = True
    return jnp.asarray(allowed)


def _decode(forward, carry, tok0: jax.Array, pick, fixed: np.ndarray, keep_logits: bool = False):
    """Greedy decoding after ``tok0`` with jump-forward over fixed ids, in one ``lax.scan``.

    Step s feeds ``[chosen_s, *fixed[s]]`` (k = 1 + fixed.shape[1] tokens) in ONE forward (the KV cache
    is written for all k) and chooses id ``chosen_{s+1}`` from the last position's logits, so num_steps
    steps yield 1 + num_steps*k ids with num_steps weight reads instead of num_steps*k. The fixed ids are the only ids the step-by-step
    constrained argmax could pick there, so the ids are the same as decoding one id per step.

    Args:
      forward: ``(tokens int32 [B, k], s int32 [], carry) -> (logits float32 [B, k, V], carry)``.
      tok0: int32 [B], the first (chosen) id, output position 0.
      pick: ``(t, logits [B, V] fp32, prev [B]) -> ids [B]`` for output position t (prev: the id at t-1).
      fixed: int [num_steps, k-1] (``jump_schedule``; shape [num_steps, 0] = one id per step).
      keep_logits: also return the logits of positions 1..num_steps*k.

    Returns: (ids int32 [B, 1 + num_steps*k], logits float32 [B, num_steps*k, V] or None, carry).
    """
    b = tok0.shape[0]
    n_steps, k = fixed.shape[0], fixed.shape[1] + 1
    fixed_j = jnp.asarray(fixed, jnp.int32).reshape(n_steps, k - 1)

    def step(c, s):
        tok, inner = c
        feed = jnp.concatenate([tok[:, None], jnp.broadcast_to(fixed_j[s], (b, k - 1))], axis=1)
        logits, inner = forward(feed, s, inner)
        nxt = pick((s + 1) * k, logits[:, -1].astype(jnp.float32), feed[:, -1]).astype(jnp.int32)
        return (nxt, inner), (feed, logits if keep_logits else None)

    (last_tok, carry), (feeds, logits) = jax.lax.scan(step, (tok0.astype(jnp.int32), carry),
                                                      jnp.arange(n_steps, dtype=jnp.int32))
    ids = jnp.concatenate([jnp.moveaxis(feeds, 0, 1).reshape(b, n_steps * k), last_tok[:, None]], axis=1)
    if keep_logits:
        logits = jnp.moveaxis(logits, 0, 1).reshape(b, n_steps * k, -1)
    return ids, logits, carry


def _greedy_pass_a(llm, x: jax.Array, ids: jax.Array, last: jax.Array, pick, fixed: np.ndarray) -> jax.Array:
    """Causal greedy decoding after each row's ``last`` position (pass A), :func:`_decode`'s schedule.

    One prefill of the right-padded prompt into a KV cache, then each step's k ids at RoPE positions
    ``last + 1 + s*k ..`` (cache slots n + s*k ..) with the padding keys masked, so each row decodes as
    if unpadded. ``pick(t, logits [B, V] fp32, prev [B]) -> next ids [B]`` chooses each free id;
    ``fixed`` int [num_steps, k-1] (``jump_schedule``; [num_steps, 0] = one id per step). Returns int32
    [B, 1 + num_steps*k].
    """
    b, n = ids.shape
    n_steps, k = fixed.shape[0], fixed.shape[1] + 1
    cache = mistral.KVCache.init(llm.cfg, b, n + n_steps * k)
    out = llm(inputs_embeds=x, cache=cache, return_logits=False)
    h_last = jnp.take_along_axis(out.hidden, last[:, None, None], axis=1)
    logits = llm.logits(h_last)[:, 0].astype(jnp.float32)
    tok0 = pick(0, logits, jnp.take_along_axis(ids, last[:, None], axis=1)[:, 0]).astype(jnp.int32)
    k_pos = jnp.arange(n + n_steps * k)
    key_ok = (k_pos[None, :] <= last[:, None]) | (k_pos[None, :] >= n)  # drop the padding keys

    def forward(feed, s, cache):
        pos = (last + 1 + s * k)[:, None] + jnp.arange(k, dtype=jnp.int32)
        o = llm(feed, positions=pos, cache=cache, padding_mask=key_ok)
        return o.logits, o.cache

    toks, _, _ = _decode(forward, out.cache, tok0, pick, fixed)
    return toks


def mllm_turn(mllm, batch: dict[str, jax.Array], window: int, decoding: str = "constrained",
              max_new_tokens: int = 200) -> tuple[jax.Array, jax.Array]:
    """One MLLM turn on a padded batch (see the module docstring).

    Args:
      mllm: a ``GameStateMLLM``.
      batch: ``inference.turn_inputs.stack_inputs`` arrays (ids, attention_mask, cmp_mask, gen_mask,
        hist_reps [B, W-1, Q, rep_dim], read_idx [B, Q], last_idx [B]).
      window: W (static); 1 means no history slots.
      decoding: ``"constrained"`` (state grammar, 10 ids, states read at positions 0, 3, 6, 9) or
        ``"free"`` (the release: ``max_new_tokens`` greedy ids after the release's logits processor,
        inference/release_decoding.py; the caller parses them on the host with
        ``release_decoding.states_from_generated``).

    Returns:
      ``constrained``: (states int32 [B, 4] = ML, SC, ET, ST; rep float32 [B, Q, rep_dim]);
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

        return _greedy_pass_a(llm, x, ids, batch["last_idx"], pick_free,
                              np.zeros((int(max_new_tokens) - 1, 0), np.int32)), rep
    if decoding != "constrained":
        raise ValueError(f"decoding must be 'constrained' or 'free', got {decoding!r}")
    grammar = mllm_tokenizer.AnimeGamerTokenizer.state_grammar()[:STATE_TOKENS]
    allowed = _allowed(grammar, llm.cfg.vocab_size)

    def pick_constrained(t, logits, prev):
        return jnp.argmax(jnp.where(allowed[t], logits, -jnp.inf), axis=-1)

    # jump-forward: prefill + 3 forwards (each a free id and the two fixed ids after it)
    toks = _greedy_pass_a(llm, x, ids, batch["last_idx"], pick_constrained, jump_schedule(grammar))  # [B, 10]
    states = toks[:, jnp.array([0, 3, 6, 9])] - mllm_tokenizer.STRENGTH_BASE_ID + mllm_tokenizer.STRENGTH_MIN
    return states.astype(jnp.int32), rep


def _cached_forward(llm, cache: TurnKVCache, x, pos, turn, slots, new_valid, window: int, *,
                    block: tuple[jax.Array, jax.Array] | None = None, hide: jax.Array | None = None):
    """Writes L new tokens at ``slots`` and runs them against the whole cache.

    x [B, L, D] embeddings; pos, turn, slots int32 [B, L]; new_valid bool [B, L]; block
    (first, last) positions of the bidirectional query block [B] or None (purely causal); hide
    bool [S] slots hidden from this call (the other pass's scratch). Mask: causal + Mistral's
    sliding window + the turn window W (``AttentionMask.seg_window``, ``<s>`` a sink).
    Returns (hidden [B, L, D] post-norm, cache).
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
    scratch B) in one forward over the cache; returns (s_a float32 [B, Q, rep_dim], cache). ``batch``:
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
      (states int32 [B, 4], rep float32 [B, Q, rep_dim], cache, pass-A logits float32
      [B, plan.decode_tokens, V]).
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
    allowed = _allowed(grammar, llm.cfg.vocab_size)
    fixed = jump_schedule(grammar)
    k = fixed.shape[1] + 1

    def pick(t, logits, prev=None):
        return jnp.argmax(jnp.where(allowed[t], logits, -jnp.inf), axis=-1).astype(jnp.int32)

    logits0 = llm.logits(hidden[:, -1:])[:, 0]
    tok0 = pick(0, logits0)
    cur = jnp.broadcast_to(batch["turn"][:, None], (b, k))

    def forward(feed, s, c):
        pos = (batch["ml_pos"] + 1 + s * k)[:, None] + jnp.arange(k, dtype=jnp.int32)
        slot = jnp.broadcast_to(plan.scratch_a + nb + s * k + jnp.arange(k, dtype=jnp.int32), (b, k))
        h, c = _cached_forward(llm, c, llm.embed(feed), pos, cur, slot, jnp.ones((b, k), bool), plan.window,
                               hide=hide_b)
        return llm.logits(h), c

    # jump-forward: 3 forwards after the block (each a free id and the two fixed ids after it)
    toks, lgs, cache = _decode(forward, cache, tok0, pick, fixed, keep_logits=True)
    logits = jnp.concatenate([logits0[:, None], lgs], axis=1)
    states = toks[:, jnp.array([0, 3, 6, 9])] - mllm_tokenizer.STRENGTH_BASE_ID + mllm_tokenizer.STRENGTH_MIN
    return states.astype(jnp.int32), rep, cache, logits
