"""animegamer_jax.aot.hlo_cost: trip-count-aware FLOPs / bytes from optimized HLO text."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from animegamer_jax.aot.hlo_cost import Cost, program_cost, top_bytes

LAYER_FLOPS = 2 * 64 * 128 * 128  # one [64,128] x [128,128] matmul


def _xla(compiled) -> dict:
    ca = compiled.cost_analysis()
    return ca[0] if isinstance(ca, (list, tuple)) else ca


def _compile(f, *shapes, **jit_kw):
    return jax.jit(f, **jit_kw).lower(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes)).compile()


def _scan_layers(x, ws):
    return lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]


def test_matmul_chain_matches_cost_analysis():
    c = _compile(lambda x, a, b, d: jnp.tanh((x @ a) @ b) @ d, (32, 64), (64, 128), (128, 256), (256, 16))
    cost = program_cost(c.as_text())
    assert isinstance(cost, Cost) and cost.loops == () and cost.unknown_trip_counts == 0
    assert cost.flops == pytest.approx(_xla(c)["flops"], rel=0.01)
    assert cost.flops == 2 * (32 * 64 * 128 + 32 * 128 * 256 + 32 * 256 * 16)
    assert cost.bytes_accessed == pytest.approx(_xla(c)["bytes accessed"], rel=0.05)


def test_scan_multiplies_by_trip_count():
    c = _compile(_scan_layers, (64, 128), (7, 128, 128))
    cost = program_cost(c.as_text())
    assert cost.flops == 7 * LAYER_FLOPS == 2 * 64 * 128 * 128 * 7
    assert _xla(c)["flops"] == pytest.approx(LAYER_FLOPS, rel=0.01)  # XLA counts the body once
    (name, trips, body_flops), = cost.loops
    assert name.startswith("while") and trips == 7 and body_flops == LAYER_FLOPS
    assert cost.unknown_trip_counts == 0
    # Each iteration reads only its [128,128] slice of the stacked weights: bytes grow ~linearly
    # with the layer count, not quadratically.
    cost14 = program_cost(_compile(_scan_layers, (64, 128), (14, 128, 128)).as_text())
    assert 1.8 < cost14.bytes_accessed / cost.bytes_accessed < 2.2


def test_trip_count_inferred_without_backend_config():
    # The TPU compiler prints no known_trip_count: the loop pattern (counter init, step, bound)
    # must give the same answer, also for a counting-down while_loop.
    def down(x, w):
        return lax.while_loop(lambda s: s[0] > 2, lambda s: (s[0] - 3, jnp.tanh(s[1] @ w)), (20, x))[1]

    for f, shapes, trips in ((_scan_layers, ((64, 128), (7, 128, 128)), 7),
                             (down, ((64, 128), (128, 128)), 6)):  # 20, 17, ..., 5
        text = _compile(f, *shapes).as_text()
        stripped = re.sub(r'"known_trip_count":\{[^}]*\}', '"x":0', text)
        assert stripped != text
        assert program_cost(stripped) == program_cost(text)
        assert program_cost(stripped).loops[0][1] == trips


def test_nested_scans_multiply():
    def f(x, ws):
        return lax.scan(lambda h, row: (_scan_layers(h, row), None), x, ws)[0]

    cost = program_cost(_compile(f, (64, 128), (3, 5, 128, 128)).as_text())
    assert cost.flops == 3 * 5 * LAYER_FLOPS
    assert sorted(t for _, t, _ in cost.loops) == [3, 5]
    assert sorted(b for _, _, b in cost.loops) == [LAYER_FLOPS, 5 * LAYER_FLOPS]


def test_unknown_trip_count_counts_body_once():
    f = lambda x, w, n: lax.fori_loop(0, n, lambda i, h: jnp.tanh(h @ w), x)  # noqa: E731
    c = jax.jit(f).lower(jnp.ones((64, 128)), jnp.ones((128, 128)), 5).compile()
    cost = program_cost(c.as_text())
    assert cost.unknown_trip_counts == 1 and cost.loops[0][1] is None and cost.flops == LAYER_FLOPS


def test_conditional_takes_max_branch():
    f = lambda p, x, w: lax.cond(p, lambda x: (x @ w) @ w, lambda x: x @ w, x)  # noqa: E731
    c = jax.jit(f).lower(True, jnp.ones((64, 128)), jnp.ones((128, 128))).compile()
    assert program_cost(c.as_text()).flops == 2 * LAYER_FLOPS


@pytest.mark.parametrize("padding,strides,rhs_dil,groups", [
    ("SAME", (1, 1), (1, 1), 1), ("VALID", (2, 2), (1, 1), 1), ([(1, 2), (0, 1)], (2, 1), (1, 2), 4)])
def test_conv_matches_cost_analysis(padding, strides, rhs_dil, groups):
    def f(x, w):
        return lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=rhs_dil, feature_group_count=groups,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))

    c = _compile(f, (2, 16, 16, 32), (3, 3, 32 // groups, 48))
    cost = program_cost(c.as_text())
    assert cost.flops == pytest.approx(_xla(c)["flops"], rel=0.01)
    if padding == "VALID":  # textbook formula: 2 * out elements * kh * kw * C_in / groups
        assert cost.flops == 2 * (2 * 7 * 7 * 48) * 3 * 3 * 32


def test_parses_tpu_layouts_and_custom_calls():
    hlo = """HloModule m, entry_computation_layout={(bf16[8,128,64]{2,1,0:T(8,128)(2,1)})->(f32[2], s32[])}

ENTRY %main (p: bf16[8,128,64]) -> (f32[2], s32[]) {
  %p = bf16[8,128,64]{2,1,0:T(8,128)(2,1)} parameter(0)
  %k = bf16[8,128,64]{2,1,0:T(8,128)(2,1)} custom-call(%p), custom_call_target="tpu_custom_call", backend_config="x"
  %t = (f32[2]{0}, s32[]{:T(128)}) custom-call(%k), custom_call_target="foo"
  ROOT %r = (f32[2]{0}, s32[]) copy(%t)
}
"""
    cost = program_cost(hlo)
    assert cost.custom_calls == 2 and cost.flops == 0
    big, small = 8 * 128 * 64 * 2, 2 * 4 + 4
    assert cost.bytes_accessed == 2 * big + (big + small) + 2 * small


@pytest.mark.slow
def test_tpu_compiler_trip_count():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from tests.tpu import tpu_devices

    devs = tpu_devices("v5e-4")
    s = NamedSharding(Mesh(np.array(devs).reshape(4), ("x",)), PartitionSpec())
    c = (jax.jit(_scan_layers, in_shardings=(s, s), out_shardings=s)
         .lower(jax.ShapeDtypeStruct((64, 128), jnp.bfloat16), jax.ShapeDtypeStruct((7, 128, 128), jnp.bfloat16))
         .compile())
    cost = program_cost(c.as_text())  # libtpu 0.0.42 prints no known_trip_count: pattern-matched
    assert cost.unknown_trip_counts == 0 and [t for _, t, _ in cost.loops] == [7]
    assert cost.flops == 7 * LAYER_FLOPS  # the dot is a window-less convolution (dim_labels=bf_io->bf) there
    assert _xla(c)["flops"] == pytest.approx(LAYER_FLOPS, rel=0.02)


@pytest.mark.slow
def test_splash_attention_priced_from_its_operands():
    """The Mosaic splash kernel is a custom call XLA gives no FLOPs: its forward is priced as Q K^T
    and P V (4 B N L S H), forward + dq + dkv as 4 + 6 + 8 = 18 B N L S H; one chip of v5e-4 runs one
    of the 4 batch rows."""
    from jax.sharding import NamedSharding, PartitionSpec

    from animegamer_jax import parallel
    from animegamer_jax.models import attention
    from tests.tpu import tpu_devices

    mesh = parallel.make_mesh((1, -1, 1, 1), devices=tpu_devices("v5e-4"))
    q = jax.ShapeDtypeStruct((4, 256, 4, 128), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))
    fwd = lambda q, k, v: attention.dot_product_attention(q, k, v, implementation="splash")  # noqa: E731
    grad = jax.grad(lambda q, k, v: fwd(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))
    bnlsh = 1 * 4 * 256 * 256 * 128
    with parallel.sharding_context(mesh), jax.default_matmul_precision("default"):
        f = program_cost(jax.jit(fwd).lower(q, q, q).compile().as_text())
        g = program_cost(jax.jit(grad).lower(q, q, q).compile().as_text())
    assert f.flops == 4 * bnlsh and f.custom_calls >= 1
    assert g.flops == 18 * bnlsh


def test_top_bytes_adds_up_to_the_total():
    c = _compile(_scan_layers, (64, 128), (7, 128, 128))
    text = c.as_text()
    rows = top_bytes(text, 10**6)
    assert sum(r[0] for r in rows) == pytest.approx(program_cost(text).bytes_accessed)
    assert [r[0] for r in rows] == sorted((r[0] for r in rows), reverse=True) and len(top_bytes(text, 2)) == 2


def test_nested_relayout_copy_under_a_slice_reads_the_slice():
    """TPU fuses a stacked weight's relayout copy under the layer scan's dynamic-slice (int8 weights):
    only the slice is read, not the whole stack."""
    hlo = """HloModule m

%copy_fusion (input: s8[32,64,128]) -> s8[32,64,128] {
  %input = s8[32,64,128]{2,1,0:T(32,128)(4,1)} parameter(0)
  ROOT %c = s8[32,64,128]{2,1,0:T(8,128)(4,1)} copy(%input)
}

%fused (param_0: s8[32,64,128], param_1: s32[]) -> s8[64,128] {
  %param_0 = s8[32,64,128]{2,1,0} parameter(0)
  %f = s8[32,64,128]{2,1,0} fusion(%param_0), kind=kLoop, calls=%copy_fusion
  %param_1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = s8[1,64,128]{2,1,0} dynamic-slice(%f, %param_1, %z, %z), dynamic_slice_sizes={1,64,128}
  ROOT %b = s8[64,128]{1,0} bitcast(%ds)
}

ENTRY %main (p: s8[32,64,128], i: s32[]) -> s8[64,128] {
  %p = s8[32,64,128]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  ROOT %r = s8[64,128]{1,0} fusion(%p, %i), kind=kLoop, calls=%fused
}
"""
    slice_bytes = 64 * 128
    assert program_cost(hlo).bytes_accessed == slice_bytes + 4 + slice_bytes  # slice + index read, slice written


def test_sliced_prefetch_counts_each_piece_not_the_source():
    """The TPU compiler prefetches a buffer in pieces: each ``slice-start`` result tuple names the whole
    source, but only its piece moves (read + write, as a copy-start); the ``ConcatBitcast`` that joins
    the pieces is a bitcast. So the two pieces of a 4096-byte buffer cost 2 x 4096 bytes, not
    2 x (4096 + 2048 + 2048 + 4)."""
    hlo = """HloModule m

ENTRY %main (p: s8[4096]) -> bf16[2048] {
  %p = s8[4096]{0:T(1024)} parameter(0)
  %s0 = ((s8[4096]{0:T(1024)}), s8[2048]{0:T(1024)S(1)}, s32[]{:S(2)}) slice-start(%p), slice={[0:2048]}
  %s1 = ((s8[4096]{0:T(1024)}), s8[2048]{0:T(1024)S(1)}, s32[]{:S(2)}) slice-start(%p), slice={[2048:4096]}
  %d0 = s8[2048]{0:T(1024)S(1)} slice-done(%s0)
  %d1 = s8[2048]{0:T(1024)S(1)} slice-done(%s1)
  %c = bf16[2048]{0:T(1024)S(1)} custom-call(%d0, %d1), custom_call_target="ConcatBitcast"
  ROOT %n = bf16[2048]{0} negate(%c)
}
"""
    negate = 2 * 2048 * 2
    assert program_cost(hlo).bytes_accessed == 2 * 4096 + negate
    rows = top_bytes(hlo, 10)
    assert sorted((r[1], r[0]) for r in rows) == [("custom-call", 0.0), ("negate", negate),
                                                 ("slice-start", 2 * 2048), ("slice-start", 2 * 2048)]


def test_strided_slice_start_counts_its_elements():
    hlo = """HloModule m

ENTRY %main (p: f32[8,100]) -> f32[4,10] {
  %p = f32[8,100]{1,0} parameter(0)
  %s = ((f32[8,100]{1,0}), f32[4,10]{1,0:S(1)}, s32[]) slice-start(%p), slice={[0:8:2], [0:100:10]}
  ROOT %d = f32[4,10]{1,0:S(1)} slice-done(%s)
}
"""
    assert program_cost(hlo).bytes_accessed == 2 * 4 * 10 * 4
