"""CogVideoX VAE decode: our jitted JAX decode vs diffusers' torch decode, plus memory analyses.

Run (CPU, a few minutes on 2 cores):
  python -m benchmarks.vae_bench                       # tiny + medium timing, scan memory check
  python -m benchmarks.vae_bench --full_memory         # + compiled memory of full 5x60x90 decode
  python -m benchmarks.vae_bench --train_step          # train step: lax 3-D conv vs unfolded 2-D conv

``--train_step``: one jitted value-and-grad of the reconstruction loss of the configs/tiny.py VAE,
with every 3-D conv as ``conv3d_as_2d`` (the model's path) and as XLA's native 3-D conv (the path it
replaced), same weights and batch, both warmed up, timed interleaved (ABAB), backend asserted CPU.

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

from animegamer_jax.models.cogvideox import vae as vae_lib
from animegamer_jax.models.cogvideox.vae import CogVideoXVAE, VAEConfig, count_params
from animegamer_jax.models.cogvideox.vae_tiling import diffusers_plan
from animegamer_jax.models.cogvideox.vae_convert import build_vae, diffusers_to_state
from benchmarks.common import median_seconds
from configs import animegamer_2b_7b, tiny

CONFIGS = {
    "tiny": (dict(block_out_channels=(8, 8, 16, 16), latent_channels=4, layers_per_block=1, norm_num_groups=4),
             4),
    "medium": (dict(block_out_channels=(32, 64, 64, 128), latent_channels=16, layers_per_block=2,
                    norm_num_groups=8), 8),
}


def _median_time(fn, reps):
    """Median seconds of ``reps`` calls of ``fn`` after one warm-up call."""
    fn()
    return median_seconds(fn, reps)


def bench_decode(name: str, reps: int) -> None:
    from diffusers import AutoencoderKLCogVideoX  # optional

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
    tile = f", tile {tiled}" if tiled else ""
    print(f"  decode {t_lat}x{h}x{w} ({cfg.dtype}{tile}): temp {out['temp_gib']:.3f} GiB, params/args "
          f"{out['args_gib']:.3f} GiB, output {out['out_gib']:.3f} GiB (compile {out['compile_s']:.0f} s)")
    return out


def _native_conv3d(x, kernel, pad):
    """XLA's own 3-D convolution, the drop-in the model's ``conv3d_as_2d`` replaced."""
    return jax.lax.conv_general_dilated(x, kernel, (1, 1, 1), ((0, 0), (pad, pad), (pad, pad)),
                                        dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))


def bench_train_step(shapes: str, reps: int) -> None:
    """Train-step time of the tiny VAE, unfolded 2-D conv (ours) vs native 3-D conv, ABAB."""
    backend = jax.default_backend()
    assert backend == "cpu", f"--train_step compares XLA:CPU conv paths; backend is {backend}"
    cfg = VAEConfig.from_config(tiny.get_config().vae)
    graphdef, state = nnx.split(CogVideoXVAE(cfg, rngs=nnx.Rngs(0)))

    def loss(state, x):
        m = nnx.merge(graphdef, state)
        return jnp.mean((m.decode(m.encode(x).mean) - x) ** 2)

    ours = vae_lib.conv3d_as_2d
    print(f"backend {backend}, {jax.device_count()} device(s), tiny VAE {count_params(cfg):,} params")
    for shp in shapes.split(","):
        b, t, h, w = (int(v) for v in shp.split("x"))
        x = jnp.asarray(np.random.RandomState(0).uniform(-1, 1, (b, t, h, w, 3)).astype(np.float32))
        compiled = {}
        for name, call in (("unfolded", ours), ("native", _native_conv3d)):
            vae_lib.conv3d_as_2d = call
            compiled[name] = jax.jit(jax.value_and_grad(loss)).lower(state, x).compile()
            vae_lib.conv3d_as_2d = ours
        times = {k: [] for k in compiled}
        vals = {}
        for k, f in compiled.items():  # warm-up
            vals[k] = float(jax.block_until_ready(f(state, x))[0])
        for _ in range(reps):
            for k, f in compiled.items():
                t0 = time.perf_counter()
                jax.block_until_ready(f(state, x))
                times[k].append(time.perf_counter() - t0)
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(f"  train step B,T,H,W={b},{t},{h},{w}: unfolded 2-D {med['unfolded']:.3f} s, native 3-D "
              f"{med['native']:.3f} s, speed-up {med['native'] / med['unfolded']:.2f}x, "
              f"|loss diff| {abs(vals['unfolded'] - vals['native']):.1e}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--configs", default="tiny,medium")
    p.add_argument("--full_memory", action="store_true")
    p.add_argument("--train_step", action="store_true")
    p.add_argument("--shapes", default="2x1x64x96,2x9x32x48", help="B x T x H x W of --train_step batches")
    args = p.parse_args()
    jax.config.update("jax_default_matmul_precision", "highest")
    if args.train_step:
        bench_train_step(args.shapes, args.reps)
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"devices: {jax.devices()}, torch threads {torch.get_num_threads()}")
    for name in args.configs.split(","):
        bench_decode(name, args.reps)
    print("memory vs frame count (medium config, 32x32 latents, release plan):")
    med = VAEConfig(**CONFIGS["medium"][0])
    memory(med, 5, 32, 32)
    memory(med, 13, 32, 32)
    if args.full_memory:
        full = VAEConfig.from_config(animegamer_2b_7b.get_config().vae)
        print(f"full VAE: {count_params(full):,} params")
        memory(full, 5, 60, 90)
        memory(full, 5, 60, 90, tiled=32)


if __name__ == "__main__":
    main()
