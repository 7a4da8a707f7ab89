"""Full-size ahead-of-time compile of one game turn and the (a2) / (b) train steps on 8 fake CPU devices.

    python benchmarks/aot_full_size.py                       # all pieces, paper config, 8 devices
    python benchmarks/aot_full_size.py --pieces dit_sampling,train_a2_dit --devices 8
    python -m benchmarks aot --pieces dit_sampling --turn_batch 1 --override 'mesh.shape=(2,1,1,4)'  # one game:
                                                  # CFG halves on data, the joint sequence on context
    python -m benchmarks aot --layout latency --one_device_flops   # play's default for one game on
                                                  # 8 devices (game/engine.py apply_layout) + FLOPs vs 1 device

Nothing is allocated: every parameter, optimizer moment, KV cache and input is a sharded
``jax.ShapeDtypeStruct`` (benchmarks/turn_pieces.py with ``abstract=True``); each piece is lowered
with ``jax.jit(...).lower`` under the config's mesh and logical rules and compiled by XLA:CPU for
the fake devices. ``compiled.memory_analysis()`` then gives the per-device bytes of arguments,
outputs, temporaries and aliased (donated) buffers; peak ~ arguments + outputs + temporaries -
aliased. XLA:CPU schedules differently from XLA:GPU/TPU, so temporaries are indicative (the
argument sizes, i.e. the sharded weights / moments / caches, are exact). In particular XLA:CPU has
no bf16 dot: it upcasts bf16 weights to f32, and while-loop-invariant code motion hoists those
converts out of the layer scan, i.e. one f32 copy of every stacked bf16 weight (2x the bf16 bytes)
sits in the temporaries. ``XLA_FLAGS=--xla_disable_hlo_passes=while-loop-invariant-code-motion``
keeps the convert per layer, closer to what a GPU/TPU (native bf16) compiles.

The turn runs ``data-parallel size`` games at once (one per device slice, as ``generate`` does);
train steps use ``train.global_batch_size``. Weights: inference bf16 with LoRA merged; training
with the config's param dtype (DiT fp32 masters, MLLM bf16) and LoRA.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

N_DEV = 8
for i, a in enumerate(sys.argv):
    if a == "--devices" and i + 1 < len(sys.argv):
        N_DEV = int(sys.argv[i + 1])
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={N_DEV}"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/animegamer_2b_7b.py")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--pieces", default="", help="comma-separated subset (default: all turn and train pieces)")
    ap.add_argument("--turn_batch", type=int, default=0, help="games per turn (default: data-parallel size)")
    ap.add_argument("--override", action="append", default=[],
                    help="config override, e.g. --override 'mesh.shape=(2,1,1,4)' (CFG 2 x context 4)")
    ap.add_argument("--layout", default="", choices=["", "batch", "latency"],
                    help="apply play's layout (game/engine.py apply_layout); latency implies --turn_batch 1")
    ap.add_argument("--one_device_flops", action="store_true",
                    help="also compile each piece on a 1-device mesh: per-device FLOPs x devices / 1-device "
                         "FLOPs, and one turn's per-device FLOPs vs total / devices (analytic stage weights)")
    args = ap.parse_args(argv)

    from animegamer_jax import parallel
    from animegamer_jax.config import load_config
    from benchmarks import turn_pieces as tp

    assert jax.device_count() == args.devices, f"expected {args.devices} fake devices, got {jax.device_count()}"
    cfg = load_config(args.config, args.override)
    if args.layout:
        from animegamer_jax.game.engine import apply_layout

        cfg = apply_layout(cfg, args.layout, args.devices)
    mesh = parallel.mesh_from_config(cfg)
    rules = parallel.rules_from_config(cfg)
    dp = parallel.data_parallel_size(mesh, rules)
    batch = args.turn_batch or (1 if args.layout == "latency" else dp)
    one_mesh = parallel.make_mesh((1,) * len(cfg.mesh.axes), tuple(cfg.mesh.axes), devices=jax.devices()[:1])
    b1 = tp.Builder(cfg, one_mesh, abstract=True) if args.one_device_flops else None
    if b1 is not None:
        b1.decode_devices = args.devices  # the same VAE tiling as the n-device program
    ratios = {}
    b = tp.Builder(cfg, mesh, abstract=True)
    names = [n for n in (args.pieces.split(",") if args.pieces else tp.TURN_PIECES + tp.TRAIN_PIECES) if n]
    print(f"mesh {dict(mesh.shape)} on {jax.device_count()} fake CPU devices; config {cfg.name}; turn batch {batch}, "
          f"train global batch {cfg.train.global_batch_size}", flush=True)
    rows = []
    for name in names:
        t0 = time.perf_counter()
        try:
            piece = (tp.make_turn_piece(cfg, b, name, batch=batch) if name in tp.TURN_PIECES
                     else tp.make_train_piece(cfg, b, name))
            lowered = tp.lower_piece(piece, b)
            t1 = time.perf_counter()
            compiled = lowered.compile()
            t2 = time.perf_counter()
            m = compiled.memory_analysis()
            arg, out, tmp, alias = (m.argument_size_in_bytes, m.output_size_in_bytes, m.temp_size_in_bytes,
                                    m.alias_size_in_bytes)
            peak = arg + out + tmp - alias
            total_args = tp.count_bytes(piece.args)
            ca = compiled.cost_analysis() or {}
            flops = float((ca[0] if isinstance(ca, list) else ca).get("flops", float("nan")))
            rows.append((name, piece.note, total_args, arg, out, tmp, alias, peak, t1 - t0, t2 - t1, "ok", flops))
            print(f"{name}: lower {t1 - t0:.1f} s, compile {t2 - t1:.1f} s, per-device peak {_gib(peak)} GiB "
                  f"(args {_gib(arg)}, temp {_gib(tmp)}), XLA per-device GFLOP {flops / 1e9:.1f}", flush=True)
            if b1 is not None:
                p1 = (tp.make_turn_piece(cfg, b1, name, batch=batch) if name in tp.TURN_PIECES
                      else tp.make_train_piece(cfg, b1, name))
                ca1 = tp.lower_piece(p1, b1).compile().cost_analysis() or {}
                f1 = float((ca1[0] if isinstance(ca1, list) else ca1).get("flops", float("nan")))
                ratios[name] = flops * args.devices / f1
                print(f"  {name}: 1-device GFLOP {f1 / 1e9:.1f}; per-device x {args.devices} / 1-device = "
                      f"{ratios[name]:.3f}", flush=True)
                b1.modules.clear()
        except Exception as e:  # report and continue with the other pieces
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:200]
            rows.append((name, "", 0, 0, 0, 0, 0, 0, time.perf_counter() - t0, 0.0, msg, float("nan")))
            print(f"{name}: FAILED {msg}", flush=True)
        b.modules.clear()
    print(f"\nXLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"\n| piece | what | all args GiB (global) | per-device args GiB | outputs | temps | aliased | "
          f"per-device peak GiB | XLA GFLOP/device* | lower s | compile s | status |\n"
          f"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {_gib(r[2])} | {_gib(r[3])} | {_gib(r[4])} | {_gib(r[5])} | {_gib(r[6])} | "
              f"**{_gib(r[7])}** | {r[11] / 1e9:.1f} | {r[8]:.1f} | {r[9]:.1f} | {r[10]} |")
    print("* compiled.cost_analysis(): XLA counts a while-loop body once (layer / step / tile scans), so this "
          "is per-device work of one iteration of each loop, comparable across meshes, not a total.")
    if ratios:
        _turn_flops_table(cfg, ratios, args.devices)
    return 0 if all(r[10] == "ok" for r in rows) else 1


def _turn_flops_table(cfg, ratios: dict, n: int) -> None:
    """One turn's per-device FLOPs on ``n`` devices vs total / n: each stage's analytic FLOPs
    (benchmarks/cost_model.py, batch 1, LoRA merged) times its piece's compiled ratio
    (per-device x n / 1-device, the loop bodies counted alike on both sides). Stages without a
    measured piece count as replicated (ratio n: every device does all of it)."""
    from benchmarks import cost_model as cm
    from benchmarks import turn_pieces as tp

    st = cm.turn_flops(cfg, lora=False)
    seq = tp.turn_length(cfg)
    prefill = cm._total(cm.mistral_forward_flops(dict(cfg.mllm, lora_rank=0), seq, logits_positions=1))
    parts = {"mllm_prefill": prefill, "mllm_decode": st["mllm_pass_a"] - prefill, "mllm_pass_b": st["mllm_pass_b"],
             "resamplers": st["resamplers"], "dit_sampling": st["dit"], "vae_decode": st["vae_decode"]}
    total = sum(parts.values())
    per_dev = 0.0
    print(f"\n| stage | analytic TFLOP (1 game) | share | compiled ratio (per-device x {n} / 1-device) |\n"
          f"|---|---:|---:|---:|")
    for k, v in parts.items():
        r = ratios.get(k, float(n))
        per_dev += v * r / n
        print(f"| {k} | {v / 1e12:.2f} | {100 * v / total:.2f} % | {r:.3f}{'' if k in ratios else ' (assumed)'} |")
    print(f"| **turn** | {total / 1e12:.2f} | 100 % | **{per_dev * n / total:.3f}** = per-device / (total / {n}) |")


if __name__ == "__main__":
    sys.exit(main())
