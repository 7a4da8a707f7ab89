"""Frozen encoders side by side with their torch references (same weights via our converters).

  python benchmarks/encoders_bench.py [--scale small|base] [--batch 4] [--iters 5]

Times f_v (CLIP vision tower on preprocessed pixels, penultimate patch tokens) and
f_md (T5 v1.1 encoder, 30 tokens) for our jitted NNX models and HF torch (eval, no_grad), fp32, on
whatever JAX backend is active (torch on CPU). ``small`` is a reduced width/depth for 2-core dev
machines; ``base`` is ViT-B/16 at 224 and a T5-v1.1-base-sized encoder. Prints median ms per
batch and the max abs difference of the outputs.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from flax import nnx  # noqa: E402

from animegamer_jax.models.clip import convert as clip_convert  # noqa: E402
from animegamer_jax.models.t5 import convert as t5_convert  # noqa: E402
from benchmarks.common import median, time_calls  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

SIZES = {
    "small": dict(clip=dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                            image_size=224, patch_size=16),
                  t5=dict(d_model=256, d_kv=64, d_ff=640, num_layers=4, num_heads=4)),
    "base": dict(clip=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                           image_size=224, patch_size=16),
                 t5=dict(d_model=768, d_kv=64, d_ff=2048, num_layers=12, num_heads=12)),
}


def _median_ms(fn, iters):
    """Median milliseconds of ``iters`` calls of ``fn`` after one warm-up call."""
    fn()
    return 1e3 * median(time_calls(fn, iters))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scale", default="small", choices=list(SIZES))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--iters", type=int, default=5)
    a = p.parse_args()
    torch.manual_seed(0)
    s = SIZES[a.scale]
    rng = np.random.default_rng(0)

    vis = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(hidden_act="gelu", **s["clip"])).eval()
    cfg = clip_convert.config_from_hf(vis.config.to_dict())
    ours_v = clip_convert.load_clip(vis.state_dict(), cfg, vision_only=True)
    pixels = rng.standard_normal((a.batch, 224, 224, 3)).astype(np.float32)
    pt = torch.tensor(pixels.transpose(0, 3, 1, 2))
    run_v = nnx.jit(lambda m, x: m.patch_tokens(x))
    xj = jnp.asarray(pixels)
    with torch.no_grad():
        ref_v = vis(pixel_values=pt, output_hidden_states=True).hidden_states[-2][:, 1:].numpy()
        t_torch = _median_ms(lambda: vis(pixel_values=pt, output_hidden_states=True), a.iters)
    t_jax = _median_ms(lambda: run_v(ours_v, xj).block_until_ready(), a.iters)
    err = np.abs(np.asarray(run_v(ours_v, xj)) - ref_v).max()
    print(f"CLIP vision f_v  B={a.batch} {a.scale}: jax {t_jax:8.1f} ms  torch {t_torch:8.1f} ms  max|diff| {err:.2e}")

    t5 = transformers.T5EncoderModel(transformers.T5Config(vocab_size=32128, feed_forward_proj="gated-gelu",
                                                           **s["t5"])).eval()
    tcfg = t5_convert.config_from_hf(t5.config.to_dict())
    ours_t = t5_convert.load_t5(t5.state_dict(), tcfg)
    ids = rng.integers(2, 32000, size=(a.batch, 30))
    run_t = nnx.jit(lambda m, t: m(t))
    ij, it = jnp.asarray(ids, jnp.int32), torch.tensor(ids)
    with torch.no_grad():
        ref_t = t5(input_ids=it).last_hidden_state.numpy()
        t_torch = _median_ms(lambda: t5(input_ids=it), a.iters)
    t_jax = _median_ms(lambda: run_t(ours_t, ij).block_until_ready(), a.iters)
    err = np.abs(np.asarray(run_t(ours_t, ij)) - ref_t).max()
    print(f"T5 encoder f_md  B={a.batch} {a.scale}: jax {t_jax:8.1f} ms  torch {t_torch:8.1f} ms  max|diff| {err:.2e}")
    print(f"backend {jax.default_backend()}, torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
