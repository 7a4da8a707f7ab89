"""Bytes and FLOPs of the paper-width VAE decode at a reduced latent size, compiled for a chip ahead of time.

A proxy for ``python -m animegamer_jax.commands.aot --topology=v6e-1 --program=vae_decode`` (20-35 min on a
2-core host): the paper config's VAE decoder (``configs/animegamer_2b_7b.py``, bf16 activations, the
release chunk plan) on latents ``[1, T, 16, h, w]``, untiled, jitted for one device of ``--topology``
(libtpu compile-only devices; nothing runs), then the trip-count-aware totals of
``aot.hlo_cost.program_cost``, the compiled temporaries and the ``top_bytes`` instructions.

    python -m benchmarks.vae_decode_bytes --topology=v6e-1 --latent=5,20,30 [--set vae.conv_impl=...]

Prints one line of totals (GFLOP, GB accessed, bytes per FLOP, temporaries GiB) and the top byte movers.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from flax import nnx


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="v6e-1")
    ap.add_argument("--latent", default="5,20,30", help="T_lat,h,w of the latents")
    ap.add_argument("--set", action="append", default=[], help="vae.FIELD=VALUE config overrides")
    ap.add_argument("--block", default="", help="F,H,W: compile one paper-width decoder resnet block (128 "
                    "channels, SpatialNorm, the top up level's) on activations [1, F, H, W, 128] and latents "
                    "[1, T, h, w, 16] from --latent instead of the whole decoder (compiles in a minute)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--dump", default="", help="write the optimized HLO text here")
    args = ap.parse_args(argv)

    from animegamer_jax.aot import hlo_cost
    from animegamer_jax.models.cogvideox.vae import CogVideoXVAE, VAEConfig
    from animegamer_jax.models.cogvideox.vae_tiling import chunk_plan
    from animegamer_jax.parallel import target as target_lib
    from configs.animegamer_2b_7b import get_config

    cfg = get_config()
    for kv in args.set:
        k, v = kv.split("=", 1)
        assert k.startswith("vae."), kv
        cur = cfg.vae[k[4:]] if k[4:] in cfg.vae else ""
        cfg.vae[k[4:]] = type(cur)(v) if not isinstance(cur, (tuple, list)) else tuple(int(x) for x in v.split(","))
    vcfg = VAEConfig.from_config(cfg.vae)
    t, h, w = (int(x) for x in args.latent.split(","))
    dev = target_lib.compile_devices(target_lib.parse_topology(args.topology))[0]
    sh = jax.sharding.SingleDeviceSharding(dev)
    graph, state = nnx.split(nnx.eval_shape(lambda: CogVideoXVAE(vcfg, rngs=nnx.Rngs(0))))
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), state)
    lat = jax.ShapeDtypeStruct((1, t, vcfg.latent_channels, h, w), jnp.float32, sharding=sh)
    plan = chunk_plan(t, *vcfg.decode_chunks)

    def decode(state, z):
        return nnx.merge(graph, state).decode(z, plan)

    t0 = time.time()
    if args.block:
        from animegamer_jax.models.cogvideox.vae import ResnetBlock3D, _set_conv_impl

        f, hh, ww = (int(x) for x in args.block.split(","))
        ch = vcfg.block_out_channels[0]

        def make():
            blk = ResnetBlock3D(ch, ch, vcfg.norm_num_groups, vcfg.norm_eps, vcfg.latent_channels,
                                dtype=jnp.dtype(vcfg.dtype), rngs=nnx.Rngs(0))
            _set_conv_impl(blk, vcfg.conv_impl)
            return blk

        bgraph, bstate = nnx.split(nnx.eval_shape(make))
        bstate = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), bstate)
        act = jax.ShapeDtypeStruct((1, f, hh, ww, ch), jnp.dtype(vcfg.dtype), sharding=sh)
        zq = jax.ShapeDtypeStruct((1, t, h, w, vcfg.latent_channels), jnp.dtype(vcfg.dtype), sharding=sh)
        cache = jax.ShapeDtypeStruct((1, 2, hh, ww, ch), jnp.dtype(vcfg.dtype), sharding=sh)
        plan = f"block {f}x{hh}x{ww}x{ch}"

        def block(state, x, z, c):
            return nnx.merge(bgraph, state)(x, z, {"conv1": c, "conv2": c})

        compiled = jax.jit(block).lower(bstate, act, zq, cache).compile()
    else:
        compiled = jax.jit(decode).lower(state, lat).compile()
    text = compiled.as_text()
    if args.dump:
        with open(args.dump, "w") as f:
            f.write(text)
    cost = hlo_cost.program_cost(text)
    mem = compiled.memory_analysis()
    print(f"{args.topology} latents {t}x{h}x{w} plan {plan} {' '.join(args.set)}: "
          f"{cost.flops / 1e9:.1f} GFLOP, {cost.bytes_accessed / 1e9:.2f} GB, "
          f"{cost.bytes_accessed / cost.flops:.4f} B/FLOP, temporaries {mem.temp_size_in_bytes / 2**30:.3f} GiB, "
          f"compile {time.time() - t0:.0f} s")
    for row in hlo_cost.top_bytes(text, args.top):
        print("  " + "  ".join(str(x)[:150] for x in row))


if __name__ == "__main__":
    main()
