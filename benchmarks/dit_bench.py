"""DiT forward: our jitted JAX model vs diffusers' torch CogVideoXTransformer3DModel, same config, one run.

Also times the jitted guided DPM++ sampling loop and checks that it traces the network once for all steps.

Usage (CPU here; pass --device-count nothing else):
  python benchmarks/dit_bench.py                      # medium: 4 layers, hidden 256, 2 x 16x16 latents
  python benchmarks/dit_bench.py --layers 2 --heads 2 --head-dim 16 --size 8 --text 8   # tiny
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from animegamer_jax.convert import cogvideox_dit as conv
from animegamer_jax.diffusion import samplers
from animegamer_jax.models.cogvideox_dit import DiTConfig


def _time(fn, iters: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--frames", type=int, default=2)
    ap.add_argument("--size", type=int, default=16, help="latent height = width")
    ap.add_argument("--text", type=int, default=226, help="conditioning tokens")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="sampler steps for the loop timing")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()

    from diffusers import CogVideoXTransformer3DModel

    D = args.heads * args.head_dim
    torch.manual_seed(0)
    tm = CogVideoXTransformer3DModel(
        num_attention_heads=args.heads, attention_head_dim=args.head_dim, in_channels=16, out_channels=16,
        time_embed_dim=128, text_embed_dim=D, num_layers=args.layers, sample_width=args.size,
        sample_height=args.size, sample_frames=(args.frames - 1) * 4 + 1, patch_size=2,
        max_text_seq_length=args.text, use_rotary_positional_embeddings=False).eval()
    cfg = DiTConfig(hidden_size=D, num_layers=args.layers, num_heads=args.heads, head_dim=args.head_dim,
                    time_embed_dim=128, text_length=args.text, final_norm_eps=1e-5, lora_rank=0,
                    dtype=args.dtype)
    params, _ = conv.from_diffusers(tm.state_dict(), cfg)
    model = conv.build_model(cfg, params, keep_init=("flow_embed",))

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.frames, 16, args.size, args.size)).astype(np.float32)
    txt = rng.standard_normal((args.batch, args.text, D)).astype(np.float32)
    t = np.array([999, 500][: args.batch] + [10] * max(0, args.batch - 2))
    with torch.no_grad():
        cond = tm.patch_embed.text_proj(torch.from_numpy(txt)).numpy()

    fwd = nnx.jit(lambda m, x, c, t: m(x, c, t, None))
    xj, cj, tj = jnp.asarray(x), jnp.asarray(cond), jnp.asarray(t)
    t0 = time.perf_counter()
    out = fwd(model, xj, cj, tj).block_until_ready()
    compile_s = time.perf_counter() - t0
    jax_s = _time(lambda: fwd(model, xj, cj, tj).block_until_ready(), args.iters)
    xt, txtt, tt = torch.from_numpy(x), torch.from_numpy(txt), torch.from_numpy(t)
    with torch.no_grad():
        ref = tm(xt, txtt, tt).sample.numpy()
        torch_s = _time(lambda: tm(xt, txtt, tt), args.iters)
    tokens = args.text + args.frames * (args.size // 2) ** 2
    print(f"config: layers={args.layers} hidden={D} heads={args.heads} tokens={tokens} batch={args.batch} "
          f"dtype={args.dtype} backend={jax.default_backend()} torch_threads={torch.get_num_threads()}")
    print(f"max abs diff vs torch: {np.abs(np.asarray(out, np.float32) - ref).max():.2e}")
    print(f"jax jitted forward: {jax_s * 1e3:.1f} ms (first call incl. compile {compile_s:.1f} s)")
    print(f"torch forward:      {torch_s * 1e3:.1f} ms")
    print(f"ratio jax/torch:    {jax_s / torch_s:.2f}")

    traces = []

    @nnx.jit
    def generate(m, x, c, u, key):
        def denoise_fn(x, t, cb):
            traces.append(1)
            return m(x, cb, t, None)

        return samplers.sample(denoise_fn, x, c, u, key, plan)

    plan = samplers.make_plan(args.steps, "dpmpp_2m")
    x1, c1 = xj[:1], cj[:1]
    t0 = time.perf_counter()
    generate(model, x1, c1, jnp.zeros_like(c1), jax.random.key(0)).block_until_ready()
    first = time.perf_counter() - t0
    loop_s = _time(lambda: generate(model, x1, c1, jnp.zeros_like(c1), jax.random.key(1)).block_until_ready(), 2)
    print(f"guided DPM++ {args.steps} steps: {loop_s * 1e3:.1f} ms ({loop_s / args.steps * 1e3:.1f} ms/step, "
          f"first call {first:.1f} s), network traced {len(traces)} time(s)")


if __name__ == "__main__":
    main()
