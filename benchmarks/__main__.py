"""The benchmark runner: JAX vs the PyTorch references side by side, reproducibly.

    python -m benchmarks compare [--sizes tiny,medium] [--pieces dit,attention,vae,mistral_prefill,mistral_generate]
                                 [--rounds 7] [--threads 2] [--out compare_torch.json]
    python -m benchmarks compare --pieces student [--student_steps 4] [--teacher_steps 50]
                                 # play's few-step student sampling vs the teacher's, both JAX
    python -m benchmarks mllm_cache [--sizes tiny,medium] [--turn 5] [--window 3] [--rounds 7] [--threads 2]
                                    [--out mllm_cache.json]  # one MLLM turn, persistent cache vs window recompute

``compare`` follows the project's rule for side-by-side figures (GUIDE "Speed and memory"):

* one process, the same weights on both sides (torch model -> our converters -> JAX model);
* equal thread counts: the process is pinned to ``--threads`` cores before JAX starts (XLA:CPU
  sizes its thread pool from the affinity mask) and ``torch.set_num_threads(--threads)``; both are
  printed and asserted;
* the backend and device count are printed and asserted (CPU, 1 device);
* both sides are compiled / warmed up first (compile time reported apart), then timed interleaved
  A B A B ... for ``--rounds`` rounds; the table gives medians and torch/JAX (> 1: JAX faster);
* outputs are checked to agree (max |difference| or equal tokens) and the check is in the table;
* a JSON file with every round's times, the sizes, the versions and the git commit is written.

The ``student`` piece (benchmarks/student_bench.py) is JAX against JAX under the same rules: play's
clip sampling with the distilled student (``--student_steps`` N calls, no CFG batch) against the
teacher's (``--teacher_steps``, default the config's ``diffusion.student_grid_steps`` = 50, x CFG
batch 2) at the DiT sizes of ``dit``; its rows have their own table (student s, teacher s,
teacher/student) and the check is that both clips are finite and of the latent shape.

Sizes (``SIZES``): ``tiny`` = configs/tiny.py; ``medium`` = DiT 4 layers x 4 heads x 64, batch 2
(CFG), 3 x 32 x 32 latents = 768 video + 226 text tokens; VAE block channels (32, 32, 32, 64),
5 x 16 x 16 latents -> 17 x 128 x 128; Mistral hidden 512, 8 layers, 8 heads / 4 KV heads,
prefill 512 tokens, 32-token greedy generate. Full size does not fit this comparison on CPU; its
compiled memory and FLOPs come from ``aot`` (nothing allocated).
"""

from __future__ import annotations

import os
import sys


def _early_threads(argv: list[str]) -> int:
    n = 2
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            n = int(argv[i + 1])
        elif a.startswith("--threads="):
            n = int(a.split("=", 1)[1])
    return n


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in ("compare", "mllm_cache"):
    # Must happen before jax / torch start their thread pools.
    _n = _early_threads(sys.argv)
    _cpus = sorted(os.sched_getaffinity(0))
    if len(_cpus) < _n:
        sys.exit(f"--threads {_n} needs {_n} schedulable cores, this process has {len(_cpus)}")
    os.sched_setaffinity(0, set(_cpus[:_n]))
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["OMP_NUM_THREADS"] = str(_n)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from animegamer_jax.aot.pieces import turn_length  # noqa: E402
from animegamer_jax.config import load_config  # noqa: E402
from benchmarks import mllm_cache_bench, student_bench  # noqa: E402
from benchmarks.common import git_commit, interleaved, median  # noqa: E402

PIECES = ("dit", "attention", "vae", "mistral_prefill", "mistral_generate", "student")

#: per size: config overrides of configs/tiny.py for each piece, and the Mistral prompt / new tokens
SIZES = {
    "tiny": {"dit": [], "vae": [], "mistral": [], "prompt": None, "new_tokens": None},
    "medium": {
        "dit": ["dit.num_layers=4", "dit.num_heads=4", "dit.head_dim=64", "dit.hidden_size=256",
                "dit.time_embed_dim=128", "dit.in_channels=16", "dit.out_channels=16", "dit.num_latent_frames=3",
                "dit.sample_height=32", "dit.sample_width=32", "rep.num_text_tokens=30", "rep.num_image_tokens=196"],
        "vae": ["vae.block_out_channels=(32,32,32,64)", "vae.latent_channels=16", "dit.num_latent_frames=5",
                "dit.sample_height=16", "dit.sample_width=16"],
        "mistral": ["mllm.hidden_size=512", "mllm.num_layers=8", "mllm.num_heads=8", "mllm.num_kv_heads=4",
                    "mllm.head_dim=64", "mllm.intermediate_size=1536"],
        "prompt": 512, "new_tokens": 32,
    },
}


def compare(args) -> int:
    """Runs ``python -m benchmarks compare`` on parsed ``args``; returns the exit status (1: outputs disagree)."""
    import torch  # optional

    from benchmarks import compare_torch  # optional: imports torch, diffusers and transformers

    jax.config.update("jax_default_matmul_precision", "highest")
    torch.set_num_threads(args.threads)
    backend, ndev = jax.default_backend(), jax.device_count()
    cores = len(os.sched_getaffinity(0))
    print(f"backend {backend}, {ndev} device(s), jax {jax.__version__}; torch {torch.__version__}; "
          f"process pinned to {cores} core(s) (XLA:CPU pool), torch {torch.get_num_threads()} thread(s)", flush=True)
    assert backend == "cpu", f"compare runs on CPU against torch CPU, JAX backend is {backend}"
    assert ndev == 1, f"expected 1 JAX device, got {ndev} (unset --xla_force_host_platform_device_count)"
    assert cores == args.threads == torch.get_num_threads(), "thread counts differ"

    sizes = [s for s in args.sizes.split(",") if s]
    pieces = [p for p in args.pieces.split(",") if p]
    for s in sizes:
        if s not in SIZES:
            raise SystemExit(f"unknown size {s!r}; known: {sorted(SIZES)}")
    for p in pieces:
        if p not in PIECES:
            raise SystemExit(f"unknown piece {p!r}; known: {PIECES}")
    rows = []
    tmp = tempfile.mkdtemp(prefix="bench_compare_")

    def write(partial: bool) -> dict:
        report = {**git_commit(), "backend": backend, "devices": ndev, "threads": args.threads,
                  "jax": jax.__version__, "torch": torch.__version__, "rounds": args.rounds, "config": args.config,
                  "sizes": {s: SIZES[s] for s in sizes}, "rows": rows, "load_average": os.getloadavg(),
                  "partial": partial}
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        return report

    for size in sizes:
        spec = SIZES[size]

        def add(piece, note, fns, check, compile_s=None):
            fa, fb = fns
            fa(), fb()  # one more warm-up each right before timing
            ta, tb = interleaved(fa, fb, args.rounds)
            row = {"size": size, "piece": piece, "note": note, "jax_s": ta, "torch_s": tb,
                   "jax_median_s": median(ta), "torch_median_s": median(tb),
                   "torch_over_jax": median(tb) / median(ta), "check": check, "jax_compile_s": compile_s}
            rows.append(row)
            write(partial=True)  # a later failure keeps the rows measured so far
            print(f"{size} {piece}: JAX {row['jax_median_s']:.4f} s, torch {row['torch_median_s']:.4f} s, "
                  f"torch/JAX {row['torch_over_jax']:.2f} ({check})", flush=True)

        if "dit" in pieces:
            cfg = load_config(args.config, spec["dit"])
            r = compare_torch.bench_dit(cfg, 1, tmp)
            d = cfg.dit
            vid = d.num_latent_frames * (d.sample_height // d.patch_size) * (d.sample_width // d.patch_size)
            q = cfg.rep.num_text_tokens + cfg.rep.num_image_tokens
            add("DiT forward", f"{d.num_layers} layers, {d.num_heads}x{d.head_dim} heads, batch 2, {vid} video + {q} "
                f"text tokens", r["fns"], f"max abs diff {r['max_abs_diff']:.1e}", r["compile_s"])
        if "attention" in pieces:
            cfg = load_config(args.config, spec["dit"])
            d = cfg.dit
            l = (d.num_latent_frames * (d.sample_height // d.patch_size) * (d.sample_width // d.patch_size)
                 + cfg.rep.num_text_tokens + cfg.rep.num_image_tokens)
            r = compare_torch.bench_attention(2, l, d.num_heads, d.num_heads, d.head_dim, False, 3)
            var = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in r["variants"].items())
            add("attention (DiT)", f"batch 2, {l} tokens, {d.num_heads}x{d.head_dim} heads; auto -> {r['chosen']} "
                f"(JAX kernels: {var})", r["fns"], f"max abs diff {r['max_abs_diff']:.1e}")
            cfg = load_config(args.config, spec["mistral"])
            m = cfg.mllm
            l = spec["prompt"] or turn_length(cfg)
            r = compare_torch.bench_attention(1, l, m.num_heads, m.num_kv_heads, m.head_dim, True, 3)
            var = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in r["variants"].items())
            add("attention (Mistral prefill)", f"batch 1, {l} tokens causal, {m.num_heads}/{m.num_kv_heads}x"
                f"{m.head_dim} heads; auto -> {r['chosen']} (JAX kernels: {var})", r["fns"],
                f"max abs diff {r['max_abs_diff']:.1e}")
        if "vae" in pieces:
            cfg = load_config(args.config, spec["vae"])
            r = compare_torch.bench_vae(cfg, 1, tmp)
            add("VAE decode", f"channels {tuple(cfg.vae.block_out_channels)}, latents {cfg.dit.num_latent_frames}x"
                f"{cfg.dit.sample_height}x{cfg.dit.sample_width}", r["fns"], f"max abs diff {r['max_abs_diff']:.1e}",
                r["compile_s"])
        if "mistral_prefill" in pieces or "mistral_generate" in pieces:
            cfg = load_config(args.config, spec["mistral"])
            prompt = spec["prompt"] or turn_length(cfg)
            new = spec["new_tokens"] or int(cfg.mllm.max_new_tokens)
            r = compare_torch.bench_mistral(cfg, 1, tmp, prompt, new)
            m = cfg.mllm
            note = f"hidden {m.hidden_size}, {m.num_layers} layers, {m.num_heads}/{m.num_kv_heads} heads"
            if "mistral_prefill" in pieces:
                hj = np.asarray(r["pass_b"][0]())
                ht = r["pass_b"][1]().numpy()
                add("Mistral prefill", f"{note}, {prompt} tokens", r["pass_b"],
                    f"max abs diff {float(np.abs(hj - ht).max()):.1e}")
            if "mistral_generate" in pieces:
                add("Mistral greedy generate", f"{note}, prompt {prompt} + {new} tokens (KV cache)", r["fns"],
                    f"tokens equal: {r['tokens_equal']}", r["compile_s"])
        if "student" in pieces:
            cfg = load_config(args.config, spec["dit"])
            r = student_bench.bench_student(cfg, args.student_steps, args.teacher_steps)
            fs, ft = r["fns"]
            fs(), ft()  # one more warm-up each right before timing
            ts, tt = interleaved(fs, ft, args.rounds)
            row = {"size": size, "piece": "student sampling", "note": f"student: {r['notes']['student']}; "
                   f"teacher: {r['notes']['teacher']}", "student_s": ts, "teacher_s": tt,
                   "student_median_s": median(ts), "teacher_median_s": median(tt),
                   "teacher_over_student": median(tt) / median(ts), "check": r["check"], "ok": r["ok"],
                   "compile_s": r["compile_s"]}
            rows.append(row)
            write(partial=True)
            print(f"{size} student sampling: student {row['student_median_s']:.4f} s, teacher "
                  f"{row['teacher_median_s']:.4f} s, teacher/student {row['teacher_over_student']:.2f} "
                  f"({r['check']})", flush=True)

    print(f"\nCPU, {args.threads} thread(s) each side, ABAB x {args.rounds} rounds, medians; commit "
          f"{git_commit()['commit'][:10]}\n")
    torch_rows = [r for r in rows if "jax_s" in r]
    student_rows = [r for r in rows if "student_s" in r]
    if torch_rows:
        print("| size | piece | shape | JAX s | torch s | torch/JAX | check |\n|---|---|---|---:|---:|---:|---|")
    for r in torch_rows:
        print(f"| {r['size']} | {r['piece']} | {r['note']} | {r['jax_median_s']:.4f} | {r['torch_median_s']:.4f} | "
              f"{r['torch_over_jax']:.2f} | {r['check']} |")
    if student_rows:
        print(("\n" if torch_rows else "") + "| size | piece | samplers | student s | teacher s | teacher/student | "
              "check |\n"
              "|---|---|---|---:|---:|---:|---|")
    for r in student_rows:
        print(f"| {r['size']} | {r['piece']} | {r['note']} | {r['student_median_s']:.4f} | "
              f"{r['teacher_median_s']:.4f} | {r['teacher_over_student']:.2f} | {r['check']} |")
    report = write(partial=False)
    print(f"\nwrote {args.out} (load average {report['load_average'][0]:.1f})")
    ok = all(r["ok"] if "student_s" in r else
             ("tokens equal: True" in r["check"]) or ("diff" in r["check"] and float(r["check"].split()[-1]) < 1e-3)
             for r in rows)
    if not ok:
        print("outputs disagree (see the check column)")
    return 0 if ok else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("compare", "mllm_cache"):
        print(__doc__)
        return 2
    if argv[0] == "mllm_cache":
        ap = argparse.ArgumentParser(prog="python -m benchmarks mllm_cache", description=mllm_cache_bench.__doc__)
        ap.add_argument("--config", default="configs/tiny.py", help="base config the sizes override")
        ap.add_argument("--sizes", default="tiny,medium")
        ap.add_argument("--turn", type=int, default=5, help="the timed turn (0-based); earlier turns fill the cache")
        ap.add_argument("--window", type=int, default=3, help="W, mllm.history_window")
        ap.add_argument("--rounds", type=int, default=7)
        ap.add_argument("--threads", type=int, default=2, help="cores the process is pinned to (before JAX starts)")
        ap.add_argument("--backend", default="cpu", help="asserted JAX backend")
        ap.add_argument("--out", default="mllm_cache.json")
        return mllm_cache_bench.main(ap.parse_args(argv[1:]))
    ap = argparse.ArgumentParser(prog="python -m benchmarks compare", description="JAX vs torch, ABAB, CPU")
    ap.add_argument("--config", default="configs/tiny.py", help="base config the sizes override")
    ap.add_argument("--sizes", default="tiny,medium")
    ap.add_argument("--pieces", default=",".join(PIECES))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--student_steps", type=int, default=4, help="student piece: the student's steps N")
    ap.add_argument("--teacher_steps", type=int, default=0,
                    help="student piece: the teacher's steps (0: the config's diffusion.student_grid_steps)")
    ap.add_argument("--out", default="compare_torch.json")
    return compare(ap.parse_args(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
