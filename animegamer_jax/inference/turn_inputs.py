"""One turn's MLLM inputs: the token layout of the sliding window of past turns, and the turn-window KV cache.

Follows docs/token_layout.md (the layout itself is built once, by
``models/mistral/mllm.py`` ``turn_layout``, for training and play):

* Sequence = ``[<s>]`` + up to W-1 history turns + the current turn. A history turn is
  ``<TURN> text <img><frame><frame_0..n-1></frame></img>`` + the 14 world ids (with the release's
  duplicated ``</ST>``); the current turn ends with ``<ML>`` instead of the world ids.
* Three 1-D masks: ``attention_mask`` (1 valid, -1 the current turn's query block which attends
  bidirectionally, 0 padding), ``ids_cmp_mask`` (history query slots, overwritten by the projected
  history representations), ``ids_gen_mask`` (the current turn's query slots).
* ``default`` mode: history turns carry their own predicted states. ``reference`` mode reproduces the
  release: window 1 (so no history at all) and, were there history, ``<Strength_0>`` for every field.

Sequences are right-padded to one fixed length per game shape (:attr:`WindowSpec.seq_len`), so the
jitted MLLM step compiles once; the per-row read-out positions are passed as index arrays.

With ``mllm.history_attention = "turn_window"``
(docs/token_layout.md#history-attention-mllmhistory_attention) the MLLM keeps a KV cache across
turns instead: :class:`CachePlan` is its slot plan, :class:`TurnKVCache` the cache arrays and
:func:`build_cached_turn_input` the new tokens of one turn (cut from the same ``turn_layout``);
game/run.py ``GameRun`` holds a game's cache between turns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.models.mistral import model as mistral
from animegamer_jax.models.mistral.mllm import turn_layout

#: world ids per history turn (docs/token_layout.md#per-turn-layout, includes the duplicated ``</ST>``)
WORLD_LEN = 14


class InstructionTooLongError(ValueError):
    """An instruction has more tokens than ``game.max_instruction_tokens``."""


@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """A finished turn as kept in the window.

    Attributes:
      text_ids: instruction token ids (no BOS, no ``<TURN>``).
      states: the turn's own predicted ``(ML, SC, ET, ST)``.
      rep: its predicted representation s_a, float32 ``[Q, rep_dim]`` (Q = 226 at paper size).
    """

    text_ids: tuple[int, ...]
    states: tuple[int, int, int, int]
    rep: np.ndarray


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """How a game builds its MLLM input.

    Attributes:
      window: W, turns the MLLM sees including the current one (>= 1).
      num_queries: Q, query tokens per turn (226 at paper size).
      max_text: instruction token budget per turn (sequences are padded to it).
      readout: ``"query"`` (hidden states at the query positions) or ``"last"`` (release ``[-Q:]``).
      history_states: ``"own"`` (each history turn shows its predicted states) or ``"zero"``
        (the release's ``<Strength_0>`` bug, docs/token_layout.md#per-turn-layout).
      history_attention: ``"window_recompute"`` (the release's layout, rebuilt from the last W
        turns every turn) or ``"turn_window"`` (KV cache kept across turns, :class:`CachePlan`).
    """

    window: int
    num_queries: int
    max_text: int
    readout: str = "query"
    history_states: str = "own"
    history_attention: str = "window_recompute"

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"history window must be >= 1, got {self.window}")
        if self.readout not in ("query", "last"):
            raise ValueError(f"readout must be 'query' or 'last', got {self.readout!r}")
        if self.history_states not in ("own", "zero"):
            raise ValueError(f"history_states must be 'own' or 'zero', got {self.history_states!r}")
        if self.history_attention not in ("window_recompute", "turn_window"):
            raise ValueError(f"mllm.history_attention must be 'window_recompute' or 'turn_window', got "
                             f"{self.history_attention!r}")

    @classmethod
    def from_config(cls, config) -> "WindowSpec":
        """From ``config.game.mode`` (+ ``mllm.history_window``, ``mllm.readout``, ``rep``, ``game``).

        Raises:
          ValueError: unknown ``game.mode``.
        """
        nq = config.rep.num_text_tokens + config.rep.num_image_tokens
        mode = config.game.mode
        if mode == "reference":
            return cls(1, nq, config.game.max_instruction_tokens, "last", "zero")
        if mode != "default":
            raise ValueError(f"game.mode must be 'default' or 'reference', got {mode!r}")
        return cls(config.mllm.history_window, nq, config.game.max_instruction_tokens,
                   config.mllm.readout, "own", config.mllm.get("history_attention", "window_recompute"))

    @property
    def seq_len(self) -> int:
        """The padded sequence length L of every turn of every game with this spec."""
        block = 1 + self.max_text + self.num_queries + 4
        return 1 + (self.window - 1) * (block + WORLD_LEN) + block + 1


@dataclasses.dataclass
class TurnInput:
    """One row of the MLLM batch (numpy, host side).

    Attributes:
      ids: int32 ``[L]`` right-padded with ``PAD_ID``.
      attention_mask: int32 ``[L]``: 1 valid, -1 current queries (bidirectional block), 0 padding.
      cmp_mask: bool ``[L]`` history query slots.
      gen_mask: bool ``[L]`` current query slots.
      hist_reps: float32 ``[W-1, Q, rep_dim]`` history representations, oldest first, zero-padded.
      hist_pos: int32 ``[W-1, Q]`` positions of each history slot's queries (0 where unused).
      hist_valid: bool ``[W-1]``.
      read_idx: int32 ``[Q]`` positions whose final hidden states become s_a (per ``readout``).
      last_idx: int32 scalar, position of the final ``<ML>`` (state decoding starts after it).
      length: number of valid positions.
    """

    ids: np.ndarray
    attention_mask: np.ndarray
    cmp_mask: np.ndarray
    gen_mask: np.ndarray
    hist_reps: np.ndarray
    hist_pos: np.ndarray
    hist_valid: np.ndarray
    read_idx: np.ndarray
    last_idx: int
    length: int


def encode_instruction(text: str, spec: WindowSpec, tok: mllm_tokenizer.AnimeGamerTokenizer | None = None,
                       where: str = "") -> tuple[int, ...]:
    """Instruction ids (no BOS), checked against the per-turn budget.

    Args:
      where: where the instruction comes from (``"game.txt:3"``), starts the error message.

    Raises:
      InstructionTooLongError: more than ``spec.max_text`` tokens (names ``where``, the count and
        the fix; the text is shortened to its start).
    """
    tok = tok or mllm_tokenizer.get_tokenizer()
    ids = tuple(tok.encode_plain(text))
    if len(ids) > spec.max_text:
        head = text if len(text) <= 60 else text[:57] + "..."
        raise InstructionTooLongError(
            f"{where + ': ' if where else ''}instruction {head!r} has {len(ids)} tokens, more than "
            f"game.max_instruction_tokens={spec.max_text}. Fix: shorten it or raise "
            f"--config.game.max_instruction_tokens")
    return ids


def validate_games(games: Sequence[Any], spec: WindowSpec,
                   tok: mllm_tokenizer.AnimeGamerTokenizer | None = None) -> None:
    """Encodes every instruction of every game up front, so a bad one stops the run before its first turn.

    ``games``: :class:`animegamer_jax.inference.instructions.Game` s; each turn's ``where`` (file:line) names it.

    Raises:
      InstructionTooLongError: the first instruction over the budget (file:line, game id, turn).
    """
    tok = tok or mllm_tokenizer.get_tokenizer()
    for g in games:
        for j, t in enumerate(g.turns):
            where = getattr(t, "where", "") or f"game {g.game_id!r} turn {j + 1}"
            encode_instruction(t.text, spec, tok, where=where)


def build_turn_input(history: Sequence[TurnRecord], current_ids: Sequence[int], spec: WindowSpec,
                     rep_dim: int) -> TurnInput:
    """Builds the MLLM input of the current turn from the last ``W-1`` finished turns.

    Args:
      history: every finished turn of the game, oldest first (only the last W-1 are used).
      current_ids: the current instruction's ids.
      spec: window / read-out / padding.
      rep_dim: D of the representations.
    """
    nh = spec.window - 1
    used = list(history[len(history) - nh:]) if nh > 0 else []
    seq = turn_layout([rec.text_ids for rec in used] + [tuple(current_ids)], [rec.states for rec in used],
                      num_queries=spec.num_queries, history_window=spec.window,
                      release_history_states=spec.history_states == "zero")
    hist_reps = np.zeros((max(nh, 0), spec.num_queries, rep_dim), np.float32)
    hist_pos = np.zeros((max(nh, 0), spec.num_queries), np.int32)
    hist_valid = np.zeros((max(nh, 0),), bool)
    cmp_pos = np.flatnonzero(seq.cmp_mask).reshape(len(used), spec.num_queries)
    for j, rec in enumerate(used):
        hist_reps[j] = rec.rep
        hist_pos[j] = cmp_pos[j]
        hist_valid[j] = True
    length = len(seq.input_ids)
    if length > spec.seq_len:
        raise InstructionTooLongError(f"turn sequence has {length} ids > padded length {spec.seq_len}")
    pad = spec.seq_len - length
    q0 = int(np.flatnonzero(seq.gen_mask)[0])
    if spec.readout == "query":
        read_idx = np.arange(q0, q0 + spec.num_queries, dtype=np.int32)
    else:
        read_idx = np.arange(length - spec.num_queries, length, dtype=np.int32)
    att = np.where(seq.gen_mask, -1, 1).astype(np.int32)  # -1: the bidirectional current query block
    return TurnInput(
        ids=np.concatenate([seq.input_ids, np.full(pad, mllm_tokenizer.PAD_ID, np.int32)]),
        attention_mask=np.concatenate([att, np.zeros(pad, np.int32)]),
        cmp_mask=np.concatenate([seq.cmp_mask, np.zeros(pad, bool)]),
        gen_mask=np.concatenate([seq.gen_mask, np.zeros(pad, bool)]),
        hist_reps=hist_reps, hist_pos=hist_pos, hist_valid=hist_valid,
        read_idx=read_idx, last_idx=length - 1, length=length)


def stack_inputs(rows: Sequence[TurnInput]) -> dict[str, np.ndarray]:
    """Stacks rows into the batch dict the jitted MLLM step takes (leading dim B)."""
    keys = ("ids", "attention_mask", "cmp_mask", "gen_mask", "hist_reps", "hist_pos", "hist_valid", "read_idx")
    out = {k: np.stack([getattr(r, k) for r in rows]) for k in keys}
    out["last_idx"] = np.asarray([r.last_idx for r in rows], np.int32)
    return out


#: tokens of a history turn after its query block starts: Q reps, </frame></img>, 14 world ids
def _suffix_len(q: int) -> int:
    return q + 2 + WORLD_LEN


@dataclasses.dataclass(frozen=True)
class CachePlan:
    """Slot plan of one game's rolling KV cache (the Mistral-7B rolling buffer at turn granularity).

    Every token of turn t attends to turns t-W+1..t only (and ``<s>``), so a turn's keys/values
    never change once written and turns older than W-1 are never read again. Slots:

    * ``0``: ``<s>`` (attention sink, kept for the whole game);
    * ``W + 1`` turn regions of :attr:`region` slots, turn t in region ``t % (W + 1)``: its
      prefix ``<TURN> text <img><frame>`` (padded to ``3 + max_text``), written in turn t's own
      step, then its history suffix (Q projected reps, ``</frame></img>``, 14 world ids), written
      at the start of turn t+1 once its s_a and states exist. W + 1 regions (not W) let turn t+1's
      prefix and turn t's suffix go in one prefill: the suffix still reads turn t-W+1, whose
      region only turn t+2 overwrites;
    * scratch B (Q + 3 slots): the current turn's query block + ``</frame></img><ML>`` under the
      hybrid mask (pass B);
    * scratch A (Q + 3 + ``decode_tokens`` slots): the same block under the causal mask, then the
      ``decode_tokens`` decoded state ids (pass A).

    Positions are those of the whole game as one sequence (``<s>`` at 0, history turns of
    ``n_text + Q + 19`` tokens), so the cache equals a full recompute of the game with the same
    mask; RoPE makes scores depend only on position differences, which the window bounds.
    """

    window: int
    num_queries: int
    max_text: int
    decode_tokens: int = 10

    @property
    def prefix(self) -> int:
        """Slots of a turn's prefix area (``<TURN>``, text, ``<img><frame>``)."""
        return 3 + self.max_text

    @property
    def region(self) -> int:
        return self.prefix + _suffix_len(self.num_queries)

    @property
    def num_regions(self) -> int:
        return self.window + 1

    @property
    def block(self) -> int:
        """Query block + ``</frame></img><ML>`` of the current turn (Q + 3)."""
        return self.num_queries + 3

    @property
    def scratch_b(self) -> int:
        return 1 + self.num_regions * self.region

    @property
    def scratch_a(self) -> int:
        return self.scratch_b + self.block

    @property
    def size(self) -> int:
        """Cache slots S."""
        return self.scratch_a + self.block + self.decode_tokens

    @property
    def new_tokens(self) -> int:
        """Tokens of one step's prefill: previous turn's suffix, current prefix, query block."""
        return _suffix_len(self.num_queries) + self.prefix + self.block

    def region_start(self, turn: int) -> int:
        return 1 + (turn % self.num_regions) * self.region

    @classmethod
    def from_spec(cls, spec: "WindowSpec", decode_tokens: int = 10) -> "CachePlan":
        return cls(spec.window, spec.num_queries, spec.max_text, decode_tokens)


def turn_start(history: Sequence[TurnRecord], num_queries: int) -> int:
    """Position of turn ``len(history)``'s ``<TURN>`` in the game as one sequence (``<s>`` at 0)."""
    return 1 + sum(3 + len(r.text_ids) + _suffix_len(num_queries) for r in history)


@dataclasses.dataclass
class CachedTurnInput:
    """One row of a cached MLLM step (numpy). L = ``CachePlan.new_tokens``.

    Attributes:
      ids: int32 [L] new tokens: the previous turn's history suffix (or ``<s>`` at turn 0),
        the current turn's prefix, its query block + ``</frame></img><ML>``; padding = PAD_ID.
      cmp_mask: bool [L] positions taking the previous turn's projected s_a.
      hist_rep: float32 [Q, rep_dim] the previous turn's s_a (zeros at turn 0).
      positions: int32 [L] game positions; turn_ids: int32 [L] game turn (-1 = ``<s>``).
      slots: int32 [L] cache slots written; valid: bool [L] real (not padding) tokens.
      block_first, block_last: positions of the current query block; ml_pos: position of ``<ML>``.
      turn: the current turn index k.
    """

    ids: np.ndarray
    cmp_mask: np.ndarray
    hist_rep: np.ndarray
    positions: np.ndarray
    turn_ids: np.ndarray
    slots: np.ndarray
    valid: np.ndarray
    block_first: int
    block_last: int
    ml_pos: int
    turn: int


def build_cached_turn_input(history: Sequence[TurnRecord], current_ids: Sequence[int], spec: WindowSpec,
                            rep_dim: int, plan: CachePlan | None = None) -> CachedTurnInput:
    """The new tokens of turn ``k = len(history)`` for the rolling cache (:class:`CachePlan`).

    They are cut from ``models/mistral/mllm.py`` ``turn_layout`` of turns k-1 (history form) and k, the
    one token layout, so ids and masks are those of a full recompute over the whole game.

    Raises:
      InstructionTooLongError: an instruction over ``spec.max_text`` tokens.
    """
    plan = plan or CachePlan.from_spec(spec)
    q, k = spec.num_queries, len(history)
    if len(current_ids) > spec.max_text:
        raise InstructionTooLongError(f"instruction of {len(current_ids)} ids > game.max_instruction_tokens="
                                      f"{spec.max_text}")
    prev = [history[-1]] if k else []
    seq = turn_layout([r.text_ids for r in prev] + [tuple(current_ids)], [r.states for r in prev],
                      num_queries=q, history_window=2, release_history_states=spec.history_states == "zero")
    # layout index i -> game position: index 1 is turn k-1's <TURN> (or, at k = 0, turn 0's)
    offset = turn_start(history[:-1], q) - 1 if k else 0
    turns = np.where(seq.turn_ids < 0, -1, seq.turn_ids + max(k - 1, 0)).astype(np.int32)
    g0 = int(np.flatnonzero(seq.gen_mask)[0])
    p0 = int(np.flatnonzero(turns == k)[0])
    n_s, n_p, n_b = _suffix_len(q), plan.prefix, plan.block
    if k:
        c0 = int(np.flatnonzero(seq.cmp_mask)[0])
        suf = np.arange(c0, p0)
        suf_slots = plan.region_start(k - 1) + plan.prefix + np.arange(n_s)
    else:
        suf = np.arange(0, 1)  # <s>
        suf_slots = np.r_[0, plan.region_start(-1) + plan.prefix + np.arange(1, n_s)]
    pre = np.arange(p0, g0)
    blk = np.arange(g0, len(seq.input_ids))
    assert len(suf) <= n_s and len(blk) == n_b, (len(suf), len(blk))

    def part(idx: np.ndarray, n: int, arr: np.ndarray, fill: Any) -> np.ndarray:
        return np.concatenate([arr[idx], np.full(n - len(idx), fill, arr.dtype)])

    pos = np.arange(len(seq.input_ids), dtype=np.int32) + offset

    def cat(arr: np.ndarray, fill: Any) -> np.ndarray:
        return np.concatenate([part(suf, n_s, arr, fill), part(pre, n_p, arr, fill), part(blk, n_b, arr, fill)])

    valid = np.concatenate([np.arange(n_s) < len(suf), np.arange(n_p) < len(pre), np.ones(n_b, bool)])
    slots = np.concatenate([suf_slots, plan.region_start(k) + np.arange(n_p),
                            plan.scratch_b + np.arange(n_b)]).astype(np.int32)
    hist_rep = np.asarray(prev[0].rep, np.float32) if k else np.zeros((q, rep_dim), np.float32)
    return CachedTurnInput(
        ids=cat(seq.input_ids, mllm_tokenizer.PAD_ID), cmp_mask=cat(seq.cmp_mask, False), hist_rep=hist_rep,
        positions=cat(pos, 0), turn_ids=cat(turns, k), slots=slots, valid=valid,
        block_first=int(pos[g0]), block_last=int(pos[g0 + q - 1]), ml_pos=int(pos[-1]), turn=k)


def stack_cached_inputs(rows: Sequence[CachedTurnInput]) -> dict[str, np.ndarray]:
    """Stacks rows into the batch dict of inference/mllm_turn.py ``mllm_turn_cached`` (leading dim B)."""
    keys = ("ids", "cmp_mask", "hist_rep", "positions", "turn_ids", "slots", "valid")
    out = {k: np.stack([getattr(r, k) for r in rows]) for k in keys}
    for k in ("block_first", "block_last", "ml_pos", "turn"):
        out[k] = np.asarray([getattr(r, k) for r in rows], np.int32)
    return out


@flax.struct.dataclass
class TurnKVCache:
    """One game's (or a batch's) rolling MLLM cache, slots as :class:`CachePlan`.

    k, v: [num_layers, B, S, K, H] (compute dtype); k_pos: int32 [B, S] game position of each
    slot; k_turn: int32 [B, S] its turn (-1 = ``<s>``); valid: bool [B, S] slot holds a token.
    """

    k: jax.Array
    v: jax.Array
    k_pos: jax.Array
    k_turn: jax.Array
    valid: jax.Array

    @classmethod
    def init(cls, cfg: mistral.MistralConfig, batch: int, plan: CachePlan) -> "TurnKVCache":
        """An empty cache (no valid slot) for ``batch`` games."""
        kv = mistral.KVCache.init(cfg, batch, plan.size)
        z = jnp.zeros((batch, plan.size), jnp.int32)
        return cls(kv.k, kv.v, z, z, jnp.zeros((batch, plan.size), bool))

    def rows(self, i: int, j: int) -> "TurnKVCache":
        """Games ``i:j`` of the batch."""
        return TurnKVCache(self.k[:, i:j], self.v[:, i:j], self.k_pos[i:j], self.k_turn[i:j], self.valid[i:j])

    @staticmethod
    def concat(caches: list["TurnKVCache"]) -> "TurnKVCache":
        """Stacks per-game caches along the batch axis."""
        if len(caches) == 1:
            return caches[0]
        return TurnKVCache(jnp.concatenate([c.k for c in caches], 1), jnp.concatenate([c.v for c in caches], 1),
                           *(jnp.concatenate([getattr(c, f) for c in caches], 0) for f in ("k_pos", "k_turn", "valid")))
