"""Timing helpers every benchmark shares: medians, interleaved A B A B timing, the commit of a report.

Importing this module starts no JAX backend and imports no torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from animegamer_jax.io import paths


def git_commit() -> dict[str, Any]:
    """``{"commit": hash or "unknown", "dirty": bool or None}`` of the checkout, for report files."""
    head, dirty = paths.checkout_commit()
    return {"commit": head, "dirty": dirty}


def median(xs: list[float]) -> float:
    """The median of ``xs`` (the mean of the two middle values for an even count)."""
    return float(statistics.median(xs))


def time_calls(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn``, one after another."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` (warm it up first)."""
    return median(time_calls(fn, repeats))


def interleaved(fn_a: Callable[[], Any], fn_b: Callable[[], Any], rounds: int) -> tuple[list[float], list[float]]:
    """Times ``fn_a`` and ``fn_b`` alternately (A B A B ...), ``rounds`` calls each; seconds."""
    ta, tb = [], []
    for _ in range(rounds):
        for fn, out in ((fn_a, ta), (fn_b, tb)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return ta, tb
