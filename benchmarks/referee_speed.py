"""Time the referee (eval/referee.py ``Referee.score_turn``) per turn on one core: the budget is 50 ms.

    python benchmarks/referee_speed.py [--turns 64] [--threads 1] [--out referee_speed.json]

The default world's plan (data/toy_world.py: K = 60, 6 backgrounds; no files written) at the toy
system's clip size (64x96, 17 frames): the seen split's first ``--turns`` turns as the engine renders
them (``Referee.truth_clip``, made before timing), each scored with pixels (PSNR / SSIM against the
engine's render, which the referee makes again) and without. The process is pinned to ``--threads``
cores and OpenCV / BLAS use that many threads; each variant runs once untimed (warm-up), then the two
are timed interleaved turn by turn. Prints the backend (numpy, OpenCV, threads), the medians and the
template bank's build time (once per world and clip size); writes the JSON with every time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="")
    a = p.parse_args()
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:a.threads]))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    import cv2
    import numpy as np

    from animegamer_jax.data import toy_motion, toy_sprites, toy_world
    from benchmarks.common import git_commit, median

    cv2.setNumThreads(a.threads)
    from animegamer_jax.eval import referee

    chars, held, held_pairs, _ = toy_world.plan_world()
    bgs = list(toy_sprites.BACKGROUNDS)[:6]
    games = toy_world.plan_games(chars, held, held_pairs, bgs, 2.0)
    manifest = {"size": list(toy_sprites.TOY_SIZE), "fps": toy_motion.TOY_FPS, "backgrounds": {b: b for b in bgs},
                "characters": [{**dataclasses.asdict(c), "heldout": c.name in held} for c in chars]}
    t0 = time.perf_counter()
    ref = referee.Referee(manifest, 64, 96)
    bank_s = time.perf_counter() - t0
    times = toy_motion.turn_times(2.0, 17, 8.0)
    turns = [(g["character"], t) for g in games["seen"] for t in g["turns"]][:a.turns]
    clips = [ref.truth_clip(t, c, times) for c, t in turns]
    for pixels in (True, False):  # warm-up
        ref.score_turn(clips[0], turns[0][1], turns[0][0], times, turns[0][1]["states"], pixels=pixels)
    timed = {"pixels": [], "no_pixels": []}
    ok = 0
    for (c, t), clip in zip(turns, clips):
        for key, pixels in (("pixels", True), ("no_pixels", False)):
            t0 = time.perf_counter()
            got = ref.score_turn(clip, t, c, times, t["states"], pixels=pixels)
            timed[key].append(time.perf_counter() - t0)
        ok += got["action_ok"] and got["character_ok"] and got["background_ok"]
    backend = f"numpy {np.__version__}, OpenCV {cv2.__version__}, {a.threads} thread(s), affinity {sorted(os.sched_getaffinity(0))}"
    print(f"backend: {backend}")
    print(f"template bank (K={len(chars)}, {referee.ANGLES} angles): {bank_s:.2f} s once")
    for key, vals in timed.items():
        print(f"score_turn {key}: median {1000 * median(vals):.1f} ms/turn over {len(vals)} turns "
              f"(max {1000 * max(vals):.1f}); budget 50 ms")
    print(f"read right (action, character, background): {ok}/{len(turns)}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"backend": backend, "bank_s": bank_s, "times_s": timed, "correct": ok, "turns": len(turns),
                       **git_commit()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
