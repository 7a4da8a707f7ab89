"""Times play's own game turns at full size (random weights) and a few train steps on one accelerator; MFU.

    python benchmarks/gpu_bench.py --out gpu_check_out             # paper size, on a GPU (called by gpu_check.sh)
    python benchmarks/gpu_bench.py --config configs/tiny.py --allow_cpu --out /tmp/gb   # dry run of the logic

Turn: exactly the program ``play`` runs: ``build_random_system`` (what ``play --demo`` plays when no
checkpoint exists: the real networks, randomly initialised, weights prepared once by
``inference.turn_model.RealTurnModel``: LoRA merged, cast), the latency layout on one device
(``inference.layout.apply_layout``), ``GameEngine.play`` of ``--turns`` turns of data/games/bunny.txt
with play's ``setup_jax``. The engine times each stage (MLLM, DiT sampling, VAE) apart from JAX's
compile events; s/turn is the median over the turns after the first (the first compiles). MFU =
analytic FLOPs of one turn (benchmarks/cost_model.py, LoRA merged) / (s/turn x peak).
Train: the train command's own steps of phases a2 and b as the compile tool builds them
(``aot.programs.train_program``: ``train.model.phase_trainer``, the config's optimizer and remat) with
precomputed T5 / CLIP features and latents in the batch (the frozen encoders out of the step), at a
per-device batch that fits one chip, on random arrays of the phase's batch shapes
(``data.batches.BatchKind.spec``), compiled once, run ``--repeats`` times, if the time budget allows.
MFU = the step's model FLOPs (``train.model_flops``, counted on its jaxpr) / (s/step x peak).

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

from animegamer_jax import parallel  # noqa: E402
from animegamer_jax.aot import programs  # noqa: E402
from animegamer_jax.config import load_config  # noqa: E402
from animegamer_jax.game.engine import GameEngine  # noqa: E402
from animegamer_jax.inference.layout import apply_layout, setup_jax  # noqa: E402
from animegamer_jax.game.loading import build_random_system  # noqa: E402
from animegamer_jax.game.script import load_script  # noqa: E402
from animegamer_jax.inference.instructions import Game  # noqa: E402
from animegamer_jax.inference.mode import apply_mode  # noqa: E402
from animegamer_jax.parallel import target  # noqa: E402
from benchmarks import cost_model  # noqa: E402
from benchmarks.common import median  # noqa: E402


def _finite(tree) -> bool:
    ok = True
    for x in jax.tree.leaves(tree):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
            ok &= bool(jnp.all(jnp.isfinite(x.astype(jnp.float32))))
    return ok


def random_batch(abstract: dict, seed: int = 0) -> dict:
    """Host arrays of an abstract batch's shapes (``aot.programs.abstract_batch``): floats uniform in
    [-1, 1], integers 0 (valid token ids and turn indices), booleans True, uint8 uniform."""
    rng = np.random.default_rng(seed)

    def fill(x):
        dt = np.dtype(x.dtype)
        if dt == np.bool_:
            return np.ones(x.shape, dt)
        if dt == np.uint8:
            return rng.integers(0, 256, x.shape, dtype=np.uint8)
        if np.issubdtype(dt, np.integer):
            return np.zeros(x.shape, dt)
        return rng.uniform(-1.0, 1.0, x.shape).astype(dt)

    return {k: fill(v) for k, v in abstract.items()}


def time_train_step(prog, repeats: int):
    """(compile_s, run_s median, metrics of the last step) of a train program
    (``aot.programs.train_program``) on a fresh train state and a random batch; the donated state
    chains from step to step as in training."""
    tr = prog.trainer
    t0 = time.perf_counter()
    compiled = prog.lower().compile(compiler_options=prog.compiler_options)  # as the train command compiles
    compile_s = time.perf_counter() - t0
    state, batch = tr.init(), tr.put_batch(random_batch(prog.batch))
    step = jax.device_put(jnp.asarray(0, jnp.int32), tr.replicated)
    state, metrics = jax.block_until_ready(compiled(state, batch, step))  # warm-up run
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, metrics = jax.block_until_ready(compiled(state, batch, step))
        times.append(time.perf_counter() - t0)
    return compile_s, median(times), metrics


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/animegamer_2b_7b.py")
    ap.add_argument("--out", default="gpu_check_out")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget_s", type=float, default=480.0, help="stop starting new pieces after this")
    ap.add_argument("--chip", default="", help="peak table key (default from the device kind)")
    ap.add_argument("--peak_tflops", type=float, default=0.0)
    ap.add_argument("--dit_train_batch", type=int, default=2, help="phase a2's batch")
    ap.add_argument("--mllm_train_batch", type=int, default=1, help="phase b's batch")
    ap.add_argument("--skip_train", action="store_true")
    ap.add_argument("--turns", type=int, default=3, help="turns of play's game to time (the first compiles)")
    ap.add_argument("--allow_cpu", action="store_true")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)

    dev = jax.devices()[0]
    checks: dict[str, bool] = {"gpu backend": dev.platform == "gpu" or args.allow_cpu}
    kind = dev.device_kind.lower()
    found = target.chip_of(kind)
    chip = args.chip or (("tpu-" if found.name.startswith("v") else "") + found.name if found else "h100")
    peak = (args.peak_tflops or cost_model.PEAK_TFLOPS[chip]) * 1e12
    print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}; peak {peak / 1e12:.0f} TFLOP/s "
          f"({'--peak_tflops' if args.peak_tflops else chip})", flush=True)
    cfg = load_config(args.config, ["mesh.shape=(1,1,1,1)"])
    results: dict[str, dict] = {}

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_start)

    def run_train(phase: str, batch: int) -> None:
        """Times ``phase``'s train step at global batch ``batch`` on the first device."""
        name = f"train_{phase}"
        if left() < 30:
            results[name] = {"status": f"skipped: time budget ({args.budget_s:.0f} s) used"}
            print(f"{name}: skipped (time budget)", flush=True)
            return
        try:
            tcfg = load_config(args.config, ["mesh.shape=(1,1,1,1)", f"train.global_batch_size={batch}",
                                             "train.grad_accum_steps=1", "train.precomputed_features=True",
                                             "train.encode_latents=False"])
            prog = programs.train_program(tcfg, phase, jax.devices()[:1])
            c, r, metrics = time_train_step(prog, args.repeats)
            ok = _finite(metrics)
            flops = prog.model_flops().model
            res = {"status": "ok" if ok else "FAILED check", "compile_s": c, "run_s": r, "note": prog.note,
                   "flops": flops, "mfu": cost_model.mfu(flops, r, peak), "loss": float(metrics["loss"])}
            results[name] = res
            checks[f"{name} finite"] = ok
            checks[f"{name} MFU < 100 %"] = res["mfu"] < 1.0
            print(f"{name}: compile {c:.1f} s, {r:.3f} s/step, MFU {100 * res['mfu']:.1f} %, loss {res['loss']:.4f} "
                  f"({prog.note}){'' if ok else '  CHECK FAILED'}", flush=True)
        except Exception as e:  # a failing step is reported, the others still run
            results[name] = {"status": f"error: {type(e).__name__}: {e}"[:400]}
            checks[f"{name} ran"] = False
            traceback.print_exc()

    def play_turns():
        # play's program: setup_jax, the demo's random system, the latency layout, GameEngine.play
        setup_jax()
        pcfg = apply_layout(cfg, "latency", 1)
        pmesh = parallel.mesh_from_config(pcfg, devices=jax.devices()[:1])
        t0 = time.perf_counter()
        system = build_random_system(apply_mode(pcfg), seed=0)
        engine = GameEngine(pcfg, system, mesh=pmesh, latency=True)
        init_s = time.perf_counter() - t0
        script = load_script("data/games/bunny.txt")
        turns = (list(script.turns) * args.turns)[: args.turns]
        result = engine.play([Game("gpu_check", tuple(turns), 0)])[0]
        return engine, result, init_s

    if left() < 60:
        results["turn"] = {"status": f"skipped: time budget ({args.budget_s:.0f} s) used"}
    else:
        try:
            engine, result, init_s = play_turns()
            tm = result["timings"]
            per_turn = [t["mllm_s"] + t["sampling_s"] + t["vae_s"] for t in tm]
            later = per_turn[1:] or per_turn
            turn = float(np.median(later))
            stages = {k: float(np.median([t[f"{k}_s"] for t in (tm[1:] or tm)])) for k in ("mllm", "sampling", "vae")}
            frames = [tr.frames for tr in result["turns"]]
            want = (1 + 4 * (cfg.dit.num_latent_frames - 1), cfg.data.height, cfg.data.width, 3)
            ok = all(f.shape == want and np.isfinite(f).all() for f in frames)
            checks["turn frames finite/shape"] = ok
            flops = cost_model.turn_flops(cfg, lora=False)
            turn_mfu = cost_model.mfu(sum(flops.values()), turn, peak)
            checks["turn MFU < 100 %"] = turn_mfu < 1.0
            results["turn"] = {"status": "ok" if ok else "FAILED check", "s_per_turn": turn, "turns": per_turn,
                               "stages_s": stages, "compile_s": result["compile_s"], "init_s": init_s,
                               "flops": sum(flops.values()), "mfu": turn_mfu,
                               "dit_mfu": cost_model.mfu(flops["dit"], stages["sampling"], peak),
                               "system": engine.model.label, "paper_s_per_turn": 24.0}
            print(f"play's turn ({len(per_turn)} turns, weights init {init_s:.1f} s, compile "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in result["compile_s"].items()) + "): "
                  + ", ".join(f"{k} {v:.3f} s" for k, v in stages.items())
                  + f"; {turn:.2f} s/turn, MFU {100 * turn_mfu:.1f} % (DiT sampling alone "
                  f"{100 * results['turn']['dit_mfu']:.1f} %); paper 24 s/turn (hardware not stated)", flush=True)
            del engine, result
        except Exception as e:  # reported; the train steps still run
            results["turn"] = {"status": f"error: {type(e).__name__}: {e}"[:400]}
            checks["turn ran"] = False
            traceback.print_exc()
    turn = results["turn"].get("s_per_turn")

    if not args.skip_train:
        run_train("a2", args.dit_train_batch)
        run_train("b", args.mllm_train_batch)

    report = {"device": dev.device_kind, "platform": dev.platform, "jax": jax.__version__, "config": args.config,
              "peak_tflops": peak / 1e12, "pieces": results, "checks": checks,
              "wall_s": time.perf_counter() - t_start}
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=2)
    print("\n| piece | compile s | run s | MFU | status |\n|---|---:|---:|---:|---|")
    for k, v in results.items():
        if k == "turn":
            continue
        mfu = f"{100 * v['mfu']:.1f} %" if "mfu" in v else ""
        print(f"| {k} | {v.get('compile_s', float('nan')):.1f} | {v.get('run_s', float('nan')):.4f} | {mfu} | "
              f"{v['status']} |")
    if turn is not None:
        comp = sum(results["turn"]["compile_s"].values())
        print(f"| **play's game turn** | {comp:.1f} | {turn:.3f} | {100 * results['turn']['mfu']:.1f} % | "
              f"{results['turn']['status']} (s/turn) |")
    failed = [k for k, v in checks.items() if not v]
    print(f"\nself-checks: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}; "
          f"wrote {os.path.join(args.out, 'gpu_check.json')}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
