"""Times one full-size game turn (random weights) and a few train steps on one accelerator; implied MFU.

    python benchmarks/gpu_bench.py --out gpu_check_out             # paper size, on a GPU (called by gpu_check.sh)
    python benchmarks/gpu_bench.py --config configs/tiny.py --allow_cpu --out /tmp/gb   # dry run of the logic

Pieces (benchmarks/turn_pieces.py): MLLM pass A (prefill + greedy decode steps with a KV cache),
pass B, DiT sampling (all steps, CFG batch 2, one lax.scan), VAE decode; then the phase (a2) DiT and
phase (b) MLLM train steps at a per-device batch that fits one chip. Each piece is compiled once
(compile time reported apart), then run ``--repeats`` times; s/turn = prefill + (new-1) x decode +
pass B + sampling + VAE. MFU = analytic FLOPs (benchmarks/cost_model.py) / (time x peak).

Self-checks (exit status 1 if any fails): the backend is a GPU (unless --allow_cpu), every output is
finite, the decoded clip has the configured shape, implied MFU is below 100 %. A piece that fails
or does not fit the time budget is reported as such and the rest still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import cost_model as cm  # noqa: E402


def _finite(tree) -> bool:
    ok = True
    for x in jax.tree.leaves(tree):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
            ok &= bool(jnp.all(jnp.isfinite(x.astype(jnp.float32))))
    return ok


def time_piece(piece, builder, repeats: int, chain=None):
    """(compile_s, run_s median, last output). ``chain`` rebuilds donated args from the last output."""
    from benchmarks.turn_pieces import lower_piece

    t0 = time.perf_counter()
    compiled = lower_piece(piece, builder).compile()
    compile_s = time.perf_counter() - t0
    args = piece.args
    out = jax.block_until_ready(compiled(*args))  # warm-up run
    times = []
    for _ in range(repeats):
        if chain is not None:
            args = chain(args, out)
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return compile_s, float(np.median(times)), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/animegamer_2b_7b.py")
    ap.add_argument("--out", default="gpu_check_out")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget_s", type=float, default=480.0, help="stop starting new pieces after this")
    ap.add_argument("--chip", default="", help="peak table key (default from the device kind)")
    ap.add_argument("--peak_tflops", type=float, default=0.0)
    ap.add_argument("--dit_train_batch", type=int, default=2)
    ap.add_argument("--mllm_train_batch", type=int, default=1)
    ap.add_argument("--skip_train", action="store_true")
    ap.add_argument("--allow_cpu", action="store_true")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)

    from animegamer_jax import parallel
    from animegamer_jax.config import load_config
    from benchmarks import turn_pieces as tp

    dev = jax.devices()[0]
    checks: dict[str, bool] = {"gpu backend": dev.platform == "gpu" or args.allow_cpu}
    kind = dev.device_kind.lower()
    chip = args.chip or next((k for k in cm.PEAK_TFLOPS if k.split("-")[-1] in kind), "h100")
    peak = (args.peak_tflops or cm.PEAK_TFLOPS[chip]) * 1e12
    print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}; peak {peak / 1e12:.0f} TFLOP/s "
          f"({'--peak_tflops' if args.peak_tflops else chip})", flush=True)
    cfg = load_config(args.config, ["mesh.shape=(1,1,1,1)"])
    mesh = parallel.make_mesh((1, 1, 1, 1), tuple(cfg.mesh.axes), devices=jax.devices()[:1])
    b = tp.Builder(cfg, mesh, abstract=False)
    results: dict[str, dict] = {}

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_start)

    def run(name, make, chain=None, check=None):
        if left() < 30:
            results[name] = {"status": f"skipped: time budget ({args.budget_s:.0f} s) used"}
            print(f"{name}: skipped (time budget)", flush=True)
            return None
        try:
            piece = make()
            c, r, out = time_piece(piece, b, args.repeats, chain)
            ok = _finite(out) and (check(out) if check else True)
            results[name] = {"status": "ok" if ok else "FAILED check", "compile_s": c, "run_s": r, "note": piece.note}
            checks[f"{name} finite/shape"] = ok
            print(f"{name}: compile {c:.1f} s, run {r:.4f} s ({piece.note}){'' if ok else '  CHECK FAILED'}",
                  flush=True)
            return out
        except Exception as e:  # a failing piece is reported, the others still run
            results[name] = {"status": f"error: {type(e).__name__}: {e}"[:400]}
            checks[f"{name} ran"] = False
            traceback.print_exc()
            return None

    def get(name):
        return tp.make_turn_piece(cfg, b, name)

    def chain_cache(args_, out):
        # prefill/decode donate the cache: feed the returned one back (length grows, shape fixed)
        tok, cache = out
        from animegamer_jax.models.mistral import model as mst

        fresh = mst.KVCache(cache.k, cache.v, jnp.zeros((), jnp.int32))
        return (args_[0], args_[1], fresh)

    def chain_decode(args_, out):
        tok, cache = out
        from animegamer_jax.models.mistral import model as mst

        return (args_[0], tok.astype(jnp.int32), mst.KVCache(cache.k, cache.v, jnp.asarray(tp.turn_length(cfg), jnp.int32)))

    lat = (1, cfg.dit.num_latent_frames, cfg.dit.in_channels, cfg.dit.sample_height, cfg.dit.sample_width)
    frames_shape = (1, 1 + 4 * (cfg.dit.num_latent_frames - 1), cfg.data.height, cfg.data.width, 3)
    run("mllm_prefill", lambda: get("mllm_prefill"), chain_cache)
    run("mllm_decode", lambda: get("mllm_decode"), chain_decode)
    run("mllm_pass_b", lambda: get("mllm_pass_b"))
    run("dit_sampling", lambda: get("dit_sampling"), check=lambda o: tuple(o.shape) == lat)
    run("vae_decode", lambda: get("vae_decode"), check=lambda o: tuple(o.shape) == frames_shape)
    b.modules.clear()  # free the inference weights before training

    turn = None
    need = ("mllm_prefill", "mllm_decode", "mllm_pass_b", "dit_sampling", "vae_decode")
    if all(results.get(k, {}).get("status") == "ok" for k in need):
        r = {k: results[k]["run_s"] for k in need}
        turn = (r["mllm_prefill"] + (cfg.mllm.max_new_tokens - 1) * r["mllm_decode"] + r["mllm_pass_b"]
                + r["dit_sampling"] + r["vae_decode"])
        flops = cm.turn_flops(cfg, lora=False)
        turn_mfu = cm.mfu(sum(flops.values()), turn, peak)
        checks["turn MFU < 100 %"] = turn_mfu < 1.0
        results["turn"] = {"s_per_turn": turn, "flops": sum(flops.values()), "mfu": turn_mfu,
                           "dit_mfu": cm.mfu(flops["dit"], r["dit_sampling"], peak),
                           "paper_s_per_turn": 24.0}
        print(f"game turn: {turn:.2f} s/turn, MFU {100 * turn_mfu:.1f} % (DiT sampling alone "
              f"{100 * results['turn']['dit_mfu']:.1f} %); paper 24 s/turn (hardware not stated)", flush=True)

    if not args.skip_train:
        def train(name):
            n = args.dit_train_batch if name == "train_a2_dit" else args.mllm_train_batch
            return tp.make_train_piece(cfg, b, name, batch=n)

        def chain_train(args_, out):
            params, opt, _ = out
            return (params, args_[1], opt, args_[3])

        for name in ("train_a2_dit", "train_b_mllm"):
            out = run(name, lambda n=name: train(n), chain_train,
                      check=lambda o: bool(jnp.isfinite(o[2])))
            if out is not None and results[name]["status"] == "ok":
                q = tp.num_queries(cfg)
                if name == "train_a2_dit":
                    f = 3 * args.dit_train_batch * sum(cm.dit_forward_flops(cfg.dit, q).values())
                else:
                    f = 3 * args.mllm_train_batch * sum(cm.mistral_forward_flops(cfg.mllm, 1500).values())
                results[name]["flops"] = f
                results[name]["mfu"] = cm.mfu(f, results[name]["run_s"], peak)
                results[name]["loss"] = float(out[2])
                checks[f"{name} MFU < 100 %"] = results[name]["mfu"] < 1.0
                print(f"{name}: {results[name]['run_s']:.3f} s/step, MFU {100 * results[name]['mfu']:.1f} %, "
                      f"loss {results[name]['loss']:.4f}", flush=True)

    report = {"device": dev.device_kind, "platform": dev.platform, "jax": jax.__version__, "config": args.config,
              "peak_tflops": peak / 1e12, "pieces": results, "checks": checks,
              "wall_s": time.perf_counter() - t_start}
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=2)
    print("\n| piece | compile s | run s | MFU | status |\n|---|---:|---:|---:|---|")
    for k, v in results.items():
        if k == "turn":
            continue
        print(f"| {k} | {v.get('compile_s', float('nan')):.1f} | {v.get('run_s', float('nan')):.4f} | "
              f"{100 * v['mfu']:.1f} % | {v['status']} |" if "mfu" in v else
              f"| {k} | {v.get('compile_s', float('nan')):.1f} | {v.get('run_s', float('nan')):.4f} | | {v['status']} |")
    if turn is not None:
        print(f"| **game turn** | | {turn:.3f} | {100 * results['turn']['mfu']:.1f} % | s/turn |")
    failed = [k for k, v in checks.items() if not v]
    print(f"\nself-checks: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}; "
          f"wrote {os.path.join(args.out, 'gpu_check.json')}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
