"""GameStateMLLM: Mistral + LoRA + resamplers, the "game engine" of AnimeGamer (paper §3.2).

Reference: the release's ``ContinuousLVLM_Video`` (docs/token_layout.md, docs/mllm.md). One turn:

* the sequence (built by :func:`build_sequence`) is ``<s>``, up to W-1 history turns
  (``<TURN> text <img><frame> 226 queries </frame></img>`` + 14 world ids with the duplicated
  ``</ST>``), then the current turn ending in ``<ML>``;
* history query positions (``cmp_mask``) get their turn's representation s_a [226, 1920] through
  the input resampler (1920 -> 4096 -> 4096, GELU), in order: run j <- history slot j
  (docs/token_layout.md#history-window);
* the current turn's 226 query positions (``gen_mask``) keep the ``<frame_i>`` embeddings and see
  each other fully (hybrid mask, docs/token_layout.md#masks); everything else is causal (+ sliding window);
  ``history_attention = "turn_window"`` (not the release's;
  docs/token_layout.md#history-attention-mllmhistory_attention) also limits every token of turn t
  to turns t-W+1..t (``turn_ids``), which lets play keep the KV cache across turns (inference/mllm_turn.py
  ``mllm_turn_cached``);
* the representation is read at the query positions (``readout="query"``, training-exact) or at
  the last 226 positions (``readout="last"``, the release's off-by-3, docs/token_layout.md#read-out),
  post final RMSNorm, then the output resampler (4096 -> 1920 -> 1920);
* states [ML, SC, ET, ST] come from a separate purely causal greedy pass constrained to the legal
  grammar ``<Strength_a></ML><SC><Strength_b></SC><ET><Strength_c></ET><ST><Strength_d></ST>``,
  parsed from ids at generated positions 0, 3, 6, 9 (docs/token_layout.md#state-fields);
* training loss ``lm_loss_scale * CE(labels) + rec_loss_scale * MSE + cos_loss_scale * (1 - cos)``
  (docs/mllm.md#losses).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.config import MLLM_QUANTIZE
from animegamer_jax.models import attention as attn
from animegamer_jax.models.mistral import model as mistral_model
from animegamer_jax.models import layers as lora_lib
from animegamer_jax.models.layers import LoRAEinsum
from animegamer_jax.parallel import mesh as pmesh

IGNORE_INDEX = -100
#: ``mllm.history_attention`` values (docs/token_layout.md#history-attention-mllmhistory_attention): the release's
#: layout recomputed over the last W turns every turn, or a turn-granular sliding window.
HISTORY_ATTENTION = ("window_recompute", "turn_window")


def num_queries(config: Any) -> int:
    """Query tokens Q of s_a per turn: ``rep.num_text_tokens + rep.num_image_tokens`` of the root config
    (226 at paper size)."""
    return int(config.rep.num_text_tokens + config.rep.num_image_tokens)


@dataclasses.dataclass(frozen=True)
class MLLMConfig:
    """GameStateMLLM hyper-parameters: the Mistral config plus the representation/loss fields."""

    llm: mistral_model.MistralConfig
    rep_dim: int = 1920  # width of s_a (cfg.rep.dim)
    num_queries: int = 226  # query / representation tokens (30 text + 196 image)
    history_window: int = 3  # W: turns seen, current included
    readout: str = "query"  # "query" | "last"
    history_attention: str = "window_recompute"  # | "turn_window" (HISTORY_ATTENTION)
    lm_loss_scale: float = 1.0
    rec_loss_scale: float = 1.0
    cos_loss_scale: float = 0.0

    def __post_init__(self):
        if self.history_attention not in HISTORY_ATTENTION:
            raise ValueError(f"mllm.history_attention must be one of {HISTORY_ATTENTION}, got "
                             f"{self.history_attention!r}")

    @property
    def turn_window(self) -> int | None:
        """W when every token attends only to the last W turns (``"turn_window"``), else None."""
        return int(self.history_window) if self.history_attention == "turn_window" else None

    @classmethod
    def from_config(cls, cfg: Any, **llm_overrides: Any) -> "MLLMConfig":
        """From the root ConfigDict (uses ``cfg.mllm`` and ``cfg.rep``)."""
        m = cfg.mllm
        return cls(
            llm=mistral_model.MistralConfig.from_config(m, **llm_overrides),
            rep_dim=cfg.rep.dim,
            num_queries=num_queries(cfg),
            history_window=m.history_window,
            readout=m.readout,
            history_attention=m.get("history_attention", "window_recompute"),
            lm_loss_scale=m.lm_loss_scale,
            rec_loss_scale=m.rec_loss_scale,
            cos_loss_scale=m.cos_loss_scale,
        )


class Resampler(nnx.Module):
    """Release ``ProjectionLayer``: Linear(d_in, d_hidden) -> exact GELU -> Linear(d_hidden, d_out), biases.

    x [..., d_in] -> [..., d_out]. Torch names ``proj.0`` / ``proj.2`` map to ``fc1`` / ``fc2``.
    """

    def __init__(self, d_in: int, d_hidden: int, d_out: int, *, axes: tuple[Any, Any, Any],
                 dtype: Any, param_dtype: Any, rngs: nnx.Rngs):
        self.fc1 = LoRAEinsum((d_in,), (d_hidden,), in_axes=(axes[0],), out_axes=(axes[1],), use_bias=True,
                              dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.fc2 = LoRAEinsum((d_hidden,), (d_out,), in_axes=(axes[1],), out_axes=(axes[2],), use_bias=True,
                              dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


@flax.struct.dataclass
class MLLMOutput:
    """logits [B, L, V] fp32 or None; hidden [B, L, D] (post-norm); rep [B, Q, rep_dim] (s_a)."""

    logits: jax.Array | None
    hidden: jax.Array
    rep: jax.Array


def hybrid_attention_mask(gen_mask: jax.Array, window: int | None,
                          padding_mask: jax.Array | None = None, turn_ids: jax.Array | None = None,
                          turn_window: int | None = None) -> attn.AttentionMask:
    """Release attention mask (docs/token_layout.md#masks) as an
    :class:`~animegamer_jax.models.attention.AttentionMask`.

    Causal (and ``q - k < window``) everywhere, plus the full square ``[first..last] x [first..last]``
    where first/last are the first and last True of ``gen_mask`` [B, L] per row (the current turn's
    queries; rows without any True are purely causal). Padding keys (``padding_mask`` bool [B, L]
    False) are masked. Positions are sequence indices ``0..L-1``. With ``turn_window`` W (the
    ``"turn_window"`` history attention) a token of turn ``turn_ids[i]`` (int [B, L], -1 for
    ``<s>``, :func:`turn_layout`) sees only keys of turns ``turn_ids[i]-W+1 .. turn_ids[i]`` and ``<s>``.

    Raises: ValueError: ``turn_window`` without ``turn_ids``.
    """
    l = gen_mask.shape[1]
    any_q = gen_mask.any(axis=1)
    first = jnp.where(any_q, jnp.argmax(gen_mask, axis=1), l).astype(jnp.int32)
    last = jnp.where(any_q, l - 1 - jnp.argmax(gen_mask[:, ::-1], axis=1), -1).astype(jnp.int32)
    kv = None if padding_mask is None else padding_mask.astype(bool)
    if turn_window:
        if turn_ids is None:
            raise ValueError("history_attention='turn_window' needs the layout's turn_ids")
        seg = jnp.asarray(turn_ids, jnp.int32)
        return attn.causal_mask(window, block_first=first, block_last=last, kv_valid=kv, q_seg=seg, k_seg=seg,
                                seg_window=int(turn_window))
    return attn.causal_mask(window, block_first=first, block_last=last, kv_valid=kv)


def hybrid_mask(gen_mask: jax.Array, window: int | None, padding_mask: jax.Array | None = None) -> jax.Array:
    """:func:`hybrid_attention_mask` materialised as bool [B, L, L] ("may attend")."""
    b, l = gen_mask.shape
    return hybrid_attention_mask(gen_mask, window, padding_mask).materialize(b, l, l)


def query_positions(gen_mask: jax.Array, num_queries: int) -> jax.Array:
    """int32 [B, Q]: the indices of the first Q True entries of ``gen_mask`` [B, L], in order."""
    order = jnp.argsort(~gen_mask, axis=1, stable=True)
    return order[:, :num_queries].astype(jnp.int32)


class GameStateMLLM(nnx.Module):
    """Mistral (+LoRA) with input/output resamplers (docs/mllm.md).

    Params: ``llm`` (:class:`~animegamer_jax.models.mistral.model.Mistral`), ``input_resampler``
    (rep_dim -> D -> D), ``output_resampler`` (D -> rep_dim -> rep_dim).
    """

    def __init__(self, cfg: MLLMConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        lc = cfg.llm
        dt, pdt = mistral_model._dtype(lc.dtype), mistral_model._dtype(lc.param_dtype)
        self.llm = mistral_model.Mistral(lc, rngs=rngs)
        d, r = lc.hidden_size, cfg.rep_dim
        self.input_resampler = Resampler(r, d, d, axes=(None, "embed", "mlp"), dtype=dt, param_dtype=pdt, rngs=rngs)
        self.output_resampler = Resampler(d, r, r, axes=("embed", None, "mlp"), dtype=dt, param_dtype=pdt, rngs=rngs)

    @classmethod
    def from_config(cls, cfg: Any, *, rngs: nnx.Rngs, **llm_overrides: Any) -> "GameStateMLLM":
        """From the root ConfigDict (``cfg.mllm`` + ``cfg.rep``)."""
        return cls(MLLMConfig.from_config(cfg, **llm_overrides), rngs=rngs)

    def embed_inputs(self, input_ids: jax.Array, cmp_mask: jax.Array | None,
                     history_reps: jax.Array | None) -> jax.Array:
        """Token embeddings with history query positions overwritten (docs/token_layout.md#history-window).

        Args:
          input_ids: int [B, L].
          cmp_mask: bool [B, L]; its k-th True position (row-wise) takes token k of the flattened
            history reps, i.e. run j of Q positions <- slot j.
          history_reps: float [B, M, Q, rep_dim] (M slots, M*Q >= number of True per row) or None.

        Returns: float [B, L, D].
        """
        emb = self.llm.embed(input_ids)
        if history_reps is None or cmp_mask is None:
            return emb
        b, s, q, r = history_reps.shape
        proj = self.input_resampler(history_reps.reshape(b, s * q, r)).astype(emb.dtype)
        idx = jnp.clip(jnp.cumsum(cmp_mask.astype(jnp.int32), axis=1) - 1, 0, s * q - 1)
        gathered = jnp.take_along_axis(proj, idx[:, :, None], axis=1)
        return pmesh.constrain(jnp.where(cmp_mask[:, :, None], gathered, emb), ("act_batch", "act_length", "act_embed"))

    def readout(self, hidden: jax.Array, gen_mask: jax.Array, mode: str | None = None,
                padding_mask: jax.Array | None = None) -> jax.Array:
        """hidden [B, L, D] -> s_a [B, Q, rep_dim] via the output resampler.

        ``mode`` "query" (default from config): the Q positions of ``gen_mask``; "last": the last Q
        valid positions of each row (release ``hidden[:, -226:]``, docs/token_layout.md#read-out; with right padding the
        valid length comes from ``padding_mask`` bool [B, L], so pads are never read).

        Raises: ValueError for another mode.
        """
        mode = mode or self.cfg.readout
        q = self.cfg.num_queries
        if mode == "query":
            h = jnp.take_along_axis(hidden, query_positions(gen_mask, q)[:, :, None], axis=1)
        elif mode == "last" and padding_mask is None:
            h = hidden[:, -q:]
        elif mode == "last":
            end = jnp.sum(padding_mask.astype(jnp.int32), axis=1, keepdims=True)  # [B, 1] valid length
            idx = jnp.clip(end - q + jnp.arange(q, dtype=jnp.int32)[None, :], 0, hidden.shape[1] - 1)
            h = jnp.take_along_axis(hidden, idx[:, :, None], axis=1)
        else:
            raise ValueError(f"readout must be 'query' or 'last', got {mode!r}")
        return self.output_resampler(h)

    def __call__(
        self,
        input_ids: jax.Array,
        *,
        gen_mask: jax.Array,
        cmp_mask: jax.Array | None = None,
        history_reps: jax.Array | None = None,
        padding_mask: jax.Array | None = None,
        readout: str | None = None,
        return_logits: bool = True,
        dropout_rng: jax.Array | None = None,
        turn_ids: jax.Array | None = None,
    ) -> MLLMOutput:
        """Pass B (and training forward): hybrid-mask forward + representation read-out.

        Args:
          input_ids int [B, L]; gen_mask bool [B, L] current-turn query positions; cmp_mask bool
          [B, L] history query positions; history_reps [B, M, Q, rep_dim]; padding_mask bool [B, L];
          turn_ids int [B, L] (:class:`TurnSequence`; used, and then required, with
          ``history_attention="turn_window"``).

        Returns: :class:`MLLMOutput`.

        Raises: ValueError: ``turn_window`` without ``turn_ids``.
        """
        x = self.embed_inputs(input_ids, cmp_mask, history_reps)
        mask = hybrid_attention_mask(gen_mask, self.cfg.llm.window, padding_mask, turn_ids, self.cfg.turn_window)
        out = self.llm(inputs_embeds=x, attention_mask=mask, return_logits=return_logits, dropout_rng=dropout_rng)
        return MLLMOutput(out.logits, out.hidden, self.readout(out.hidden, gen_mask, readout, padding_mask))

    def loss(self, batch: dict[str, jax.Array],
             dropout_rng: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Training loss (docs/mllm.md#losses) on a batch from :func:`collate`.

        batch: input_ids, gen_mask, cmp_mask, history_reps, padding_mask, labels (int [B, L],
        IGNORE_INDEX = no label, HF-aligned: the logits at i-1 predict labels[i]), target_reps
        [B, Q, rep_dim].

        Returns: (total scalar, {"ce", "mse", "cos", "loss"}).
        """
        c = self.cfg
        out = self(batch["input_ids"], gen_mask=batch["gen_mask"], cmp_mask=batch.get("cmp_mask"),
                   history_reps=batch.get("history_reps"), padding_mask=batch.get("padding_mask"),
                   dropout_rng=dropout_rng, turn_ids=batch.get("turn_ids"))
        logits = out.logits[:, :-1]
        labels = batch["labels"][:, 1:]
        valid = labels != IGNORE_INDEX
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, jnp.where(valid, labels, 0)[..., None], axis=-1)[..., 0]
        ce = jnp.sum(nll * valid) / jnp.maximum(jnp.sum(valid), 1)
        rec = out.rep.astype(jnp.float32)
        tgt = batch["target_reps"].astype(jnp.float32)
        mse = jnp.mean((rec - tgt) ** 2)
        cos = jnp.mean(1.0 - jnp.sum(rec * tgt, -1) / (
            jnp.maximum(jnp.linalg.norm(rec, axis=-1) * jnp.linalg.norm(tgt, axis=-1), 1e-8)))
        total = c.lm_loss_scale * ce + c.rec_loss_scale * mse + c.cos_loss_scale * cos
        return total, {"ce": ce, "mse": mse, "cos": cos, "loss": total}

    def predict_states(
        self,
        input_ids: jax.Array,
        *,
        cmp_mask: jax.Array | None = None,
        history_reps: jax.Array | None = None,
        grammar: Sequence[Sequence[int]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Pass A: purely causal greedy decoding constrained to the state grammar (docs/token_layout.md#state-fields).

        Args:
          input_ids: int [B, L], every row ending with ``<ML>`` (no padding: equal lengths).
          grammar: allowed ids per generated position (default
            ``AnimeGamerTokenizer.state_grammar()``, 11 positions).

        Returns:
          (states int32 [B, 4] = [ML, SC, ET, ST], generated ids int32 [B, len(grammar)]).

        Raises: ValueError with ``history_attention="turn_window"`` (its pass A is
          inference/mllm_turn.py ``mllm_turn_cached``).
        """
        if self.cfg.turn_window:
            raise ValueError("predict_states decodes with the plain causal mask; with "
                             "history_attention='turn_window' use inference/mllm_turn.py mllm_turn_cached")
        grammar = grammar or mllm_tokenizer.AnimeGamerTokenizer.state_grammar()
        b = input_ids.shape[0]
        v = self.cfg.llm.vocab_size
        allowed = np.zeros((len(grammar), v), bool)
        for t, ids in enumerate(grammar):
            allowed[t, list(ids)] = True
        allowed_j = jnp.asarray(allowed)
        x = self.embed_inputs(input_ids, cmp_mask, history_reps)
        toks, _ = mistral_model.greedy_generate(
            self.llm, len(grammar), inputs_embeds=x,
            allowed_fn=lambda t, _prev: jnp.broadcast_to(allowed_j[t], (b, v)),
        )
        toks = np.asarray(toks)
        states = np.asarray([[mllm_tokenizer.strength_value(int(r[p])) for p in (0, 3, 6, 9)] for r in toks], np.int32)
        return states, toks


#: ``mllm.quantize`` values: "none" (the checkpoint's bf16 weights) or "int8" (weight-only int8)
QUANTIZE_MODES = MLLM_QUANTIZE


def quantize_weights(mllm: "GameStateMLLM", mode: str) -> "GameStateMLLM":
    """The MLLM with its Mistral decoder's linear weights (q/k/v/o, gate/up/down) quantized, jitted.

    ``mode`` "int8": weight-only int8 with one float32 scale per output channel
    (:meth:`~animegamer_jax.models.layers.LoRAEinsum.quantize_int8`, LoRA merged first); activations stay
    in ``mllm.dtype`` and the dots are XLA's int8 x bf16 ``dot_general`` with fp32 accumulation. Embeddings,
    ``lm_head``, norms and the resamplers keep their dtype. "none" returns ``mllm`` unchanged. Returns a new
    module (``mllm`` is not modified).

    Raises: ValueError for another mode.
    """
    if mode in ("none", "", None):
        return mllm
    if mode != "int8":
        raise ValueError(f"mllm.quantize={mode!r}; use one of {QUANTIZE_MODES}")
    graphdef, state = nnx.split(mllm)
    out = {}

    def quantize(state):
        m = nnx.merge(graphdef, state)
        lora_lib.quantize_int8(m.llm.layers)
        out["graphdef"], new = nnx.split(m)
        return new

    new_state = jax.jit(quantize)(state)
    return nnx.merge(out["graphdef"], new_state)


# ---------------------------------------------------------------------------------------------
# Sequence builder (host side, numpy): the release layout of docs/token_layout.md#per-turn-layout with our
# sliding window.


@dataclasses.dataclass
class TurnSequence:
    """One MLLM input row. All arrays have length L.

    input_ids int32; cmp_mask bool (history query positions, in history-slot order);
    gen_mask bool (current-turn queries); labels int32 (IGNORE_INDEX except the target state
    tokens when built with ``target_states``); num_history: history turns included;
    turn_ids int32: the included turn each position belongs to (0 = the oldest included turn,
    ``num_history`` = the current one, -1 = ``<s>``), for the ``"turn_window"`` mask.
    """

    input_ids: np.ndarray
    cmp_mask: np.ndarray
    gen_mask: np.ndarray
    labels: np.ndarray
    num_history: int
    turn_ids: np.ndarray | None = None


def turn_layout(
    text_ids: Sequence[Sequence[int]],
    history_states: Sequence[Sequence[int]] = (),
    *,
    num_queries: int = 226,
    history_window: int = 3,
    target_states: Sequence[int] | None = None,
    release_history_states: bool = False,
) -> TurnSequence:
    """The one MLLM token layout, for training (:func:`build_sequence`) and play
    (``inference/turn_inputs.py`` ``build_turn_input``); docs/token_layout.md.

    ``[<s>]``, then per included turn ``<TURN> text <img><frame> <frame_0..Q-1> </frame></img>``
    followed, for a history turn, by its 14 world ids (``tokenizer.world_ids``, with the release's
    duplicated ``</ST>``); the current turn ends with ``<ML>`` instead (then, in training, the 11
    labelled state tokens).

    Args:
      text_ids: instruction token ids (no BOS, no ``<TURN>``) of turns 0..k; the last is the current turn.
      history_states: [ML, SC, ET, ST] of turns 0..k-1 (their own predicted / labelled states).
      num_queries: Q query tokens per turn (226).
      history_window: W; at most W-1 history turns (the latest ones) are included.
      target_states: when given (training), the 11 state-grammar tokens of the current turn are
        appended after ``<ML>`` and labelled.
      release_history_states: True writes ``<Strength_0>`` in every history field (the release's
        index bug, docs/token_layout.md#per-turn-layout) instead of the turn's own states.

    Returns: :class:`TurnSequence` (history slot j of ``history_reps`` belongs to the j-th included
      history turn, oldest first; e.g. turns ``k-W+1 .. k-1``).

    Raises:
      ValueError: no turn, fewer history_states than history turns, or history_window < 1.
    """
    if history_window < 1:
        raise ValueError(f"history_window must be >= 1, got {history_window}")
    k = len(text_ids) - 1
    if k < 0:
        raise ValueError("need at least one instruction")
    if len(history_states) < k:
        raise ValueError(f"{k} history turns need {k} states, got {len(history_states)}")
    first = max(0, k - history_window + 1)
    ids: list[int] = [mllm_tokenizer.BOS_ID]
    cmp: list[bool] = [False]
    gen: list[bool] = [False]
    turn: list[int] = [-1]
    block = mllm_tokenizer.AnimeGamerTokenizer.video_block_ids(num_queries)

    def add(seq: Sequence[int], c: bool = False, g: bool = False) -> None:
        ids.extend(seq)
        cmp.extend([c] * len(seq))
        gen.extend([g] * len(seq))
        turn.extend([len(turn_starts) - 1] * len(seq))

    turn_starts: list[int] = []

    for t in range(first, k + 1):
        turn_starts.append(len(ids))
        add([mllm_tokenizer.TURN_ID] + list(text_ids[t]))
        add(block[:2])
        add(block[2:-2], c=t < k, g=t == k)
        add(block[-2:])
        if t < k:
            st = (0, 0, 0, 0) if release_history_states else tuple(history_states[t])
            add(mllm_tokenizer.AnimeGamerTokenizer.world_ids(*st))
    add([mllm_tokenizer.ML_ID])
    labels = [IGNORE_INDEX] * len(ids)
    if target_states is not None:
        ml, sc, et, st = (int(s) for s in target_states)
        tail = [mllm_tokenizer.strength_id(ml), mllm_tokenizer.ML_END_ID,
                mllm_tokenizer.SC_ID, mllm_tokenizer.strength_id(sc), mllm_tokenizer.SC_END_ID,
                mllm_tokenizer.ET_ID, mllm_tokenizer.strength_id(et), mllm_tokenizer.ET_END_ID,
                mllm_tokenizer.ST_ID, mllm_tokenizer.strength_id(st), mllm_tokenizer.ST_END_ID]
        add(tail)
        labels.extend(tail)
    return TurnSequence(np.asarray(ids, np.int32), np.asarray(cmp), np.asarray(gen),
                        np.asarray(labels, np.int32), k - first, np.asarray(turn, np.int32))


def build_sequence(tokenizer: Any, instructions: Sequence[str], history_states: Sequence[Sequence[int]] = (),
                   **layout: Any) -> TurnSequence:
    """:func:`turn_layout` of instruction texts (encoded with ``tokenizer.encode_plain``), the
    training path; ``layout`` takes :func:`turn_layout`'s keyword arguments (``num_queries``,
    ``history_window``, ``target_states``, ``release_history_states``). Errors as :func:`turn_layout`."""
    return turn_layout([tokenizer.encode_plain(t) for t in instructions], history_states, **layout)


def collate(seqs: Sequence[TurnSequence], pad_to: int | None = None, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Right-pads rows to a common length: input_ids, cmp_mask, gen_mask, labels, padding_mask,
    turn_ids [B, L] (padding keeps the row's last turn id; its keys are masked by padding_mask).

    Raises: ValueError when a row is longer than ``pad_to``.
    """
    n = max(len(s.input_ids) for s in seqs)
    pad_to = pad_to or n
    if n > pad_to:
        raise ValueError(f"a sequence of {n} tokens does not fit pad_to={pad_to}")

    def pad(a: np.ndarray, v: Any) -> np.ndarray:
        return np.concatenate([a, np.full(pad_to - len(a), v, a.dtype)])

    return {
        "input_ids": np.stack([pad(s.input_ids, pad_id) for s in seqs]),
        "cmp_mask": np.stack([pad(s.cmp_mask, False) for s in seqs]),
        "gen_mask": np.stack([pad(s.gen_mask, False) for s in seqs]),
        "labels": np.stack([pad(s.labels, IGNORE_INDEX) for s in seqs]),
        "padding_mask": np.stack([pad(np.ones(len(s.input_ids), bool), False) for s in seqs]),
        "turn_ids": np.stack([pad(s.turn_ids, s.turn_ids[-1]) for s in seqs]),
    }
