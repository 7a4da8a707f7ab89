"""Prefill and per-token decode time: our jitted Mistral vs transformers' torch MistralForCausalLM.

Both run the same weights (moved through our converter), batch 1, greedy, KV cache, in one
process; the ratio ours / torch is printed per config (target <= 1.0 at the medium config).
Decode is checked not to recompile per token (one compiled decode executable).

  python benchmarks/mistral_bench.py                      # tiny + medium, fp32, CPU
  python benchmarks/mistral_bench.py --configs medium --prompt 512 --steps 64

On 2 busy CPU cores the medium config takes about a minute.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from animegamer_jax.convert import mistral as cm
from animegamer_jax.models import mistral as mst

CONFIGS = {
    "tiny": dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "medium": dict(vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=8,
                   num_attention_heads=16, num_key_value_heads=4, head_dim=64),
}


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench(name: str, prompt: int, steps: int, reps: int, window: int | None) -> dict[str, float]:
    from transformers import DynamicCache, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    hc = MistralConfig(**CONFIGS[name], sliding_window=window, max_position_embeddings=8192,
                       attn_implementation="sdpa")
    tm = MistralForCausalLM(hc).eval()
    cfg = cm.config_from_hf(hc.to_dict(), dtype="float32", param_dtype="float32")
    state = cm.convert_mistral({k: v.numpy() for k, v in tm.state_dict().items()}, cfg)
    model = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: mst.Mistral(cfg, rngs=nnx.Rngs(0)))), state)
    ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (1, prompt))
    s_max = prompt + steps

    def ours_prefill():
        cache = mst.KVCache.init(cfg, 1, s_max)
        logits, cache = mst.prefill(model, cache, jnp.asarray(ids))
        jax.block_until_ready(logits)
        return logits, cache

    def ours_decode():
        logits, cache = ours_prefill()
        tok = jnp.argmax(logits, -1).astype(jnp.int32)
        t = time.perf_counter()
        for _ in range(steps):
            tok, _, cache = mst.decode_step(model, tok, cache)
        jax.block_until_ready(tok)
        return (time.perf_counter() - t) / steps

    def torch_prefill():
        with torch.no_grad():
            out = tm(torch.tensor(ids), cache=DynamicCache(config=hc), use_cache=True)
        return out

    def torch_decode():
        with torch.no_grad():
            out = torch_prefill()
            cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            t = time.perf_counter()
            for _ in range(steps):
                out = tm(tok, cache=cache, use_cache=True)
                cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            return (time.perf_counter() - t) / steps

    ours_decode()  # compile prefill + decode
    n_exec = mst._decode_step._cache_size()
    torch_decode()
    r = {
        "ours_prefill_ms": 1e3 * _best(ours_prefill, reps),
        "torch_prefill_ms": 1e3 * _best(torch_prefill, reps),
        "ours_decode_ms": 1e3 * min(ours_decode() for _ in range(reps)),
        "torch_decode_ms": 1e3 * min(torch_decode() for _ in range(reps)),
    }
    ours_decode()
    if mst._decode_step._cache_size() != n_exec:
        raise RuntimeError("decode recompiled between runs")
    r["prefill_ratio"] = r["ours_prefill_ms"] / r["torch_prefill_ms"]
    r["decode_ratio"] = r["ours_decode_ms"] / r["torch_decode_ms"]
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="tiny,medium")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--window", type=int, default=0, help="sliding window (0 = none)")
    a = p.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); batch 1, prompt {a.prompt}, {a.steps} decode steps, fp32")
    for name in a.configs.split(","):
        r = bench(name, a.prompt, a.steps, a.reps, a.window or None)
        print(f"{name:7s} prefill ours {r['ours_prefill_ms']:8.2f} ms  torch {r['torch_prefill_ms']:8.2f} ms  "
              f"ratio {r['prefill_ratio']:.2f} | decode/token ours {r['ours_decode_ms']:7.2f} ms  "
              f"torch {r['torch_decode_ms']:7.2f} ms  ratio {r['decode_ratio']:.2f}")


if __name__ == "__main__":
    main()
