"""The one attention entry point of the project (DiT, Mistral/MLLM, CLIP, T5).

:func:`dot_product_attention` takes queries/keys/values with head axes, an optional additive
bias and an :class:`AttentionMask`, and runs one of several kernels that compute the same
function (softmax in float32):

``"reference"``
    Plain einsum + softmax over the full ``[B, N, L, S]`` score tensor. The specification every
    other path is tested against.
``"dense"``
    The same function as the reference laid out for plain GEMMs (head-major ``[B, K, G*L, H]``
    operands, 4-D scores, the scale folded into q). The fastest path on XLA:CPU at the project's
    sizes (``python -m benchmarks compare --pieces attention`` times every kernel beside torch's SDPA).
``"xla"``
    ``jax.nn.dot_product_attention(implementation="xla")`` (dense; slower than ``"dense"`` on
    XLA:CPU at the benchmark's sizes).
``"blockwise"``
    Memory-efficient attention (Rabe & Staats 2021, "Self-attention does not need O(n^2)
    memory"; the online softmax of FlashAttention, Dao et al. 2022): queries in blocks of
    ``block_q``, a ``lax.scan`` over key/value blocks of ``block_k`` carrying the running max,
    normaliser and output, so only ``[B, N, block_q, block_k]`` scores exist at a time. Without a
    bias it has a custom VJP (the FlashAttention backward: recompute the tile's probabilities from
    the saved log-sum-exp), so training stores ``O(L)`` per layer instead of ``O(L*S)``. Tiles the
    mask hides entirely (e.g. above the causal diagonal) are skipped with ``lax.cond``.
``"cudnn"``
    ``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN flash attention on NVIDIA
    GPUs (bf16/fp16 only). Masks go in as ``is_causal`` / ``local_window_size`` /
    ``key_value_seq_lengths`` where they can, else as a dense mask.
``"splash"``
    The Pallas TPU splash-attention kernel (``jax.experimental.pallas.ops.tpu.splash_attention``)
    for masks it expresses statically (full, causal, causal + sliding window, key padding as
    segment ids, positions ``0..L-1``). ``splash_interpret=True`` runs it in Pallas interpret
    mode (any backend; used by the CPU tests).
``"auto"``
    Decided for the platform of the devices the program is compiled for (the active mesh's,
    :func:`animegamer_jax.parallel.target.current`), not the host's backend. GPU: cuDNN when the
    dtype/head size allow it, else blockwise. TPU: splash when the mask allows it
    (:func:`splash_unsupported`), else blockwise. CPU: ``"dense"`` while the fp32 score
    tensor of one call stays under ``dense_limit_bytes`` (XLA:CPU runs small dense attention
    faster than a loop of tiles), blockwise above. The choice is logged once per distinct
    (target, implementation, shape) at INFO level; :func:`recording` collects every call's.

The splash (Mosaic) and cuDNN kernels are custom calls that XLA cannot partition: under a mesh of
more than one device they run inside a ``shard_map`` over the batch / head axes (:func:`_partitioned`).

Masks are expressed once, as positions (:class:`AttentionMask`): key j is visible from query i iff

    (not causal or k_pos[j] <= q_pos[i]) and (not window or q_pos[i] - k_pos[j] < window)
    or (block_first <= q_pos[i] <= block_last and block_first <= k_pos[j] <= block_last),
    and kv_valid[j] and dense[i, j]
    and (not seg_window or k_seg[j] < 0 or q_seg[i] - k_seg[j] < seg_window),

the causal / sliding-window rule of HF Mistral (``sliding_window_overlay``), the bidirectional
query block of AnimeGamer's hybrid mask (docs/token_layout.md#masks), key padding, and a sliding
window over segments (the MLLM's ``history_attention = "turn_window"``,
docs/token_layout.md#history-attention-mllmhistory_attention: segment = game turn, a query of turn t
sees keys of turns t-W+1..t; segment < 0 marks keys every query may see, the ``<s>`` attention
sink). Every kernel
evaluates exactly this rule (the blockwise one per tile, :meth:`AttentionMask.tile`). Rows that
see no key at all return zeros in the blockwise path (the dense paths return the mean of V);
no model of this project produces such rows on positions it reads.

Shapes (docs/design.md#dimension-letters): B batch, L queries, S keys, N query heads, K key/value heads
(N a multiple of K, grouped query attention), G = N / K query heads per key/value head, H head dim.
The tiled kernels' einsums and einops patterns name a tile's axes locally: Q its ``bq`` query rows,
S its ``bk`` key rows, T / U the ``nq`` query / ``nk`` key tiles.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import einops
import flax.struct
import jax
import jax.numpy as jnp
from flax.core import spmd as core_spmd
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel, splash_attention_mask
from jax.sharding import PartitionSpec

from animegamer_jax import parallel
from animegamer_jax.parallel import target as target_lib

Array = jax.Array
log = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "reference", "dense", "xla", "blockwise", "cudnn", "splash")
#: fp32 score bytes of one call below which ``auto`` keeps the dense XLA path off GPU/TPU.
DENSE_LIMIT_BYTES = 64 * 2**20
_NEG = -1e30  # finite "minus infinity" for masked scores (exp underflows to exactly 0)


@flax.struct.dataclass
class AttentionMask:
    """Which keys each query may see, as positions (the rule is in the module docstring).

    Fields (all optional; None = no constraint of that kind):
      q_pos: int32 [B, L] query positions (default ``arange(L)``).
      k_pos: int32 [B, S] key positions (default ``arange(S)``).
      kv_valid: bool [B, S] keys that exist (padding / unfilled cache slots are False).
      block_first, block_last: int32 [B] inclusive position range of the bidirectional query
        block (rows with ``first > last`` have none).
      dense: bool [B, L, S] (or broadcastable) explicit extra mask, ANDed; the escape hatch for
        masks the fields above cannot express.
      q_seg: int32 [B, L], k_seg: int32 [B, S] segment ids (turns) for ``seg_window``; a key
        with a negative segment is visible to every query (attention sink).
      causal: static bool; window: static int or None (sliding window, Mistral semantics);
      seg_window: static int or None: key j visible from query i only if
        ``q_seg[i] - k_seg[j] < seg_window`` (or ``k_seg[j] < 0``).
    """

    q_pos: Array | None = None
    k_pos: Array | None = None
    kv_valid: Array | None = None
    block_first: Array | None = None
    block_last: Array | None = None
    dense: Array | None = None
    q_seg: Array | None = None
    k_seg: Array | None = None
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    window: int | None = flax.struct.field(pytree_node=False, default=None)
    seg_window: int | None = flax.struct.field(pytree_node=False, default=None)

    @property
    def is_empty(self) -> bool:
        """True when every key is visible from every query."""
        return (not self.causal and not self.window and self.kv_valid is None and self.dense is None
                and not self.seg_window)

    def positions(self, b: int, l: int, s: int) -> tuple[Array, Array]:
        """(q_pos [B, L], k_pos [B, S]) int32 with the defaults filled in."""
        q = self.q_pos if self.q_pos is not None else jnp.arange(l, dtype=jnp.int32)[None]
        k = self.k_pos if self.k_pos is not None else jnp.arange(s, dtype=jnp.int32)[None]
        return jnp.broadcast_to(q, (b, l)).astype(jnp.int32), jnp.broadcast_to(k, (b, s)).astype(jnp.int32)

    def tile(self, q_pos: Array, k_pos: Array, kv_valid: Array | None, dense: Array | None,
             q_seg: Array | None = None, k_seg: Array | None = None) -> Array | None:
        """The rule on one tile. q_pos [B, l], k_pos [B, s] int32; kv_valid [B, s] bool or None;
        dense [B, l, s] bool or None; q_seg [B, l] / k_seg [B, s] int32 (needed when
        ``seg_window`` is set). Returns bool [B, l, s] (True = visible) or None (all)."""
        m = None
        d = q_pos[:, :, None] - k_pos[:, None, :]
        if self.causal:
            m = d >= 0
        if self.window:
            w = d < self.window
            m = w if m is None else m & w
        if m is not None and self.block_first is not None:
            f, e = self.block_first[:, None], self.block_last[:, None]
            qi = (q_pos >= f) & (q_pos <= e)
            ki = (k_pos >= f) & (k_pos <= e)
            m = m | (qi[:, :, None] & ki[:, None, :])
        if kv_valid is not None:
            kv = jnp.broadcast_to(kv_valid[:, None, :], d.shape)
            m = kv if m is None else m & kv
        if dense is not None:
            m = dense if m is None else m & dense
        if self.seg_window:
            sd = q_seg[:, :, None] - k_seg[:, None, :]
            sv = (k_seg[:, None, :] < 0) | (sd < self.seg_window)
            m = sv if m is None else m & sv
        return m

    def segments(self, b: int, l: int, s: int) -> tuple[Array | None, Array | None]:
        """(q_seg [B, L], k_seg [B, S]) int32, or (None, None) without ``seg_window``.

        Raises: ValueError when ``seg_window`` is set without both segment arrays."""
        if not self.seg_window:
            return None, None
        if self.q_seg is None or self.k_seg is None:
            raise ValueError("AttentionMask: seg_window needs both q_seg and k_seg")
        return (jnp.broadcast_to(self.q_seg, (b, l)).astype(jnp.int32),
                jnp.broadcast_to(self.k_seg, (b, s)).astype(jnp.int32))

    def materialize(self, b: int, l: int, s: int) -> Array | None:
        """Dense bool [B, L, S] mask (None when nothing is masked)."""
        q, k = self.positions(b, l, s)
        kv = None if self.kv_valid is None else jnp.broadcast_to(self.kv_valid, (b, s)).astype(bool)
        dense = None if self.dense is None else jnp.broadcast_to(self.dense, (b, l, s)).astype(bool)
        return self.tile(q, k, kv, dense, *self.segments(b, l, s))


def causal_mask(window: int | None = None, **kw: Any) -> AttentionMask:
    """Causal (+ sliding window) :class:`AttentionMask`; ``kw`` sets the other fields."""
    if kw.get("seg_window") is not None:
        kw["seg_window"] = int(kw["seg_window"]) or None
    return AttentionMask(causal=True, window=int(window) if window else None, **kw)


# ---------------------------------------------------------------------------------------------
# Kernels.


def _group(q: Array, k: Array) -> tuple[int, int]:
    n, kh = q.shape[2], k.shape[2]
    if n % kh:
        raise ValueError(f"attention: {n} query heads are not a multiple of {kh} key/value heads")
    return kh, n // kh


def _reference(q, k, v, bias, mask: AttentionMask, scale):
    b, l, n, h = q.shape
    s = k.shape[1]
    kh, g = _group(q, k)
    qg = einops.rearrange(q, "B L (K G) H -> B L K G H", K=kh)  # query heads grouped by their K/V head
    logits = jnp.einsum("BLKGH,BSKH->BKGLS", qg, k, preferred_element_type=jnp.float32) * scale
    if bias is not None:
        logits = logits + einops.rearrange(jnp.broadcast_to(bias.astype(jnp.float32), (b, n, l, s)),
                                           "B (K G) L S -> B K G L S", K=kh)
    m = mask.materialize(b, l, s)
    if m is not None:
        logits = jnp.where(m[:, None, None], logits, _NEG)
    p = jax.nn.softmax(logits, axis=-1)
    if m is not None:  # fully masked rows -> 0 (the blockwise convention)
        p = jnp.where(m.any(-1)[:, None, None, :, None], p, 0.0)
    o = jnp.einsum("BKGLS,BSKH->BLKGH", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return einops.rearrange(o, "B L K G H -> B L (K G) H").astype(q.dtype)


#: "dense" splits a causal self-attention of at least this many queries into CAUSAL_BLOCKS query
#: blocks, block i seeing keys [0, end of block i) only: (n + 1) / (2 n) of the score FLOPs.
CAUSAL_SPLIT_MIN = 256
CAUSAL_BLOCKS = 4


def _causal_blocks(mask: AttentionMask, l: int, s: int) -> int:
    """Query blocks for "dense": > 1 only when the mask is causal with default positions
    (query i is key i; L <= S, e.g. a prompt in a fresh KV cache) and nothing else lets a query
    see a later key (no bidirectional block, no explicit dense mask), so keys past a block's last
    query are hidden from the whole block."""
    if (mask.causal and l <= s and l >= CAUSAL_SPLIT_MIN and mask.q_pos is None and mask.k_pos is None
            and mask.block_first is None and mask.dense is None):
        return CAUSAL_BLOCKS
    return 1


def _dense(q, k, v, bias, mask: AttentionMask, scale):
    """:func:`_dense_block` over the whole sequence, or over causal query blocks (:func:`_causal_blocks`)."""
    b, l = q.shape[:2]
    s = k.shape[1]
    nb = _causal_blocks(mask, l, s)
    if nb == 1:
        return _dense_block(q, k, v, bias, mask, scale)
    kv_valid = None if mask.kv_valid is None else jnp.broadcast_to(mask.kv_valid, (b, s)).astype(bool)
    q_seg, k_seg = mask.segments(b, l, s)
    c = -(-l // nb)
    outs = []
    for lo in range(0, l, c):
        hi = min(l, lo + c)
        sub = mask.replace(q_pos=jnp.arange(lo, hi, dtype=jnp.int32)[None], k_pos=jnp.arange(hi, dtype=jnp.int32)[None],
                           kv_valid=None if kv_valid is None else kv_valid[:, :hi],
                           q_seg=None if q_seg is None else q_seg[:, lo:hi],
                           k_seg=None if k_seg is None else k_seg[:, :hi])
        bt = None if bias is None else jnp.broadcast_to(bias, (bias.shape[0], q.shape[2], l, s))[:, :, lo:hi, :hi]
        outs.append(_dense_block(q[:, lo:hi], k[:, :hi], v[:, :hi], bt, sub, scale))
    return jnp.concatenate(outs, axis=1)


def _dense_block(q, k, v, bias, mask: AttentionMask, scale):
    """The reference's function laid out for plain GEMMs: head-major operands, the G query heads of
    a K/V head stacked along the query axis ([B, K, G*L, H]), the scale folded into q, and 4-D
    scores [B, K, G*L, S]: on XLA:CPU a 5-D score tensor, or jax.nn.dot_product_attention's BTNH
    einsums, are slower (``python -m benchmarks compare --pieces attention`` times "xla" beside "dense")."""
    b, l, n, h = q.shape
    s = k.shape[1]
    kh, g = _group(q, k)
    qt = jnp.swapaxes(q * jnp.asarray(scale, q.dtype), 1, 2).reshape(b, kh, g * l, h)  # head n = kk*G + gg
    kt = jnp.swapaxes(k, 1, 2)  # [B, K, S, H]
    vt = jnp.swapaxes(v, 1, 2)
    batch = ((0, 1), (0, 1))
    logits = jax.lax.dot_general(qt, kt, (((3,), (3,)), batch), preferred_element_type=jnp.float32)
    if bias is not None:
        logits = logits + jnp.broadcast_to(bias.astype(jnp.float32), (b, n, l, s)).reshape(b, kh, g * l, s)
    m = mask.materialize(b, l, s)
    if m is not None:
        m = jnp.broadcast_to(m[:, None], (b, g, l, s)).reshape(b, 1, g * l, s)
        logits = jnp.where(m, logits, _NEG)
    p = jax.nn.softmax(logits, axis=-1)
    if m is not None:  # fully masked rows -> 0 (the blockwise convention)
        p = jnp.where(m.any(-1, keepdims=True), p, 0.0)
    o = jax.lax.dot_general(p.astype(v.dtype), vt, (((3,), (2,)), batch),
                            preferred_element_type=jnp.float32)  # [B, K, G*L, H]
    return jnp.swapaxes(o.reshape(b, n, l, h), 1, 2).astype(q.dtype)


def _xla(q, k, v, bias, mask: AttentionMask, scale, implementation="xla"):
    b, l = q.shape[:2]
    s = k.shape[1]
    m = mask.materialize(b, l, s)
    if bias is not None:
        bias = jnp.broadcast_to(bias, (bias.shape[0], q.shape[2], l, s)).astype(q.dtype)
    return jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=None if m is None else m[:, None], scale=scale, implementation=implementation
    )


def _cudnn(q, k, v, bias, mask: AttentionMask, scale):
    l, s = q.shape[1], k.shape[1]
    native = (mask.q_pos is None and mask.k_pos is None and mask.block_first is None and mask.dense is None
              and mask.kv_valid is None and not mask.seg_window and (l == s or not mask.causal))
    if not native:  # cuDNN still runs; the mask goes in dense
        return _xla(q, k, v, bias, mask, scale, implementation="cudnn")
    window = (mask.window - 1, 0) if mask.window else None
    return jax.nn.dot_product_attention(
        q, k, v, bias=None if bias is None else bias.astype(q.dtype), scale=scale, is_causal=mask.causal,
        local_window_size=window, implementation="cudnn",
    )


def _splash(q, k, v, mask: AttentionMask, scale, *, interpret: bool = False, block: int = 128):
    """Pallas TPU splash attention for full / causal / local masks with key padding."""
    b, l, n, h = q.shape
    s = k.shape[1]
    kh, g = _group(q, k)
    lp, sp = -(-l // block) * block, -(-s // block) * block
    if mask.causal or mask.window:
        left = (mask.window - 1) if mask.window else None
        right = 0 if mask.causal else None
        head_mask = (splash_attention_mask.LocalMask((lp, sp), (left, right), offset=0) if mask.window
                     else splash_attention_mask.CausalMask((lp, sp)))
    else:
        head_mask = splash_attention_mask.FullMask((lp, sp))
    block_sizes = splash_attention_kernel.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block, block_kv_dkv=block,
        block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    kernel = splash_attention_kernel.make_splash_mha(splash_attention_mask.MultiHeadMask([head_mask] * n),
                                                     block_sizes=block_sizes, head_shards=1, q_seq_shards=1,
                                                     interpret=interpret)
    q_seg = jnp.concatenate([jnp.ones((b, l), jnp.int32), jnp.zeros((b, lp - l), jnp.int32)], 1)
    valid = jnp.ones((b, s), bool) if mask.kv_valid is None else jnp.broadcast_to(mask.kv_valid, (b, s))
    # Padded queries (segment 0) see only padded / invalid keys (segment 0): finite rows, dropped
    # below, and no NaN reaches the backward pass.
    kv_seg = jnp.concatenate([valid.astype(jnp.int32), jnp.zeros((b, sp - s), jnp.int32)], 1)
    qp = einops.rearrange(jnp.pad(q * jnp.asarray(scale, q.dtype), ((0, 0), (0, lp - l), (0, 0), (0, 0))),
                          "B L N H -> B N L H")  # splash takes heads before the sequence
    kp = jnp.pad(k, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
    vp = jnp.pad(v, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
    # Grouped heads share K/V: repeat them (splash's MQA mode covers only K = 1).
    kp = einops.repeat(kp, "B S K H -> B (K G) S H", G=g)
    vp = einops.repeat(vp, "B S K H -> B (K G) S H", G=g)
    seg = splash_attention_kernel.SegmentIds(q=q_seg, kv=kv_seg)
    o = jax.vmap(kernel)(qp, kp, vp, segment_ids=seg)
    del kh
    return einops.rearrange(o, "B N L H -> B L N H")[:, :l].astype(q.dtype)


# --- blockwise -------------------------------------------------------------------------------


def _pad_to(x: Array, axis: int, size: int, value: Any = 0) -> Array:
    if x.shape[axis] == size:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pad, constant_values=value)


def _q_tiles(x: Array, nq: int, bq: int, kh: int) -> Array:
    """Queries (or dO, O) [B, L, N, H] -> query blocks [nq, B, bq, K, G, H] (L zero-padded to nq * bq;
    in the pattern T = nq, Q = bq)."""
    return einops.rearrange(_pad_to(x, 1, nq * bq), "B (T Q) (K G) H -> T B Q K G H", Q=bq, K=kh)


def _kv_tiles(x: Array, nk: int, bk: int) -> Array:
    """Keys or values [B, S, K, H] -> key blocks [nk, B, bk, K, H] (S zero-padded to nk * bk; in the
    pattern U = nk, S = bk)."""
    return einops.rearrange(_pad_to(x, 1, nk * bk), "B (U S) K H -> U B S K H", S=bk)


def _untile(x: Array) -> Array:
    """Inverse of :func:`_q_tiles` / :func:`_kv_tiles` (the padding kept): [nq, B, bq, K, G, H] ->
    [B, nq * bq, K * G, H], or [nk, B, bk, K, H] -> [B, nk * bk, K, H]."""
    if x.ndim == 6:
        return einops.rearrange(x, "T B Q K G H -> B (T Q) (K G) H")
    return einops.rearrange(x, "U B S K H -> B (U S) K H")


def _tiles(q, k, v, mask: AttentionMask, bq: int, bk: int):
    """Blocks along the sequence axes. Returns q [nq,B,bq,K,G,H], k/v [nk,B,bk,K,H], qpos
    [nq,B,bq], kpos [nk,B,bk], kvalid [nk,B,bk], dense [nq,nk,B,bq,bk] (or None) and qseg
    [nq,B,bq] / kseg [nk,B,bk] (or None)."""
    b, l, n, h = q.shape
    s = k.shape[1]
    kh, g = _group(q, k)
    nq, nk = -(-l // bq), -(-s // bk)
    qpos, kpos = mask.positions(b, l, s)
    qpos = einops.rearrange(_pad_to(qpos, 1, nq * bq), "B (T Q) -> T B Q", Q=bq)
    kpos = einops.rearrange(_pad_to(kpos, 1, nk * bk), "B (U S) -> U B S", S=bk)
    valid = jnp.ones((b, s), bool) if mask.kv_valid is None else jnp.broadcast_to(mask.kv_valid, (b, s)).astype(bool)
    kvalid = einops.rearrange(_pad_to(valid, 1, nk * bk, False), "B (U S) -> U B S", S=bk)
    dense = None
    if mask.dense is not None:
        d = jnp.broadcast_to(mask.dense, (b, l, s)).astype(bool)
        d = _pad_to(_pad_to(d, 1, nq * bq, False), 2, nk * bk, False)
        dense = einops.rearrange(d, "B (T Q) (U S) -> T U B Q S", Q=bq, S=bk)
    qt = _q_tiles(q, nq, bq, kh)
    kt, vt = _kv_tiles(k, nk, bk), _kv_tiles(v, nk, bk)
    qseg, kseg = mask.segments(b, l, s)
    if qseg is not None:
        qseg = _pad_to(qseg, 1, nq * bq).reshape(b, nq, bq).transpose(1, 0, 2)
        kseg = _pad_to(kseg, 1, nk * bk).reshape(b, nk, bk).transpose(1, 0, 2)
    return qt, kt, vt, qpos, kpos, kvalid, dense, qseg, kseg


def _tile_scores(qb, kb, bias_t, vis, scale):
    """Scores [B, K, G, bq, bk] fp32 of one tile (einsum Q = bq, S = bk), masked with _NEG."""
    s = jnp.einsum("BQKGH,BSKH->BKGQS", qb, kb, preferred_element_type=jnp.float32) * scale
    if bias_t is not None:
        s = s + bias_t
    return jnp.where(vis[:, None, None], s, _NEG)


def _bias_tile(bias, iq, ik, bq, bk, kh, g):
    """bias [Bb, N, Lp, Sp] fp32 -> tile [Bb, K, G, bq, bk]."""
    bb = bias.shape[0]
    t = jax.lax.dynamic_slice(bias, (0, 0, iq * bq, ik * bk), (bb, bias.shape[1], bq, bk))
    return einops.rearrange(t, "B (K G) Q S -> B K G Q S", K=kh)


def _blockwise_fwd_core(mask: AttentionMask, scale, bq, bk, q, k, v, bias):
    """Forward over tiles. Returns (o [B, L, N, H] q.dtype, lse [nq, B, K, G, bq] fp32)."""
    b, l, n, h = q.shape
    kh, g = _group(q, k)
    qt, kt, vt, qpos, kpos, kvalid, dense, qseg, kseg = _tiles(q, k, v, mask, bq, bk)
    nq, nk = qt.shape[0], kt.shape[0]
    if bias is not None:
        bias = jnp.broadcast_to(bias.astype(jnp.float32), (bias.shape[0], n, l, k.shape[1]))
        bias = _pad_to(_pad_to(bias, 2, nq * bq), 3, nk * bk)

    def q_block(args):
        iq, qb, qp, qs = args
        init = (jnp.zeros(qb.shape, jnp.float32),
                jnp.full((b, kh, g, bq), _NEG, jnp.float32), jnp.zeros((b, kh, g, bq), jnp.float32))

        def kv_step(carry, xs):
            ik, kb, vb, kp, kvd, ks = xs
            dn = None if dense is None else dense[iq, ik]
            vis = mask.tile(qp, kp, kvd, dn, qs, ks)
            vis = jnp.ones((b, bq, bk), bool) if vis is None else vis

            def compute(c):
                o, m, lsum = c
                bt = None if bias is None else _bias_tile(bias, iq, ik, bq, bk, kh, g)
                sc = _tile_scores(qb, kb, bt, vis, scale)
                m_new = jnp.maximum(m, sc.max(-1))
                p = jnp.where(vis[:, None, None], jnp.exp(sc - m_new[..., None]), 0.0)
                corr = jnp.exp(m - m_new)
                lsum = lsum * corr + p.sum(-1)
                pv = jnp.einsum("BKGQS,BSKH->BQKGH", p.astype(vb.dtype), vb, preferred_element_type=jnp.float32)
                o = o * einops.rearrange(corr, "B K G Q -> B Q K G 1") + pv
                return o, m_new, lsum

            return jax.lax.cond(vis.any(), compute, lambda c: c, carry), None

        (o, m, lsum), _ = jax.lax.scan(kv_step, init, (jnp.arange(nk), kt, vt, kpos, kvalid, kseg))
        safe = jnp.where(lsum > 0, lsum, 1.0)
        o = o / einops.rearrange(safe, "B K G Q -> B Q K G 1")
        lse = jnp.where(lsum > 0, m + jnp.log(safe), jnp.inf)  # inf: row sees nothing -> p = 0 in bwd
        return o.astype(q.dtype), lse

    o, lse = jax.lax.map(q_block, (jnp.arange(nq), qt, qpos, qseg))
    o = _untile(o)[:, :l]
    return o, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _blockwise_nobias(mask_static, scale, bq, bk, q, k, v, mask_arrays):
    mask = _static_mask(mask_static, mask_arrays)
    return _blockwise_fwd_core(mask, scale, bq, bk, q, k, v, None)[0]


def _bw_fwd(mask_static, scale, bq, bk, q, k, v, mask_arrays):
    mask = _static_mask(mask_static, mask_arrays)
    o, lse = _blockwise_fwd_core(mask, scale, bq, bk, q, k, v, None)
    return o, (q, k, v, mask_arrays, o, lse)


def _bw_bwd(mask_static, scale, bq, bk, res, do):
    """FlashAttention backward (Dao et al. 2022, Alg. 4): per tile, P = exp(S - lse),
    dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO o O)), dQ += dS K s, dK += dS^T Q s."""
    q, k, v, mask_arrays, o, lse = res
    mask = _static_mask(mask_static, mask_arrays)
    b, l, n, h = q.shape
    s = k.shape[1]
    kh, g = _group(q, k)
    qt, kt, vt, qpos, kpos, kvalid, dense, qseg, kseg = _tiles(q, k, v, mask, bq, bk)
    nq, nk = qt.shape[0], kt.shape[0]
    dot, ot = _q_tiles(do, nq, bq, kh), _q_tiles(o, nq, bq, kh)
    # D_i = rowsum(dO * O): [nq, B, K, G, bq] (einsum T = nq, Q = bq)
    delta = jnp.einsum("TBQKGH,TBQKGH->TBKGQ", dot.astype(jnp.float32), ot.astype(jnp.float32))

    def kv_block(dq_acc, xs):
        ik, kb, vb, kp, kvd, ks = xs

        def q_step(carry, ys):
            dk, dv = carry
            iq, qb, dob, qp, lse_b, dl, qs = ys
            dn = None if dense is None else dense[iq, ik]
            vis = mask.tile(qp, kp, kvd, dn, qs, ks)
            vis = jnp.ones((b, bq, bk), bool) if vis is None else vis

            def compute(c):
                dk, dv = c
                sc = _tile_scores(qb, kb, None, vis, scale)
                p = jnp.where(vis[:, None, None], jnp.exp(sc - lse_b[..., None]), 0.0)
                dv = dv + jnp.einsum("BKGQS,BQKGH->BSKH", p.astype(dob.dtype), dob,
                                     preferred_element_type=jnp.float32)
                dp = jnp.einsum("BQKGH,BSKH->BKGQS", dob, vb, preferred_element_type=jnp.float32)
                ds = p * (dp - dl[..., None]) * scale
                dqb = jnp.einsum("BKGQS,BSKH->BQKGH", ds.astype(kb.dtype), kb, preferred_element_type=jnp.float32)
                dk = dk + jnp.einsum("BKGQS,BQKGH->BSKH", ds.astype(qb.dtype), qb, preferred_element_type=jnp.float32)
                return (dk, dv), dqb

            def skip(c):
                return c, jnp.zeros(qb.shape, jnp.float32)

            return jax.lax.cond(vis.any(), compute, skip, (dk, dv))

        zeros = jnp.zeros((b, bk, kh, h), jnp.float32)
        (dk, dv), dq_parts = jax.lax.scan(q_step, (zeros, zeros), (jnp.arange(nq), qt, dot, qpos, lse, delta, qseg))
        return dq_acc + dq_parts, (dk, dv)

    dq0 = jnp.zeros(qt.shape, jnp.float32)
    dq, (dk, dv) = jax.lax.scan(kv_block, dq0, (jnp.arange(nk), kt, vt, kpos, kvalid, kseg))
    dq = _untile(dq)[:, :l].astype(q.dtype)
    dk = _untile(dk)[:, :s].astype(k.dtype)
    dv = _untile(dv)[:, :s].astype(v.dtype)
    zero_mask = jax.tree.map(lambda a: None, mask_arrays)
    return dq, dk, dv, zero_mask


_blockwise_nobias.defvjp(_bw_fwd, _bw_bwd)


def _static_mask(static: tuple[bool, int | None, int | None], arrays: dict[str, Array | None]) -> AttentionMask:
    return AttentionMask(causal=static[0], window=static[1], seg_window=static[2], **arrays)


def _blockwise(q, k, v, bias, mask: AttentionMask, scale, block_q: int, block_k: int):
    bq = min(block_q, q.shape[1])
    bk = min(block_k, k.shape[1])
    if bias is not None:  # bias may be trainable (T5): plain autodiff through the tiles
        return jax.checkpoint(lambda *a: _blockwise_fwd_core(mask, scale, bq, bk, *a)[0])(q, k, v, bias)
    arrays = {"q_pos": mask.q_pos, "k_pos": mask.k_pos, "kv_valid": mask.kv_valid,
              "block_first": mask.block_first, "block_last": mask.block_last, "dense": mask.dense,
              "q_seg": mask.q_seg, "k_seg": mask.k_seg}
    return _blockwise_nobias((mask.causal, mask.window, mask.seg_window), float(scale), bq, bk, q, k, v, arrays)


# ---------------------------------------------------------------------------------------------
# Dispatch.

_logged: set[tuple] = set()
_recorders: list[list[dict[str, Any]]] = []


@contextlib.contextmanager
def recording() -> Iterator[list[dict[str, Any]]]:
    """Collects every kernel resolution traced inside it (one dict per attention call: ``kernel``,
    ``requested``, ``platform``, ``q`` / ``k`` shapes, ``dtype``, ``why``), e.g. for the AOT table."""
    calls: list[dict[str, Any]] = []
    _recorders.append(calls)
    try:
        yield calls
    finally:
        _recorders.remove(calls)


def splash_unsupported(q: Array, k: Array, bias: Array | None, mask: AttentionMask) -> str | None:
    """Why the splash kernel cannot take this call (None when it can): it expresses full / causal /
    local masks over positions ``0..L-1`` with key padding, and no bias."""
    l, s = q.shape[1], k.shape[1]
    for why, bad in (("an additive bias", bias is not None),
                     ("explicit positions (KV-cache offsets)", mask.q_pos is not None or mask.k_pos is not None),
                     ("a bidirectional query block (hybrid mask)", mask.block_first is not None),
                     ("an explicit dense mask", mask.dense is not None),
                     ("a turn window (segments)", bool(mask.seg_window)),
                     ("a causal mask with L != S", l != s and mask.causal)):
        if bad:
            return why
    return None


def _auto(q, k, bias, mask: AttentionMask, dense_limit_bytes: int, platform: str) -> tuple[str, str]:
    """(kernel, why) for the target ``platform`` ("tpu", "gpu", "cpu")."""
    b, l, n, h = q.shape
    s = k.shape[1]
    if platform == "gpu":
        if q.dtype in (jnp.bfloat16, jnp.float16) and h <= 128 and h % 8 == 0:
            return "cudnn", "GPU, bf16/fp16, head dim <= 128"
        return "blockwise", f"GPU, {q.dtype.name} / head dim {h}: cuDNN takes bf16/fp16 with head dim <= 128"
    if platform == "tpu":
        why = splash_unsupported(q, k, bias, mask)
        return ("splash", "TPU, mask expressible for splash") if why is None else \
            ("blockwise", f"TPU, splash cannot take {why}")
    score = b * n * l * s * 4
    if score <= dense_limit_bytes:
        return "dense", f"{platform}, fp32 scores {score / 2**20:.1f} MiB <= dense limit"
    return "blockwise", f"{platform}, fp32 scores {score / 2**20:.1f} MiB > dense limit"


def resolve(implementation: str | None, q: Array, k: Array, bias: Array | None = None,
            mask: AttentionMask | None = None, dense_limit_bytes: int = DENSE_LIMIT_BYTES) -> str:
    """The kernel ``implementation`` ("auto"/None resolved for the target and shape) would run.

    The target is the platform of the active mesh's devices (:func:`animegamer_jax.parallel.target.current`:
    a program traced on a CPU host for TPU devices resolves TPU kernels), never the host's backend.

    Raises: ValueError for an unknown name.
    """
    impl = implementation or "auto"
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation must be one of {IMPLEMENTATIONS}, got {impl!r}")
    platform = target_lib.current().platform
    if impl != "auto":
        chosen, why = impl, "requested"
    else:
        chosen, why = _auto(q, k, bias, mask or AttentionMask(), dense_limit_bytes, platform)
        key = (platform, chosen, q.shape, k.shape, q.dtype.name)
        if key not in _logged:
            _logged.add(key)
            log.info("attention auto -> %s (target %s, q %s, k %s, %s: %s)", chosen, platform, q.shape, k.shape,
                     q.dtype, why)
    for calls in _recorders:
        calls.append({"kernel": chosen, "requested": impl, "platform": platform, "q": tuple(q.shape),
                      "k": tuple(k.shape), "dtype": q.dtype.name, "why": why})
    return chosen


def _partitioned(kernel: Callable[..., Array], q: Array, k: Array, v: Array, bias: Array | None,
                 mask: AttentionMask) -> Array:
    """``kernel(q, k, v, bias, mask)`` inside a ``shard_map`` over the active mesh: a Mosaic (splash)
    or cuDNN custom call is opaque to XLA's partitioner, so each device runs it on its own batch /
    head slice (``act_batch``, and ``act_heads`` when both the query and the key/value heads divide
    it). The sequence axes are whole on every device: where the mesh splits the sequence but the
    call is not :func:`context_parallel_attention` (e.g. the MLLM's pass B in play's latency layout),
    each device of a context group computes the whole call (correct, not split). Without a mesh of
    more than one device, or inside a ``shard_map`` already (all axes manual), the kernel is called
    as is."""
    mesh = parallel.active_mesh()
    if mesh is None or mesh.size == 1 or set(mesh.manual_axes) == set(mesh.axis_names):
        return kernel(q, k, v, bias, mask)
    b = q.shape[0]

    def spec(x, names):
        if not core_spmd.get_logical_axis_rules():  # no rules: every operand whole on each device
            return PartitionSpec(*([None] * x.ndim))
        s = parallel.fit_spec(parallel.logical_to_spec(names, shape=x.shape, mesh=mesh), x.shape, mesh)
        return PartitionSpec(*(tuple(s) + (None,) * (x.ndim - len(s))))

    q_spec = spec(q, ("act_batch", None, "act_heads", None))
    kv_spec = spec(k, ("act_batch", None, "act_kv_heads", None))
    if q_spec[0] != kv_spec[0]:
        kv_spec = PartitionSpec(q_spec[0], None, kv_spec[2], None)
    if q_spec[2] != kv_spec[2]:  # heads split only when both q and k/v heads divide the same axes
        q_spec, kv_spec = PartitionSpec(q_spec[0], None, None, None), PartitionSpec(q_spec[0], None, None, None)
    batch_entry, head_entry = q_spec[0], q_spec[2]

    def leaf_spec(x):  # mask arrays [B|1, ...] and bias [B|1, N|1, L, S]: batch (and heads) as q
        if not hasattr(x, "ndim") or x.ndim == 0:
            return PartitionSpec()
        entries = [batch_entry if x.shape[0] == b else None] + [None] * (x.ndim - 1)
        if x is bias and x.ndim == 4 and x.shape[1] == q.shape[2]:
            entries[1] = head_entry
        return PartitionSpec(*entries)

    mask_specs = jax.tree.map(leaf_spec, mask)
    bias_spec = None if bias is None else leaf_spec(bias)

    def local(ql, kl, vl, bl, ml):
        return kernel(ql, kl, vl, bl, ml)

    return jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, bias_spec, mask_specs),
                         out_specs=q_spec, check_vma=False)(q, k, v, bias, mask)


def dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    bias: Array | None = None,
    mask: AttentionMask | None = None,
    scale: float | None = None,
    implementation: str | None = "auto",
    block_q: int = 512,
    block_k: int = 512,
    dense_limit_bytes: int = DENSE_LIMIT_BYTES,
    splash_interpret: bool = False,
) -> Array:
    """Multi-head / grouped-query attention, ``softmax(q k^T * scale + bias, masked) v``.

    Args:
      q: [B, L, N, H]; k, v: [B, S, K, H] (N a multiple of K); any float dtype (scores and
        softmax in float32).
      bias: additive float [B|1, N, L, S] (T5's relative position bias) or None.
      mask: :class:`AttentionMask` or None (everything visible).
      scale: score scale, default ``H**-0.5`` (T5 passes 1.0).
      implementation: one of ``IMPLEMENTATIONS`` (module docstring); None = "auto".
      block_q, block_k: tile sizes of the blockwise path (clipped to L and S).
      dense_limit_bytes: "auto" keeps the dense path off GPU/TPU below this fp32 score size.
      splash_interpret: run the splash kernel in Pallas interpret mode (tests on CPU).

    Returns: [B, L, N, H] in q's dtype.

    Raises: ValueError for an unknown implementation, heads that do not group, or a mask or bias
      the explicitly requested kernel cannot take ("splash").
    """
    mask = mask or AttentionMask()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    impl = resolve(implementation, q, k, bias, mask, dense_limit_bytes)
    if impl == "reference":
        return _reference(q, k, v, bias, mask, scale)
    if impl == "dense":
        return _dense(q, k, v, bias, mask, scale)
    if impl == "xla":
        return _xla(q, k, v, bias, mask, scale)
    if impl == "cudnn":
        return _partitioned(lambda *a: _cudnn(*a, scale), q, k, v, bias, mask)
    if impl == "splash":
        why = splash_unsupported(q, k, bias, mask)
        if why is not None:
            raise ValueError(f"attention: the splash kernel cannot take {why} (it takes full/causal/local masks "
                             f"with key padding, positions 0..L-1 and no bias); use 'auto' or 'blockwise' for "
                             f"this call")
        if splash_interpret:  # interpret mode is plain HLO: XLA partitions it like any other op
            return _splash(q, k, v, mask, scale, interpret=True)
        return _partitioned(lambda ql, kl, vl, _b, ml: _splash(ql, kl, vl, ml, scale), q, k, v, None, mask)
    return _blockwise(q, k, v, bias, mask, scale, block_q, block_k)


def _context_axes(l: int, s: int) -> tuple[Any, tuple[str, ...]]:
    """(abstract mesh, mesh axes of ``act_length`` with size > 1 dividing L and S) or (None, ())."""
    mesh = parallel.active_mesh()
    if mesh is None:
        return None, ()
    if not core_spmd.get_logical_axis_rules():
        return None, ()
    entry = parallel.logical_to_spec(("act_length",))[0]
    if entry is None:
        return None, ()
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    axes = tuple(a for a in ((entry,) if isinstance(entry, str) else entry) if sizes[a] > 1)
    n = 1
    for a in axes:
        n *= sizes[a]
    if not axes or l % n or s % n:
        return None, ()
    return mesh, axes


def context_parallel_attention(q: Array, k: Array, v: Array, *, scale: float | None = None,
                               implementation: str | None = "auto", **kw: Any) -> Array:
    """Unmasked attention with the sequence sharded over the mesh axes of ``act_length``.

    Context parallelism by all-gather of K/V inside ``shard_map``: each device keeps its L / c
    queries (c the size of the ``context`` axes), gathers the full K and V of its batch / head slice over the ``context`` axes and runs
    :func:`dot_product_attention` locally (blockwise or a flash kernel, so no device holds more than
    its ``[L / c, S]`` tiles). Why all-gather rather than Ulysses all-to-all over heads: the DiT's
    30 heads do not divide a context size of 4 or 8, and K/V of one layer (2 x 6976 x 1920 bf16)
    are small next to its attention FLOPs, so gathering them costs little; full (unmasked)
    attention also leaves no causal load imbalance for a ring schedule to fix.

    Shapes as :func:`dot_product_attention`; batch / heads keep their ``act_batch`` /
    ``act_heads`` shardings. Without an active mesh whose ``act_length`` axes divide L and S this
    is plain :func:`dot_product_attention`.
    """
    mesh, axes = _context_axes(q.shape[1], k.shape[1])
    if mesh is None:
        return dot_product_attention(q, k, v, scale=scale, implementation=implementation, **kw)
    def spec(x, names):
        return parallel.fit_spec(parallel.logical_to_spec(names, shape=x.shape, mesh=mesh), x.shape, mesh)

    q_spec = spec(q, ("act_batch", "act_length", "act_heads", None))
    kv_spec = spec(k, ("act_batch", "act_length", "act_kv_heads", None))
    # heads split over an axis only when both q and k/v heads divide it
    if q_spec[2] != kv_spec[2]:
        q_spec = PartitionSpec(q_spec[0], q_spec[1], None, None)
        kv_spec = PartitionSpec(kv_spec[0], kv_spec[1], None, None)
    gather = axes[0] if len(axes) == 1 else axes

    def local(ql, kl, vl):
        kf = jax.lax.all_gather(kl, gather, axis=1, tiled=True)
        vf = jax.lax.all_gather(vl, gather, axis=1, tiled=True)
        return dot_product_attention(ql, kf, vf, scale=scale, implementation=implementation, **kw)

    return jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec,
                         check_vma=False)(q, k, v)


def score_bytes(b: int, n: int, l: int, s: int) -> int:
    """Bytes of the fp32 score tensor a dense kernel materialises (for logs and benchmarks)."""
    return int(b) * int(n) * int(l) * int(s) * 4


__all__ = ["AttentionMask", "causal_mask", "context_parallel_attention", "dot_product_attention", "recording",
           "resolve", "splash_unsupported", "IMPLEMENTATIONS", "score_bytes"]
