"""The ``student`` piece of the benchmark runner (``python -m benchmarks compare --pieces student``):
play's clip sampling with the few-step student next to the teacher's, both in JAX.

A = the student: ``diffusion.sampler = "student"``, ``--student_steps`` N (default 4) calls of the
distilled DiT (models/registry.py ``build_student``), one game per call, no CFG batch.
B = the teacher: ``diffusion.sampler`` of the config (DPM++ 2M) at ``--teacher_steps`` (default the
config's ``diffusion.student_grid_steps``, 50: the grid the student is distilled on and samples
from), CFG batch 2. Both are play's own program (animegamer_jax/aot/pieces.py ``dit_sampling`` =
inference/clip_sampler.py ``dit_sampler`` on ``prepare_for_inference`` weights) in play's latency layout
on one device, random weights, one game; compiled apart, then timed interleaved A B A B by the
runner. Check: both outputs finite, of the latent shape [1, T, C, h, w] (random weights: the two
clips are not expected to agree).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from animegamer_jax import parallel
from animegamer_jax.aot import pieces
from animegamer_jax.inference.layout import apply_layout


def _compiled_sampling(cfg) -> tuple:
    """(call, compile seconds, note) of play's ``dit_sampling`` for one game of ``cfg`` on one device."""
    lay = apply_layout(cfg, "latency", 1)
    mesh = parallel.mesh_from_config(lay, devices=jax.devices()[:1])
    b = pieces.Builder(lay, mesh, abstract=False)
    piece = pieces.make_turn_piece(lay, b, "dit_sampling", batch=1)
    t0 = time.perf_counter()
    compiled = pieces.lower_piece(piece, b).compile()
    compile_s = time.perf_counter() - t0
    return (lambda: jax.block_until_ready(compiled(*piece.args))), compile_s, piece.note


def bench_student(cfg, student_steps: int = 4, teacher_steps: int = 0) -> dict:
    """Builds and compiles both samplers of ``cfg`` (module docstring).

    Args:
      cfg: the config (a teacher sampler in ``diffusion.sampler``).
      student_steps: N of the student (1, 2, 4 or 8 in the paper config's table).
      teacher_steps: the teacher's steps (0: ``diffusion.student_grid_steps``).

    Returns:
      ``{"fns": (student, teacher), "compile_s": {"student", "teacher"}, "notes": {...},
      "check": "finite, shape [1, T, C, h, w]: True/False", "ok": bool}``.
    """
    t_steps = int(teacher_steps or cfg.diffusion.get("student_grid_steps", 50))
    teacher_cfg = cfg.copy_and_resolve_references()
    teacher_cfg.diffusion.num_sampling_steps = t_steps
    student_cfg = cfg.copy_and_resolve_references()
    student_cfg.diffusion.sampler = "student"
    student_cfg.diffusion.num_sampling_steps = int(student_steps)
    fs, cs, ns = _compiled_sampling(student_cfg)
    ft, ct, nt = _compiled_sampling(teacher_cfg)
    want = (1, int(cfg.dit.num_latent_frames), int(cfg.dit.in_channels), int(cfg.dit.sample_height),
            int(cfg.dit.sample_width))
    outs = [np.asarray(f()) for f in (fs, ft)]  # the first run of each (warm-up)
    ok = all(o.shape == want and np.isfinite(o).all() for o in outs)
    return {"fns": (fs, ft), "compile_s": {"student": cs, "teacher": ct}, "notes": {"student": ns, "teacher": nt},
            "check": f"finite, shape {list(want)}: {ok}", "ok": ok}


__all__ = ["bench_student"]
