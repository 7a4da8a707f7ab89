"""The one attention entry point: every kernel that runs on CPU equals the plain reference.

fp32, grouped-query heads (N=4, K=2), lengths that are not multiples of the tiles (so the
blockwise path pads), and each mask kind of :class:`AttentionMask`.
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from animegamer_jax.models import attention

B, L, N, K, H = 2, 75, 4, 2, 16
TOL = 1e-5


@pytest.fixture(scope="module")
def qkv():
    r = np.random.default_rng(0)
    q = jnp.asarray(r.normal(size=(B, L, N, H)), jnp.float32)
    k = jnp.asarray(r.normal(size=(B, L, K, H)), jnp.float32)
    v = jnp.asarray(r.normal(size=(B, L, K, H)), jnp.float32)
    return q, k, v


SEG = jnp.asarray(np.stack([np.r_[-1, np.repeat(np.arange(4), [20, 9, 30, 15])],
                            np.r_[-1, np.repeat(np.arange(5), [5, 25, 14, 20, 10])]]), jnp.int32)


def _masks():
    r = np.random.default_rng(1)
    valid = jnp.asarray(np.arange(L)[None] < np.array([[L], [60]]))
    return {
        "none": attention.AttentionMask(),
        "causal": attention.causal_mask(),
        "sliding_window": attention.causal_mask(9),
        # row 0: block [10, 40]; row 1: no block (first > last) -> plain causal; padding in row 1
        "hybrid_block_padding": attention.causal_mask(20, block_first=jnp.array([10, 30]), block_last=jnp.array([40, 29]),
                                              kv_valid=valid),
        "padding": attention.AttentionMask(kv_valid=valid),
        "offset_positions": attention.causal_mask(q_pos=jnp.broadcast_to(jnp.arange(L) + 5, (B, L)),
                                          k_pos=jnp.broadcast_to(jnp.arange(L) + 5, (B, L))),
        "dense": attention.AttentionMask(dense=jnp.asarray(r.random((B, L, L)) > 0.3)),
        # turns of uneven length, a turn window of 2, position 0 a sink (segment -1), hybrid block
        "turn_window": attention.causal_mask(block_first=jnp.array([60, 50]), block_last=jnp.array([70, 49]),
                                     q_seg=SEG, k_seg=SEG, seg_window=2, kv_valid=valid),
    }


MASKS = _masks()


def attend(q, k, v, impl, mask=None, bias=None, scale=None, **kw):
    """Jitted call (eager dispatch of the tile loops costs more than compiling them)."""
    f = jax.jit(lambda q, k, v, m, b: attention.dot_product_attention(q, k, v, bias=b, mask=m, scale=scale,
                                                              implementation=impl, **kw))
    return f(q, k, v, mask, bias)


# every mask through the blockwise and the dense (CPU auto) kernels; jax's own XLA kernel on the richest
@pytest.mark.parametrize("name,impl", [(n, "blockwise") for n in MASKS] + [(n, "dense") for n in MASKS]
                         + [("hybrid_block_padding", "xla"), ("dense", "xla"), ("turn_window", "xla")])
@pytest.mark.slow
def test_kernel_matches_reference(qkv, name, impl):
    q, k, v = qkv
    m = MASKS[name]
    ref = attend(q, k, v, "reference", m)
    out = attend(q, k, v, impl, m, block_q=16, block_k=32)
    assert out.shape == (B, L, N, H) and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=TOL, rtol=0)


@pytest.mark.slow
def test_mask_rule_on_known_entries():
    m = attention.causal_mask(3, block_first=jnp.array([2]), block_last=jnp.array([4]),
                      kv_valid=jnp.array([[True] * 6 + [False]])).materialize(1, 7, 7)[0]
    m = np.asarray(m)
    assert m[1, 0] and m[1, 1] and not m[1, 2]  # causal
    assert not m[5, 2] and m[5, 3]  # window 3: 5 - 2 = 3 hidden, 5 - 3 = 2 visible
    assert m[2, 4] and m[3, 4] and not m[1, 4]  # bidirectional block [2, 4] only inside
    assert not m[6, 6]  # padding key


@pytest.mark.slow
def test_reference_matches_dense_softmax(qkv):
    """The reference itself against a hand-written softmax on the materialised mask."""
    q, k, v = qkv
    m = MASKS["hybrid_block_padding"]
    dense = np.asarray(m.materialize(B, L, L))
    kk = np.repeat(np.asarray(k), N // K, axis=2)
    vv = np.repeat(np.asarray(v), N // K, axis=2)
    s = np.einsum("blnh,bsnh->bnls", np.asarray(q, np.float64), kk) * H**-0.5
    s = np.where(dense[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("bnls,bsnh->blnh", p, vv)
    got = attend(q, k, v, "reference", m)
    np.testing.assert_allclose(np.asarray(got), want, atol=TOL, rtol=0)


def test_turn_window_rule_on_known_entries():
    """Segment window 2: a query of turn t sees turns t-1 and t (causally) and the sink."""
    seg = jnp.asarray([[-1, 0, 0, 1, 1, 2, 2]], jnp.int32)
    m = np.asarray(attention.causal_mask(q_seg=seg, k_seg=seg, seg_window=2).materialize(1, 7, 7)[0])
    assert m[5, 0] and m[5, 3] and m[5, 4] and m[5, 5] and not m[5, 6]  # sink, turn 1, own turn causal
    assert not m[5, 1] and not m[5, 2]  # turn 0 is 2 turns back
    assert m[3, 1] and m[3, 0] and m[0, 0]
    with pytest.raises(ValueError, match="q_seg and k_seg"):
        attention.causal_mask(seg_window=2).materialize(1, 7, 7)


@pytest.mark.parametrize("name", ["hybrid_block_padding", "turn_window"])
@pytest.mark.slow
def test_blockwise_gradients_match_reference(qkv, name):
    """The custom VJP (FlashAttention backward) against autodiff of the reference."""
    q, k, v = qkv
    m = MASKS[name]
    w = jnp.cos(jnp.arange(B * L * N * H, dtype=jnp.float32)).reshape(B, L, N, H)

    def loss(impl):
        return lambda q, k, v: jnp.sum(w * attention.dot_product_attention(q, k, v, mask=m, implementation=impl,
                                                                    block_q=16, block_k=32))

    want = jax.jit(jax.grad(loss("reference"), argnums=(0, 1, 2)))(q, k, v)
    got = jax.jit(jax.grad(loss("blockwise"), argnums=(0, 1, 2)))(q, k, v)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5, rtol=0)


@pytest.mark.slow
def test_bias_paths_match_reference(qkv):
    """T5's additive position bias (scale 1) with key padding."""
    q, k, v = qkv
    bias = jnp.asarray(np.random.default_rng(2).normal(size=(1, N, L, L)), jnp.float32)
    m = MASKS["padding"]
    ref = attend(q, k, v, "reference", m, bias, 1.0)
    out = attend(q, k, v, "blockwise", m, bias, 1.0, block_q=16, block_k=32)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=TOL, rtol=0)
    for impl in ("xla", "dense"):
        out = attend(q, k, v, impl, m, bias, 1.0)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=TOL, rtol=0)


@pytest.mark.slow
def test_dense_gradients_match_reference(qkv):
    """Autodiff through the dense kernel (CPU training uses it below the size limit)."""
    q, k, v = qkv
    m = MASKS["turn_window"]
    w = jnp.cos(jnp.arange(B * L * N * H, dtype=jnp.float32)).reshape(B, L, N, H)

    def loss(impl):
        return lambda q, k, v: jnp.sum(w * attention.dot_product_attention(q, k, v, mask=m, implementation=impl))

    want = jax.jit(jax.grad(loss("reference"), argnums=(0, 1, 2)))(q, k, v)
    got = jax.jit(jax.grad(loss("dense"), argnums=(0, 1, 2)))(q, k, v)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5, rtol=0)



@pytest.mark.slow
def test_splash_kernel_interpret_mode_matches_reference():
    """The Pallas TPU splash kernel in interpret mode on CPU: causal + window + key padding,
    a length that is not a multiple of its 128 tiles."""
    r = np.random.default_rng(3)
    ll = 200
    q = jnp.asarray(r.normal(size=(1, ll, 2, 128)), jnp.float32)
    k = jnp.asarray(r.normal(size=(1, ll, 1, 128)), jnp.float32)
    v = jnp.asarray(r.normal(size=(1, ll, 1, 128)), jnp.float32)
    m = attention.causal_mask(50, kv_valid=jnp.arange(ll)[None] < 190)
    ref = attend(q, k, v, "reference", m)
    out = attend(q, k, v, "splash", m, splash_interpret=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="splash"):
        attention.dot_product_attention(q, k, v, mask=attention.AttentionMask(dense=jnp.ones((1, ll, ll), bool)),
                                implementation="splash")


@pytest.mark.slow
def test_blockwise_never_materialises_scores():
    """Compiled temporaries of the blockwise kernel stay far below one L x L fp32 score matrix."""
    ll, n = 4096, 2
    q = jax.ShapeDtypeStruct((1, ll, n, 64), jnp.float32)

    def temp_bytes(impl):
        f = jax.jit(lambda q, k, v: attention.dot_product_attention(q, k, v, mask=attention.causal_mask(), implementation=impl))
        return f.lower(q, q, q).compile().memory_analysis().temp_size_in_bytes

    scores = attention.score_bytes(1, n, ll, ll)  # 128 MiB
    assert temp_bytes("xla") >= scores
    assert temp_bytes("dense") >= scores
    assert temp_bytes("blockwise") < scores / 8


def test_auto_choice_and_log(caplog):
    small = jnp.zeros((1, 64, 2, 16))
    big = jax.ShapeDtypeStruct((1, 8192, 2, 16), jnp.float32)
    with caplog.at_level(logging.INFO, logger=attention.__name__):
        assert attention.resolve("auto", small, small) == "dense"
        assert attention.resolve(None, big, big) == "blockwise"
    assert any("attention auto -> blockwise" in r.getMessage() for r in caplog.records)
    assert attention.resolve("blockwise", small, small) == "blockwise"
    with pytest.raises(ValueError, match="implementation"):
        attention.resolve("flash9", small, small)


@pytest.mark.parametrize("mask_kind", ["causal", "window_padding", "turn_window"])
@pytest.mark.slow
def test_dense_causal_blocks_match_reference(mask_kind):
    """At >= CAUSAL_SPLIT_MIN queries with default positions "dense" runs causal query blocks
    (keys past each block skipped); the result is the reference's, with and without a T5-style bias."""
    ll = attention.CAUSAL_SPLIT_MIN + 45
    r = np.random.default_rng(4)
    q = jnp.asarray(r.normal(size=(B, ll, N, H)), jnp.float32)
    k = jnp.asarray(r.normal(size=(B, ll, K, H)), jnp.float32)
    v = jnp.asarray(r.normal(size=(B, ll, K, H)), jnp.float32)
    valid = jnp.asarray(np.arange(ll)[None] < np.array([[ll], [ll - 40]]))
    seg = jnp.asarray(np.minimum(np.arange(ll) // 37, 9)[None].repeat(B, 0), jnp.int32)
    m = {"causal": attention.causal_mask(), "window_padding": attention.causal_mask(50, kv_valid=valid),
         "turn_window": attention.causal_mask(q_seg=seg, k_seg=seg, seg_window=2, kv_valid=valid)}[mask_kind]
    assert attention._causal_blocks(m, ll, ll) == attention.CAUSAL_BLOCKS
    bias = jnp.asarray(r.normal(size=(1, N, ll, ll)), jnp.float32)
    for b in (None, bias):
        ref = attend(q, k, v, "reference", m, b)
        out = attend(q, k, v, "dense", m, b)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=TOL, rtol=0)
    # a prompt in a fresh KV cache: S > L keys, the unfilled ones invalid
    s_len = ll + 19
    kc = jnp.concatenate([k, jnp.ones((B, 19, K, H), jnp.float32)], axis=1)
    vc = jnp.concatenate([v, jnp.ones((B, 19, K, H), jnp.float32)], axis=1)
    mc = attention.causal_mask(50, kv_valid=jnp.broadcast_to(jnp.arange(s_len)[None] < ll, (B, s_len)))
    assert attention._causal_blocks(mc, ll, s_len) == attention.CAUSAL_BLOCKS
    np.testing.assert_allclose(np.asarray(attend(q, kc, vc, "dense", mc)), np.asarray(attend(q, kc, vc, "reference", mc)),
                               atol=TOL, rtol=0)
    # explicit positions (a KV cache) or a bidirectional block keep one block
    assert attention._causal_blocks(m.replace(q_pos=jnp.arange(ll)[None]), ll, ll) == 1
    assert attention._causal_blocks(attention.causal_mask(block_first=jnp.array([3, 3]), block_last=jnp.array([9, 9])), ll, ll) == 1
