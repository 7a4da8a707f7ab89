"""CogVideoX VAE: parity vs diffusers AutoencoderKLCogVideoX, chunk plans, single frames, tiling.

Tiny 4-level config with temporal compression 4, fp32, 16x16 frames. Weights go through our real
converter from a saved safetensors file. Compile time dominates on CPU, so the tests share a few
jitted entry points (keyed by static chunk plans) and run with XLA's most optimisations off.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from animegamer_jax.weights import load_state_dict
from animegamer_jax.models.cogvideox.vae_convert import build_vae, diffusers_to_state
from animegamer_jax.models.cogvideox import vae_tiling
from animegamer_jax.models.cogvideox.vae import VAEConfig, decode_latents, encode_video
from animegamer_jax.models.cogvideox.vae_tiling import (
    chunk_plan,
    diffusers_plan,
    release_decode_plan,
    run_chunked,
    tile_layout,
    tiled_apply,
)

TOL = 1e-4
TINY = dict(block_out_channels=(8, 8, 16, 16), latent_channels=4, layers_per_block=1, norm_num_groups=4)


@pytest.fixture(scope="module", autouse=True)
def _fast_compile():
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from diffusers import AutoencoderKLCogVideoX

    torch.manual_seed(0)
    ref = AutoencoderKLCogVideoX(**TINY).eval()
    with torch.no_grad():  # non-trivial norm affine params, so a swapped scale/bias would show
        for name, p in ref.named_parameters():
            if "norm" in name and p.ndim == 1:
                p.add_(0.2 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("vae")
    ref.save_pretrained(path)
    cfg = VAEConfig(**TINY)
    ours = build_vae(cfg, diffusers_to_state(load_state_dict(str(path)), cfg))
    return ref, ours


_encode = nnx.jit(lambda m, x, plan: m.encode(x, plan).mean, static_argnums=2)
_decode = nnx.jit(lambda m, z, plan: m.decode(z, plan), static_argnums=2)


def _video(t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 3, t, 16, 16, generator=g) * 2 - 1


def _to_ours_video(x):  # torch [B, C, T, H, W] -> [B, T, H, W, C]
    return jnp.asarray(x.permute(0, 2, 3, 4, 1).numpy())


def _ref_decode(ref, z, plan):
    """diffusers' decoder driven with an explicit chunk plan and its conv_cache (as in _decode)."""
    cache, outs, s = None, [], 0
    with torch.no_grad():
        for n in plan:
            o, cache = ref.decoder(z[:, :, s : s + n], conv_cache=cache)
            outs.append(o)
            s += n
    return torch.cat(outs, 2).permute(0, 2, 3, 4, 1).numpy()


def _latents(t_lat, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 4, t_lat, 2, 2, generator=g)


def _ours_latents(z):  # torch [B, C, T, h, w] -> [B, T, C, h, w]
    return jnp.asarray(z.permute(0, 2, 1, 3, 4).numpy())


@pytest.mark.parity
@pytest.mark.parametrize("num_frames", [1, 5, 9, 17])
@pytest.mark.slow
def test_encode_decode_parity(models, num_frames):
    ref, ours = models
    x = _video(num_frames)
    with torch.no_grad():
        z_ref = ref.encode(x).latent_dist.mean
        x_ref = ref.decode(z_ref).sample
    z = _encode(ours, _to_ours_video(x), diffusers_plan(num_frames, 8))
    z_ref_ours = z_ref.permute(0, 2, 1, 3, 4).numpy()
    assert z.shape == z_ref_ours.shape == (1, 1 + (num_frames - 1) // 4, 4, 2, 2)
    enc_err = float(np.abs(np.asarray(z) - z_ref_ours).max())
    dec = _decode(ours, jnp.asarray(z_ref_ours), diffusers_plan(z.shape[1], 2))
    x_ref = x_ref.permute(0, 2, 3, 4, 1).numpy()
    assert dec.shape == x_ref.shape
    dec_err = float(np.abs(np.asarray(dec) - x_ref).max())
    print(f"T={num_frames}: encode max|diff| {enc_err:.2e}, decode max|diff| {dec_err:.2e}")
    assert enc_err <= TOL and dec_err <= TOL
    assert float(np.abs(x_ref).max()) > 1e-2  # the comparison is not between two zero tensors


def test_plans():
    assert diffusers_plan(5, 2) == release_decode_plan(5) == (3, 2)
    assert diffusers_plan(13, 2) == release_decode_plan(13) == (3, 2, 2, 2, 2, 2)
    assert diffusers_plan(17, 8) == (9, 8) and diffusers_plan(5, 8) == (5,) and diffusers_plan(1, 2) == (1,)
    assert chunk_plan(4, 3, 2) == (3, 1) and chunk_plan(9, 0, 0) == (9,)
    with pytest.raises(ValueError, match="does not split"):
        run_chunked(lambda x, c: (x, c), jnp.zeros((1, 5, 2)), (3, 3))
    # Runs of equal chunks go through lax.scan with the carried cache; outputs keep time order.
    out = run_chunked(lambda x, c: (x + (0 if c is None else c), x[:, -1:]), jnp.arange(7.0)[None], (3, 2, 2))
    np.testing.assert_array_equal(np.asarray(out[0]), [0, 1, 2, 5, 6, 9, 10])


@pytest.mark.parity
@pytest.mark.parametrize("plan", [(1, 2, 2), (3, 1, 1)])
@pytest.mark.slow
def test_chunk_plan_matches_reference(models, plan):
    """Any chunk plan (incl. single-latent chunks that continue a cache) equals diffusers' decoder
    driven with the same plan and conv_cache."""
    ref, ours = models
    z = _latents(5)
    want = _ref_decode(ref, z, plan)
    got = np.asarray(_decode(ours, _ours_latents(z), plan))
    assert got.shape == want.shape
    err = float(np.abs(got - want).max())
    print(f"plan {plan}: {got.shape[1]} frames, max|diff| {err:.2e}")
    assert err <= TOL


@pytest.mark.parity
@pytest.mark.slow
def test_no_periodic_error_spike(models):
    """Release plan [0:3], [3:5] on 5 latents: per-frame error vs the reference is flat (no spike at
    the chunk start or every 4 frames); a port that drops the causal cache spikes there."""
    ref, ours = models
    z = _latents(5)
    want = _ref_decode(ref, z, (3, 2))
    got = np.asarray(_decode(ours, _ours_latents(z), (3, 2)))
    per_frame = np.abs(got - want).max(axis=(0, 2, 3, 4))
    by_phase = [float(per_frame[1 + p :: 4].max()) for p in range(4)]
    print("per-frame max|diff|:", np.array2string(per_frame, precision=1), "by phase mod 4:", by_phase)
    assert per_frame.shape == (17,) and per_frame.max() <= TOL
    # Negative control: the second chunk decoded without the first chunk's cache.
    zo = _ours_latents(z)
    broken = np.concatenate(
        [np.asarray(_decode(ours, zo[:, :3], (3,))), np.asarray(_decode(ours, zo[:, 3:], (2,)))], axis=1
    )
    broken_err = np.abs(broken - want).max(axis=(0, 2, 3, 4))
    assert broken_err[:9].max() <= TOL and broken_err[9] > 100 * TOL


@pytest.mark.slow
def test_single_frame_paths(models):
    """1 frame -> 1 latent -> 1 frame through the public helpers (scaled latents, clipped video)."""
    _, ours = models
    x = _to_ours_video(_video(1, seed=3))
    z_unscaled = _encode(ours, x, (1,))
    z, zs, v = nnx.jit(
        lambda m, x: (encode_video(m, x), encode_video(m, x, key=jax.random.key(0)), decode_latents(m, encode_video(m, x)))
    )(ours, x)
    np.testing.assert_allclose(np.asarray(z), np.asarray(z_unscaled) * 1.15258426, rtol=1e-5, atol=1e-6)
    assert z.shape == zs.shape == (1, 1, 4, 2, 2) and not np.allclose(np.asarray(zs), np.asarray(z))
    assert v.shape == (1, 1, 16, 16, 3) and float(jnp.abs(v).max()) <= 1.0
    want = np.clip(np.asarray(_decode(ours, z / 1.15258426, (1,))), -1, 1)
    np.testing.assert_allclose(np.asarray(v), want, atol=1e-5)


@pytest.mark.parametrize("tile,overlap", [(2, 0.5), (3, 0.25), (4, 0.0), (8, 0.25)])
@pytest.mark.slow
def test_tiling_geometry_exact(tile, overlap):
    """With a pointwise 'decoder' (nearest x8 upsampling) the blended tiles reproduce the untiled
    output exactly: the tile layout covers the plane and the blend weights normalise."""
    sf = 8
    z = jax.random.normal(jax.random.key(0), (1, 2, 3, 5, 7))

    def dec(zt):
        y = jnp.repeat(jnp.repeat(jnp.moveaxis(zt, 2, -1), sf, axis=2), sf, axis=3)
        return y

    want = dec(z)
    got = tiled_apply(dec, z, (tile, tile), overlap, sf)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    n, starts = tile_layout(7, tile, overlap)
    assert starts[0] == 0 and starts[-1] + n == 7
    assert all(b - a <= max(1, int(n * (1 - overlap))) for a, b in zip(starts, starts[1:]))


@pytest.mark.slow
def test_tiled_decode_equals_untiled_within_tolerance(models):
    """Tiled vs untiled decode at tiny size, 8x8 latents (64x64 px).

    A tile covering the plane is the untiled decode (1e-6). Smaller tiles differ because every
    tile has its own GroupNorm statistics and zero padding at its border (as in diffusers' tiled
    decode, which also blends, not reproduces): with 6-px tiles and 0.25 overlap the stated
    tolerance is mean |diff| <= 0.05 (measured 0.026, max 3.9 at tile borders, with these random
    weights; mean |x| 0.31; 4-px tiles: 0.051). Blending itself is exact (test_tiling_geometry_exact)."""
    _, ours = models
    z = jax.random.normal(jax.random.key(2), (1, 3, 4, 8, 8))
    full = np.asarray(_decode(ours, z, (3,)))
    tiled = nnx.jit(lambda m, z, t: m.tiled_decode(z, tile_size=t, overlap=0.25, plan=(3,)), static_argnums=2)
    whole = np.asarray(tiled(ours, z, 8))
    np.testing.assert_allclose(whole, full, atol=1e-6, rtol=0)
    err6 = np.abs(np.asarray(tiled(ours, z, 6)) - full)
    print(f"tiled vs untiled: tile 6 mean {err6.mean():.4f} max {err6.max():.3f}; mean|x| {np.abs(full).mean():.3f}")
    assert err6.shape == (1, 9, 64, 64, 3) and np.isfinite(err6).all()
    assert err6.mean() <= 0.05


def test_decode_tiling_from_device_memory():
    """Auto tiling (vae.tile_size = -1): untiled when it fits, else the largest tile, else 1-latent
    time chunks; the budget comes from the config override, else the device's memory_stats, else
    the documented CPU fallback; a decode split over 8 devices fits 8x more."""
    full = VAEConfig(dtype="bfloat16")  # paper sizes
    shape = (5, 60, 90)
    untiled = vae_tiling.decode_memory_bytes(full, (60, 90), (3, 2))
    assert vae_tiling.pick_decode_tiling(full, shape, untiled * 1.01) == (0, (3, 2))
    tile, plan = vae_tiling.pick_decode_tiling(full, shape, 16 * 2**30)
    assert plan == (3, 2) and 8 <= tile < 60 and vae_tiling.decode_memory_bytes(full, (tile, tile), plan) <= 16 * 2**30
    # of the tiles that fit, the one decoding the fewest latent px (overlaps included)
    fits = [k for k in range(8, 60, 2) if vae_tiling.decode_memory_bytes(full, (k, k), plan) <= 16 * 2**30]
    work = {k: vae_tiling.tiled_work(60, 90, k, full.tile_overlap) for k in fits}
    assert work[tile] == min(work.values()) and work[tile] < work[max(fits)], (tile, work)
    assert vae_tiling.tiled_work(60, 90, 38, 0.25) == 6 * 38 * 38 and vae_tiling.tiled_work(60, 90, 90, 0.25) == 5400
    assert vae_tiling.pick_decode_tiling(full, shape, 0.2 * 2**30)[1] == (1, 1, 1, 1, 1)
    assert vae_tiling.pick_decode_tiling(full, shape, 16 * 2**30, shards=8) == (0, (3, 2))

    class Dev:
        platform, device_kind = "gpu", "H200"

        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

    gib = 2**30
    assert vae_tiling.device_decode_budget(full, Dev({"bytes_limit": 100 * gib, "bytes_in_use": 20 * gib}))[0] == 0.8 * 80 * gib
    # no memory stats (e.g. compile-only devices): the chip's HBM from parallel/target.py, else the fallback
    assert vae_tiling.device_decode_budget(full, Dev(None)) == (0.8 * 151397597184, "H200 HBM 141 GiB")
    Dev.device_kind = "Some Accelerator"
    assert vae_tiling.device_decode_budget(full, Dev(None)) == (16 * gib, "fallback 16 GiB (gpu)")
    Dev.device_kind = "H200"
    # a GPU uses the GPU bytes factor: one H100 (compile-only: its HBM) decodes 60x90 untiled, where the
    # CPU factor at the same budget tiles it (h100-1 compiled tile 64 before)
    Dev.device_kind = "NVIDIA H100 80GB HBM3"
    tile, plan, why = vae_tiling.resolve_decode_tiling(VAEConfig(dtype="bfloat16", tile_size=-1), shape, device=Dev(None))
    assert (tile, plan) == (0, (3, 2)) and "untiled" in why and "22.2 GiB of a 63.3 GiB" in why, why
    assert vae_tiling.pick_decode_tiling(full, shape, vae_tiling.device_decode_budget(full, Dev(None))[0])[0] > 0  # the CPU factor tiles
    Dev.device_kind = "H200"
    over = VAEConfig(dtype="bfloat16", decode_memory_gib=3.0)
    assert vae_tiling.device_decode_budget(over, Dev(None))[0] == 3 * gib
    auto = VAEConfig(dtype="bfloat16", tile_size=-1)
    tile, plan, why = vae_tiling.resolve_decode_tiling(auto, shape, device=Dev({"bytes_limit": 141 * gib, "bytes_in_use": 0}))
    assert (tile, plan) == (0, (3, 2)) and "untiled" in why and "H200" in why
    assert vae_tiling.resolve_decode_tiling(VAEConfig(tile_size=16), shape)[:2] == (16, (3, 2))
    # a TPU (compile-only: no stats) uses the TPU bytes factor: one v6e chip decodes 60x90 untiled,
    # where the CPU factor at the same budget tiles it (tile 38, what v6e-1 used to compile)
    Dev.platform, Dev.device_kind = "tpu", "TPU v6 lite"
    tile, plan, why = vae_tiling.resolve_decode_tiling(auto, shape, device=Dev(None))
    assert (tile, plan) == (0, (3, 2)) and "untiled" in why and "14.8 GiB of a 25.6 GiB" in why, why
    # a compile-only chip less the turn's other weights (what play's memory_stats would show): with the
    # bf16 MLLM's 17.2 GiB resident the untiled decode no longer fits; with the int8 MLLM's 10.7 it does
    tile, plan, why = vae_tiling.resolve_decode_tiling(auto, shape, device=Dev(None), resident_bytes=17.2 * gib)
    assert tile > 0 and "less 17.2 GiB of weights" in why and "of a 11.8 GiB" in why, why
    tile, plan, why = vae_tiling.resolve_decode_tiling(auto, shape, device=Dev(None), resident_bytes=10.7 * gib)
    assert tile == 0 and "of a 17.0 GiB" in why, why
    assert vae_tiling.decode_bytes_factor(Dev(None)) == vae_tiling.TPU_DECODE_BYTES_FACTOR
    # the CPU factor at the same budget tiles it: 6 tiles of 36 (7776 latent px), fewer px than the
    # largest fitting tile (38: 8664 px, what v6e-1 compiled before)
    assert vae_tiling.pick_decode_tiling(auto, shape, 0.8 * 32 * gib) == (36, (3, 2))


@pytest.mark.slow
@pytest.mark.parity
def test_conv_impl_3d_matches_reference(models):
    """vae.conv_impl = "3d" (native 3-D convs, SpatialNorm convs at the latent resolution) on the same
    weights: encode and the release-plan decode match diffusers as the default "as_2d" does."""
    import dataclasses

    ref, ours = models
    graph, state = nnx.split(ours)
    native = build_vae(dataclasses.replace(ours.cfg, conv_impl="3d"), state)
    assert native.decoder.conv_in.conv.impl == "3d" and native.decoder.up_blocks[0].resnets[0].norm1.at_latent
    assert ours.decoder.conv_in.conv.impl == "as_2d" and not ours.decoder.up_blocks[0].resnets[0].norm1.at_latent
    x = _video(9)
    with torch.no_grad():
        want = ref.encode(x).latent_dist.mean.permute(0, 2, 1, 3, 4).numpy()
    got = np.asarray(_encode(native, _to_ours_video(x), (9,)))
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    z = _latents(5)
    got = np.asarray(_decode(native, _ours_latents(z), (3, 2)))
    np.testing.assert_allclose(got, _ref_decode(ref, z, (3, 2)), atol=TOL, rtol=0)


@pytest.mark.slow
def test_conv_impl_3d_paper_width_psnr():
    """Paper-width decoder layers in bf16 (the paper config's activations): a SpatialNorm resnet
    block at 128 channels and an up level's causal convs give PSNR >= 50 dB between conv_impl
    "3d" and "as_2d" on the same random weights, and the 3-D conv alone agrees with the 2-D form."""
    from animegamer_jax.models.cogvideox.vae import ResnetBlock3D, _set_conv_impl, conv3d_as_2d, conv3d_native

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k1, (1, 4, 6, 6, 24))
    kern = jax.random.normal(k2, (3, 3, 3, 24, 8)) / 20
    np.testing.assert_allclose(np.asarray(conv3d_native(x, kern, 1)), np.asarray(conv3d_as_2d(x, kern, 1)), atol=1e-5)

    blk = ResnetBlock3D(128, 128, 32, 1e-6, 16, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    h = jax.random.normal(k3, (1, 4, 16, 16, 128))
    zq = jax.random.normal(k1, (1, 2, 4, 4, 16))
    run = nnx.jit(lambda m, h, z, c: m(h, z, c))
    cache = {"conv1": None, "conv2": None}
    old, old_c = run(blk, h, zq, cache)
    _set_conv_impl(blk, "3d")
    new, new_c = run(blk, h, zq, cache)
    old, new = (np.asarray(a, np.float32) for a in (old, new))
    psnr = 10 * np.log10((old.max() - old.min()) ** 2 / np.mean((old - new) ** 2))
    assert psnr >= 50.0, psnr
    np.testing.assert_array_equal(np.asarray(old_c["conv1"], np.float32), np.asarray(new_c["conv1"], np.float32))


def test_conv_impl_refused():
    with pytest.raises(ValueError, match="vae.conv_impl='2d'"):
        VAEConfig.from_config({"conv_impl": "2d"})


def test_decode_rows_past_the_budget_one_game_at_a_time(models):
    """inference.vae_decode.vae_decoder sizes its plan for one game per device; a batch with more rows
    per device than the budget holds decodes one row at a time (lax.map), each row's frames equal to
    decoding that game alone, chunk by chunk (decode_chunk) too; within the budget the batch decodes
    at once (no loop in the program)."""
    import dataclasses

    from animegamer_jax.config import load_config
    from animegamer_jax.inference.vae_decode import vae_decoder

    _, ours = models
    config = load_config("configs/tiny.py")
    config.dit.update(num_latent_frames=3, sample_height=2, sample_width=2)
    plan = chunk_plan(3, *ours.cfg.decode_chunks)
    one = vae_tiling.decode_memory_bytes(ours.cfg, (2, 2), plan, 1, vae_tiling.decode_bytes_factor())
    g, state = nnx.split(ours)
    p = {"vae": state}
    z = _ours_latents(torch.randn(3, 4, 3, 2, 2, generator=torch.Generator().manual_seed(3)))
    scale = float(config.vae.scaling_factor)
    runs = {}
    for rows_fit in (2, 3):  # the budget holds 2 games (3 rows: one at a time), then 3 (at once)
        vcfg = dataclasses.replace(ours.cfg, tile_size=-1, decode_memory_gib=(rows_fit + 0.5) * one / 2**30)
        decode, decode_chunk, dplan = vae_decoder(g, vcfg, config, num_devices=1)
        assert "untiled" in decode.why and dplan == plan
        loops = "scan[" in str(jax.make_jaxpr(decode)(p, z))  # lax.map
        assert loops == (rows_fit < 3)
        runs[rows_fit] = np.asarray(jax.jit(decode)(p, z))
        alone = np.concatenate([np.asarray(jax.jit(decode)(p, z[i:i + 1])) for i in range(3)])
        np.testing.assert_allclose(runs[rows_fit], alone, atol=1e-6)
        cache, chunks, s = None, [], 0
        for n in plan:
            f, cache = jax.jit(decode_chunk)(p, z[:, s:s + n], cache)
            chunks.append(np.asarray(f))
            s += n
        np.testing.assert_allclose(np.concatenate(chunks, 1), runs[rows_fit], atol=1e-5)
    assert runs[2].shape == (3, 9, 16, 16, 3) and 0.0 <= runs[2].min() and runs[2].max() <= 1.0
    np.testing.assert_allclose(runs[2], runs[3], atol=1e-6)
    assert float(np.std(runs[2])) > 0.01  # real frames, not a constant
