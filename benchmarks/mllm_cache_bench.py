"""One MLLM turn with vs without the persistent KV cache (``python -m benchmarks mllm_cache``).

A = ``mllm.history_attention = "turn_window"``: inference/mllm_turn.py ``mllm_turn_cached`` on the game's
cache (the new tokens prefilled once for both passes, pass A's query block + 10 decode steps).
B = the default ``"window_recompute"``: inference/mllm_turn.py ``mllm_turn`` over the padded last-W-turn
window (pass B forward, then pass A's prefill of the same window + 10 decode steps).
Same weights, same game (``--turn`` turns played first through the cached path, so the window is
full), jitted, compiled apart, timed interleaved A B A B. Check: A's s_a against a full recompute
of the whole game with the same turn-window mask (``GameStateMLLM.__call__`` with ``turn_ids``).
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.config import load_config
from animegamer_jax.inference import mllm_turn
from animegamer_jax.inference.turn_inputs import (CachePlan, TurnKVCache, TurnRecord, WindowSpec,
                                                  build_cached_turn_input,
                                                  build_turn_input, encode_instruction, stack_cached_inputs,
                                                  stack_inputs)
from animegamer_jax.models.mistral.mllm import GameStateMLLM, turn_layout
from benchmarks.common import git_commit, interleaved, median

#: config overrides of configs/tiny.py per size (medium = the Mistral of ``python -m benchmarks compare``)
SIZES = {
    "tiny": [],
    "medium": ["mllm.hidden_size=512", "mllm.num_layers=8", "mllm.num_heads=8", "mllm.num_kv_heads=4",
               "mllm.head_dim=64", "mllm.intermediate_size=1536", "rep.num_text_tokens=30",
               "rep.num_image_tokens=196", "rep.dim=256"],
}
TEXT = "Character: Bunny; Motion: slowly walk out of the burrow number {k}; Background: day meadow."


def bench_size(size: str, config: str, turn: int, window: int, rounds: int) -> dict:
    """Times turn ``turn`` of one game at ``size``; returns the row (seconds, check, shapes)."""

    cfg = load_config(config, SIZES[size] + [f"mllm.history_window={window}", "mllm.history_attention=turn_window"])
    mllm = nnx.merge(*jax.jit(lambda: nnx.split(GameStateMLLM.from_config(cfg, rngs=nnx.Rngs(0))))())
    spec = WindowSpec.from_config(cfg)
    spec_b = WindowSpec(spec.window, spec.num_queries, spec.max_text, spec.readout, "own", "window_recompute")
    plan = CachePlan.from_spec(spec)
    g, st = nnx.split(mllm)
    cached = jax.jit(lambda s, c, b: mllm_turn.mllm_turn_cached(nnx.merge(g, s), c, b, plan, spec.readout)[:3])
    recompute = jax.jit(lambda s, b: mllm_turn.mllm_turn(nnx.merge(g, s), b, window))
    cache = TurnKVCache.init(mllm.cfg.llm, 1, plan)
    history, rng = [], np.random.default_rng(0)
    ids = [encode_instruction(TEXT.format(k=k), spec) for k in range(turn + 1)]
    t0 = time.perf_counter()
    for k in range(turn):  # play the game up to the timed turn
        b = jax.device_put(stack_cached_inputs([build_cached_turn_input(history, ids[k], spec, cfg.rep.dim, plan)]))
        states, rep, cache = cached(st, cache, b)
        history.append(TurnRecord(ids[k], tuple(int(v) for v in np.asarray(states)[0]),
                                  np.asarray(rep)[0] + rng.normal(size=rep.shape[1:]).astype(np.float32)))
    compile_a = time.perf_counter() - t0
    batch_a = jax.device_put(stack_cached_inputs([build_cached_turn_input(history, ids[turn], spec, cfg.rep.dim,
                                                                          plan)]))
    batch_b = jax.device_put(stack_inputs([build_turn_input(history, ids[turn], spec_b, cfg.rep.dim)]))
    t0 = time.perf_counter()
    jax.block_until_ready(recompute(st, batch_b))
    compile_b = time.perf_counter() - t0

    def fa():
        return jax.block_until_ready(cached(st, cache, batch_a))

    def fb():
        return jax.block_until_ready(recompute(st, batch_b))

    def gflop(fn, *args):
        ca = fn.lower(*args).compile().cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        return float(ca.get("flops", 0.0)) / 1e9

    flops = {"cached": gflop(cached, st, cache, batch_a), "recompute": gflop(recompute, st, batch_b)}
    fa(), fb()
    ta, tb = interleaved(fa, fb, rounds)
    # check: A's s_a equals pass B of a full recompute of the whole game with the same mask
    seq = turn_layout([list(i) for i in ids], [r.states for r in history], num_queries=spec.num_queries,
                      history_window=turn + 1)
    hist = jnp.asarray(np.stack([r.rep for r in history])[None])
    ref = nnx.jit(lambda m, i, gm, c, h, t: m(i, gen_mask=gm, cmp_mask=c, history_reps=h, turn_ids=t,
                                              return_logits=False).rep)(
        mllm, jnp.asarray(seq.input_ids[None]), jnp.asarray(seq.gen_mask[None]), jnp.asarray(seq.cmp_mask[None]),
        hist, jnp.asarray(seq.turn_ids[None]))
    diff = float(jnp.abs(ref - fa()[1]).max())
    m = cfg.mllm
    return {"size": size, "note": f"hidden {m.hidden_size}, {m.num_layers} layers, {m.num_heads}/{m.num_kv_heads} "
                                  f"heads, Q {spec.num_queries}, W {window}, turn {turn}; cached: {plan.new_tokens}+"
                                  f"{plan.block} new tokens over {plan.size} slots; recompute: 2 x {spec.seq_len}",
            "cached_s": ta, "recompute_s": tb, "cached_median_s": median(ta), "recompute_median_s": median(tb),
            "recompute_over_cached": median(tb) / median(ta), "check_max_abs_diff_vs_full_recompute": diff,
            "compiled_gflop": flops, "compile_s": {"cached_incl_warmup_turns": compile_a, "recompute": compile_b}}


def main(args) -> int:
    """Runs ``python -m benchmarks mllm_cache`` on parsed ``args``; returns the exit status (1: check failed)."""
    jax.config.update("jax_default_matmul_precision", "highest")
    backend, ndev = jax.default_backend(), jax.device_count()
    cores = len(os.sched_getaffinity(0))
    print(f"backend {backend}, {ndev} device(s), jax {jax.__version__}; process pinned to {cores} core(s)",
          flush=True)
    assert backend == args.backend, f"expected backend {args.backend}, got {backend}"
    assert ndev == 1, f"expected 1 JAX device, got {ndev}"
    rows = []
    for size in [s for s in args.sizes.split(",") if s]:
        if size not in SIZES:
            raise SystemExit(f"unknown size {size!r}; known: {sorted(SIZES)}")
        r = bench_size(size, args.config, args.turn, args.window, args.rounds)
        rows.append(r)
        print(f"{size}: cached {r['cached_median_s']:.4f} s, recompute {r['recompute_median_s']:.4f} s, "
              f"recompute/cached {r['recompute_over_cached']:.2f} (s_a vs full recompute "
              f"{r['check_max_abs_diff_vs_full_recompute']:.1e})", flush=True)
    print(f"\n{backend}, {cores} core(s), ABAB x {args.rounds} rounds, medians; "
          f"commit {git_commit()['commit'][:10]}\n")
    print("| size | shape | cached s | window recompute s | recompute/cached | GFLOP cached / recompute "
          "(compiled) | s_a vs full recompute |\n|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        f = r["compiled_gflop"]
        print(f"| {r['size']} | {r['note']} | {r['cached_median_s']:.4f} | {r['recompute_median_s']:.4f} | "
              f"{r['recompute_over_cached']:.2f} | {f['cached']:.2f} / {f['recompute']:.2f} | "
              f"{r['check_max_abs_diff_vs_full_recompute']:.1e} |")
    report = {**git_commit(), "backend": backend, "devices": ndev, "threads": cores, "jax": jax.__version__,
              "rounds": args.rounds, "config": args.config, "turn": args.turn, "window": args.window,
              "sizes": {r["size"]: SIZES[r["size"]] for r in rows}, "rows": rows, "load_average": os.getloadavg()}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"\nwrote {args.out} (load average {report['load_average'][0]:.1f})")
    ok = all(r["check_max_abs_diff_vs_full_recompute"] < 1e-3 for r in rows)
    if not ok:
        print("the cached turn disagrees with the full recompute (see the last column)")
    return 0 if ok else 1
