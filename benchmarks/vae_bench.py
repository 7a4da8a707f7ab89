"""CogVideoX VAE decode: our jitted JAX decode vs diffusers' torch decode, plus memory analyses.

Run (CPU, a few minutes on 2 cores):
  python -m benchmarks.vae_bench                       # tiny + medium timing, scan memory check
  python -m benchmarks.vae_bench --full_memory         # + compiled memory of full 5x60x90 decode

Timing: same weights (moved through our converter), same chunk plan (diffusers' (3, 2) for 5
latents), fp32, median of ``--reps`` runs after one warm-up (JAX compile excluded).
Memory: ``jax.jit(...).lower(abstract).compile().memory_analysis()`` (nothing is executed): temp
bytes for 5 and 13 latents show decode memory is one chunk's activations (the lax.scan carries only
the causal cache), not proportional to the frame count.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from animegamer_jax.convert.cogvideox_vae import build_vae, diffusers_to_state
from animegamer_jax.models.cogvideox_vae import CogVideoXVAE, VAEConfig, count_params, diffusers_plan

CONFIGS = {
    "tiny": (dict(block_out_channels=(8, 8, 16, 16), latent_channels=4, layers_per_block=1, norm_num_groups=4), 4),
    "medium": (dict(block_out_channels=(32, 64, 64, 128), latent_channels=16, layers_per_block=2, norm_num_groups=8), 8),
}


def _median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def bench_decode(name: str, reps: int) -> None:
    from diffusers import AutoencoderKLCogVideoX

    kw, hw = CONFIGS[name]
    torch.manual_seed(0)
    ref = AutoencoderKLCogVideoX(**kw).eval()
    cfg = VAEConfig(**kw)
    ours = build_vae(cfg, diffusers_to_state(ref.state_dict(), cfg))
    z = torch.randn(1, kw["latent_channels"], 5, hw, hw)
    zj = jnp.asarray(z.permute(0, 2, 1, 3, 4).numpy())
    plan = diffusers_plan(5, 2)
    dec = nnx.jit(lambda m, z: m.decode(z, plan))
    t0 = time.perf_counter()
    out = dec(ours, zj).block_until_ready()
    compile_s = time.perf_counter() - t0

    def run_torch():
        with torch.no_grad():
            return ref.decode(z).sample

    t_jax = _median_time(lambda: dec(ours, zj).block_until_ready(), reps)
    t_torch = _median_time(run_torch, reps)
    err = float(np.abs(np.asarray(out) - run_torch().permute(0, 2, 3, 4, 1).numpy()).max())
    print(
        f"[{name}] decode 5x{hw}x{hw} latents -> {tuple(out.shape)}: jax {t_jax * 1e3:.1f} ms "
        f"(compile {compile_s:.1f} s), torch {t_torch * 1e3:.1f} ms, ratio jax/torch {t_jax / t_torch:.2f}, "
        f"max|diff| {err:.1e}"
    )


def memory(cfg: VAEConfig, t_lat: int, h: int, w: int, tiled: int = 0) -> dict:
    abstract = nnx.eval_shape(lambda: CogVideoXVAE(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)

    def fn(state, z):
        m = nnx.merge(graphdef, state)
        return m.tiled_decode(z, tile_size=tiled) if tiled else m.decode(z)

    z = jax.ShapeDtypeStruct((1, t_lat, cfg.latent_channels, h, w), jnp.float32)
    t0 = time.perf_counter()
    ma = jax.jit(fn).lower(state, z).compile().memory_analysis()
    gib = 1024**3
    out = dict(
        temp_gib=ma.temp_size_in_bytes / gib,
        args_gib=ma.argument_size_in_bytes / gib,
        out_gib=ma.output_size_in_bytes / gib,
        compile_s=time.perf_counter() - t0,
    )
    print(
        f"  decode {t_lat}x{h}x{w} ({cfg.dtype}{', tile ' + str(tiled) if tiled else ''}): temp {out['temp_gib']:.3f} GiB, "
        f"params/args {out['args_gib']:.3f} GiB, output {out['out_gib']:.3f} GiB (compile {out['compile_s']:.0f} s)"
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--configs", default="tiny,medium")
    p.add_argument("--full_memory", action="store_true")
    args = p.parse_args()
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"devices: {jax.devices()}, torch threads {torch.get_num_threads()}")
    for name in args.configs.split(","):
        bench_decode(name, args.reps)
    print("memory vs frame count (medium config, 32x32 latents, release plan):")
    med = VAEConfig(**CONFIGS["medium"][0])
    memory(med, 5, 32, 32)
    memory(med, 13, 32, 32)
    if args.full_memory:
        from configs.animegamer_2b_7b import get_config

        full = VAEConfig.from_config(get_config().vae)
        print(f"full VAE: {count_params(full):,} params")
        memory(full, 5, 60, 90)
        memory(full, 5, 60, 90, tiled=32)


if __name__ == "__main__":
    main()
