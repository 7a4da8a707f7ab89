"""Compile one :class:`animegamer_jax.aot.programs.Program` and describe it: per-chip memory against the
chip's HBM, trip-count-aware FLOPs and bytes (:mod:`animegamer_jax.aot.hlo_cost`), its collectives priced on
the target's links, model FLOPs and MFU (train programs, :mod:`animegamer_jax.train.model_flops`), the
attention kernels its calls resolved to, and a roofline time.

Roofline (per chip, per run of the program): ``compute_s + exposed_comm_s`` with ``compute_s = max(FLOPs /
peak bf16 FLOP/s, bytes / HBM bandwidth)`` of the compiled per-chip HLO (every while loop multiplied by its
trip count) and the collectives' time that compute does not hide (:func:`price_collectives`).
MFU = model FLOPs per chip / (peak x roofline). :data:`ASSUMPTIONS` lists what it leaves out.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from typing import Any

from animegamer_jax.aot import hlo_cost, pieces
from animegamer_jax.aot import programs
from animegamer_jax.aot.programs import TURN_PROGRAMS, Program
from animegamer_jax.models import attention
from animegamer_jax.parallel.target import Chip
from animegamer_jax.train.model import AUTO_REMAT, with_remat

#: fraction of a chip's HBM a program may plan for ("fits")
FIT_FRACTION = 0.8
ASSUMPTIONS = (
    "roofline per chip = max(FLOPs / peak dense bf16 FLOP/s, bytes accessed / HBM bandwidth) + exposed "
    "communication (chip table: animegamer_jax/parallel/target.py CHIPS, with sources)",
    "FLOPs and bytes: the compiled per-chip HLO with every while loop (layer scans, sampling steps, decode "
    "chunks) multiplied by its trip count (animegamer_jax/aot/hlo_cost.py); XLA's own cost_analysis counts "
    "a loop body once",
    "matmuls and convolutions only (elementwise ops ignored); attention kernels (splash, cuDNN) priced as dense "
    "Q K^T / P V from their operand shapes (a causal kernel skips about half of that)",
    "communication: every collective of the compiled HLO priced as a ring on the links its device group spans "
    "(parallel/target.py LINKS, with sources): all-gather (n-1)/n x its result, reduce-scatter and all-to-all "
    "(n-1)/n x the operand, all-reduce 2 (n-1)/n x the operand, a permute its operand; TPU: per torus axis the "
    "group spans, the chip's ICI bandwidth / its ports (a ring on an axis uses its 2 links); GPU: half the "
    "NVLink figure (one direction); a group across slices / nodes: the per-chip DCN / InfiniBand figure",
    "overlap: collectives inside a loop body (the layer scan: FSDP all-gathers, gradient reduce-scatters) hide "
    "behind that body's compute (XLA's async collectives and latency-hiding scheduler), so a body exposes "
    "max(0, communication - compute); collectives outside loops are exposed in full; no host time",
    "model FLOPs (train programs): the loss's jaxpr, each matmul once (no remat recompute, no padding): forward "
    "+ backward of what trains and what passes gradients; frozen forwards computable once per example (T5, "
    "CLIP, the VAE encode) counted apart (train/model_flops.py)",
    "compiled FLOPs include remat recompute, frozen forwards and a TPU's padding of small convolutions and "
    "matmuls to its tiles; model / compiled FLOPs says how much of them the model needs",
    "fits = peak <= 80 % of the chip's HBM (GPU: jax preallocates 75 % unless XLA_PYTHON_CLIENT_MEM_FRACTION "
    "says otherwise; the figure is the device's memory)",
    "a turn = prefill + {steps} x decode (jump-forward: {k} tokens per step, aot/pieces.py decode_schedule) + "
    "pass B + DiT sampling loop + VAE decode, one game (latency layout) or one game per data-parallel slice "
    "(batch layout)".format(k=pieces.decode_schedule()[0], steps=pieces.decode_schedule()[1]),
)


@dataclasses.dataclass
class Row:
    """One compiled program. Sizes in bytes per chip; ``peak = arguments + outputs + temporaries -
    aliased``; times in seconds per run (``runs`` runs per step or turn)."""

    program: str
    kind: str
    note: str
    status: str = "ok"
    arguments: float = 0.0
    outputs: float = 0.0
    temporaries: float = 0.0
    aliased: float = 0.0
    peak: float = 0.0
    hbm_fraction: float | None = None
    flops: float = 0.0
    bytes_accessed: float = 0.0
    xla_flops: float | None = None
    unknown_trip_counts: int = 0
    roofline_s: float | None = None  # compute_s + exposed_comm_s
    compute_s: float | None = None  # max(FLOPs / peak, bytes / HBM bandwidth)
    comm_s: float | None = None  # every collective's time (None: the chip has no link figures)
    exposed_comm_s: float | None = None  # what compute does not hide (module docstring)
    collectives: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # op: [count, bytes, s]
    model_flops: float | None = None  # train programs: per chip per run (forward + backward)
    frozen_flops: float | None = None  # per chip per run: frozen forwards computable once per example
    mfu: float | None = None  # model_flops / (peak x roofline_s)
    runs: int = 1
    kernels: dict[str, int] = dataclasses.field(default_factory=dict)
    lower_s: float = 0.0
    compile_s: float = 0.0
    saved: str = ""
    layout: str = ""  # turn programs: "latency" or "batch"
    first_chunk: tuple[int, int] = (1, 1)  # vae_decode: (first chunk's, all) latent frames of play's plan

    @property
    def label(self) -> str:
        """``dit [batch]`` for turn programs, the phase name for train programs."""
        return f"{self.program} [{self.layout}]" if self.layout else self.program

    @property
    def fits(self) -> bool | None:
        return None if self.hbm_fraction is None else self.hbm_fraction <= FIT_FRACTION


def kernel_summary(calls: list[dict[str, Any]]) -> dict[str, int]:
    """``{"splash (TPU, mask expressible for splash) q (2, 6976, 30, 64)": traced calls}`` from
    :func:`animegamer_jax.models.attention.recording`."""
    return dict(Counter(f"{c['kernel']} ({c['why']}) q {c['q']} k {c['k']}" for c in calls))


def compile_program(prog: Program, chip: Chip | None, save: Any = None) -> Row:
    """Lowers (recording the attention kernels) and compiles ``prog``; never raises for the program's
    own failure (the row's ``status`` holds its first line). ``save(name, compiled) -> path`` writes
    the executable."""
    row = Row(prog.name, prog.kind, prog.note, runs=prog.runs, layout=prog.layout)
    t0 = time.perf_counter()
    try:
        with attention.recording() as calls:
            lowered = prog.lower()
        row.kernels = kernel_summary(calls)
        row.note = prog.note  # a turn program's lowering adds its piece's note
        t1 = time.perf_counter()
        compiled = lowered.compile(compiler_options=prog.compiler_options)
        row.lower_s, row.compile_s = t1 - t0, time.perf_counter() - t1
        row.first_chunk = tuple(getattr(prog, "first_chunk", (1, 1)))
    except Exception as e:  # the row says why; the other programs still compile
        row.status = f"FAILED {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        row.lower_s = time.perf_counter() - t0
        return row
    m = compiled.memory_analysis()
    row.arguments, row.outputs = float(m.argument_size_in_bytes), float(m.output_size_in_bytes)
    row.temporaries, row.aliased = float(m.temp_size_in_bytes), float(m.alias_size_in_bytes)
    row.peak = row.arguments + row.outputs + row.temporaries - row.aliased
    if chip is not None:
        row.hbm_fraction = row.peak / chip.hbm_bytes
    cost = hlo_cost.program_cost(compiled.as_text())
    row.flops, row.bytes_accessed, row.unknown_trip_counts = cost.flops, cost.bytes_accessed, cost.unknown_trip_counts
    try:
        ca = compiled.cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        row.xla_flops = float(ca["flops"]) if ca and ca.get("flops") is not None else None
    except Exception:  # XLA:GPU deviceless gives none
        row.xla_flops = None
    devices = list(prog.mesh.devices.flat) if getattr(prog, "mesh", None) is not None else []
    if chip is not None:
        row.compute_s = max(row.flops / chip.bf16_flops, row.bytes_accessed / chip.hbm_bytes_per_s)
        cols, loops = hlo_cost.collectives(compiled.as_text())
        row.collectives, row.comm_s, row.exposed_comm_s = price_collectives(cols, loops, chip, devices)
        row.roofline_s = row.compute_s + (row.exposed_comm_s or 0.0)
    if getattr(prog, "model_flops", None) is not None:
        mf = prog.model_flops()
        n = max(1, len(devices))
        row.model_flops, row.frozen_flops = mf.model / n, mf.frozen / n
        if chip is not None and row.roofline_s:
            row.mfu = row.model_flops / (chip.bf16_flops * row.roofline_s)
    if save is not None:
        row.saved = save(row.label.replace(" [", "_").rstrip("]"), compiled)
    return row


def compile_auto_remat(config: Any, phase: str, devices: list[Any], chip: Chip | None, save: Any = None,
                       say: Any = print, compile_fn: Any = None) -> Row:
    """``train.remat="auto"``: compiles ``phase``'s step with each policy of ``train.model.AUTO_REMAT`` and
    returns the row of the fastest (roofline step) whose peak fits FIT_FRACTION of ``chip``'s HBM; without
    a chip figure, the first that compiles; full remat (the last) when none fits. Its note names the
    choice and each policy's share of HBM and step. ``compile_fn(program, chip, save) -> Row`` defaults to
    :func:`compile_program`."""
    compile_fn = compile_fn or compile_program
    rows, tried = {}, []
    for policy in AUTO_REMAT:
        row = compile_fn(programs.train_program(with_remat(config, policy), phase, devices), chip, save)
        rows[policy] = row
        if row.status != "ok":
            tried.append(f"{policy}: {row.status}")
        else:
            share = f"{100 * row.hbm_fraction:.0f} % of HBM" if row.hbm_fraction is not None else "no HBM figure"
            step = f", {row.roofline_s * row.runs:.3f} s" if row.roofline_s is not None else ""
            tried.append(f"{policy}: {share}{step}")
        say(f"  {phase} remat {tried[-1]}")
        if row.status == "ok" and chip is None:
            break
    fitting = [p for p, r in rows.items() if r.status == "ok" and r.fits is not False]
    timed = [p for p in fitting if rows[p].roofline_s is not None]
    best = (min(timed, key=lambda p: rows[p].roofline_s * rows[p].runs) if timed else
            fitting[0] if fitting else AUTO_REMAT[-1])
    row = rows[best]
    row.note = f"{row.note}; remat auto -> {best} ({'; '.join(tried)})"
    return row


def link_bandwidth(group: tuple, chip: Chip, devices: list[Any]) -> float | None:
    """Bytes/s one device sends in a ring over ``group`` (partition ids into ``devices``, the program's
    device assignment): across slices / nodes the chip's network figure; within one, TPU: the ICI bandwidth
    / ports per torus axis the group spans (coordinates that differ), GPU: half the NVLink figure; None
    without figures."""
    devs = [devices[i] for i in group if i < len(devices)]
    domain = {getattr(d, "slice_index", 0) if getattr(d, "platform", "") == "tpu" else getattr(d, "process_index", 0)
              for d in devs}
    if len(domain) > 1:
        return chip.network_bytes_per_s
    if chip.fast_bytes_per_s is None:
        return None
    if chip.fast_ports:  # a torus: a bidirectional ring per axis the group spans
        coords = [tuple(getattr(d, "coords", ()) or ()) for d in devs]
        axes = sum(len({c[k] for c in coords}) > 1 for k in range(min(map(len, coords), default=0)))
        return chip.fast_bytes_per_s / chip.fast_ports * max(1, axes)
    return chip.fast_bytes_per_s / 2


#: bytes a device sends per byte of payload in a ring over n devices
_WIRE = {"all-gather": lambda n: (n - 1) / n, "reduce-scatter": lambda n: (n - 1) / n,
         "all-to-all": lambda n: (n - 1) / n, "ragged-all-to-all": lambda n: (n - 1) / n,
         "all-reduce": lambda n: 2 * (n - 1) / n, "collective-permute": lambda n: 1.0,
         "collective-broadcast": lambda n: 1.0}


def price_collectives(cols: list[hlo_cost.Collective], loops: dict, chip: Chip, devices: list[Any]
                      ) -> tuple[dict[str, list[float]], float | None, float | None]:
    """(``{op: [count, payload bytes, seconds]}`` per run of the program, total seconds, exposed seconds)
    of ``cols`` (:func:`animegamer_jax.aot.hlo_cost.collectives`) on ``chip``'s links (ASSUMPTIONS); the
    totals are None when a collective's links have no figure."""
    summary: dict[str, list[float]] = {}
    total, per_loop, exposed, priced = 0.0, {}, 0.0, True
    for c in cols:
        n = c.group_size
        # the slowest group sets the time (groups across slices / nodes beside groups within one)
        bws = [link_bandwidth(g, chip, devices) for g in c.groups if len(g) > 1] if n > 1 else [math.inf]
        bw = None if any(b is None for b in bws) else min(bws, default=math.inf)
        secs = 0.0 if n <= 1 else (c.payload * _WIRE.get(c.op, lambda n: 1.0)(n) / bw if bw else None)
        entry = summary.setdefault(c.op, [0, 0.0, 0.0])
        entry[0] += c.runs
        entry[1] += c.payload * c.runs
        if secs is None:
            priced = False
            continue
        entry[2] += secs * c.runs
        total += secs * c.runs
        if c.loop:
            per_loop[c.loop] = per_loop.get(c.loop, 0.0) + secs * c.runs / c.loop_runs
        else:
            exposed += secs * c.runs
    for name, comm in per_loop.items():
        runs, flops, nbytes = loops[name]
        body = max(flops / chip.bf16_flops, nbytes / chip.hbm_bytes_per_s)
        exposed += max(0.0, comm - body) * runs
    return summary, (total if priced else None), (exposed if priced else None)


def turn_estimate(rows: list[Row], layout: str = "latency") -> float | None:
    """Roofline seconds of one turn in ``layout`` (every turn program's time x its runs), or None unless
    all five compiled in that layout."""
    got = {r.program: r for r in rows if r.kind == "turn" and r.layout == layout and r.status == "ok"
           and r.roofline_s is not None and r.program in TURN_PROGRAMS}
    if set(got) != set(TURN_PROGRAMS):
        return None
    return sum(got[n].roofline_s * got[n].runs for n in TURN_PROGRAMS)


def turn_ttff(rows: list[Row], layout: str = "latency") -> tuple[float, str] | None:
    """Roofline seconds from a turn's start to its first decoded frames in ``layout``: the MLLM
    (prefill + decodes + pass B) + the DiT's sampling + the VAE's first chunk, and the label saying how
    the chunk was priced; None unless all five compiled. The VAE decode is compiled as one program
    (every chunk of play's plan in it), so its first chunk is estimated as the whole decode's time x
    (first chunk's latent frames / all latent frames)."""
    got = {r.program: r for r in rows if r.kind == "turn" and r.layout == layout and r.status == "ok"
           and r.roofline_s is not None and r.program in TURN_PROGRAMS}
    if set(got) != set(TURN_PROGRAMS):
        return None
    n, total = got["vae_decode"].first_chunk
    before = sum(got[p].roofline_s * got[p].runs for p in ("prefill", "decode", "pass_b", "dit"))
    label = (f"MLLM + DiT + first VAE chunk, estimated as the decode (one program) x {n}/{total} latent frames"
             if n < total else "MLLM + DiT + VAE decode (one chunk: the whole clip)")
    return before + got["vae_decode"].roofline_s * n / total, label


def turn_resident(rows: list[Row], layout: str = "latency") -> float | None:
    """Bytes per chip that one turn (in ``layout``) holds at its peak, or None unless all five stages
    compiled in that layout: play keeps
    every stage's arguments resident (the MLLM's weights and KV cache: the largest of prefill / decode /
    pass B; the DiT's; the VAE's) and runs one stage at a time, so the peak adds the largest stage's
    ``temporaries + outputs - aliased`` to them."""
    got = {r.program: r for r in rows if r.kind == "turn" and r.layout == layout and r.status == "ok"
           and r.program in TURN_PROGRAMS}
    if set(got) != set(TURN_PROGRAMS):
        return None
    args = max(got[n].arguments for n in ("prefill", "decode", "pass_b")) + got["dit"].arguments + \
        got["vae_decode"].arguments
    return args + max(r.temporaries + r.outputs - r.aliased for r in got.values())


def reference_added(rows: list[Row], layout: str = "latency") -> dict[str, float] | None:
    """What a turn naming a ``--character`` adds in ``layout``: ``dit_reference`` against ``dit``
    (roofline seconds per turn ``added_s``, FLOPs ``added_flops``, bytes accessed ``added_bytes``, peak
    bytes ``added_peak``, argument bytes ``added_arguments``: the adapter and the reference latent),
    plus ``encode_s`` (the ``reference_encode`` roofline, once per character per game) when it compiled;
    None unless both DiT programs compiled in that layout with a roofline."""
    got = {r.program: r for r in rows if r.kind == "turn" and r.layout == layout and r.status == "ok"
           and r.roofline_s is not None}
    if not {"dit", "dit_reference"} <= set(got):
        return None
    a, b = got["dit"], got["dit_reference"]
    out = {"added_s": b.roofline_s * b.runs - a.roofline_s * a.runs, "added_flops": b.flops - a.flops,
           "added_bytes": b.bytes_accessed - a.bytes_accessed, "added_peak": b.peak - a.peak,
           "added_arguments": b.arguments - a.arguments}
    if "reference_encode" in got:
        out["encode_s"] = got["reference_encode"].roofline_s
    return out


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def table(rows: list[Row], chip: Chip | None) -> str:
    """Markdown table of ``rows`` (GiB per chip; roofline in ms per run)."""
    hbm = f"{chip.name} HBM {_gib(chip.hbm_bytes)} GiB" if chip else "no HBM figure (CPU)"
    out = [f"| program | per-chip args | temps | outputs | aliased | **peak** GiB | % of {hbm} | TFLOP/chip "
           f"| GB accessed | roofline ms | x runs | status |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        pct = "-" if r.hbm_fraction is None else f"{100 * r.hbm_fraction:.0f} %{'' if r.fits else ' (over 80 %)'}"
        out.append(f"| {r.label} | {_gib(r.arguments)} | {_gib(r.temporaries)} | {_gib(r.outputs)} | "
                   f"{_gib(r.aliased)} | **{_gib(r.peak)}** | {pct} | {r.flops / 1e12:.3f} | "
                   f"{r.bytes_accessed / 1e9:.1f} | {_ms(r.roofline_s)} | {r.runs} | {r.status} |")
    return "\n".join(out)


def kernel_lines(rows: list[Row]) -> list[str]:
    """``program: kernel (why) q ... k ... x N`` lines (N = traced calls: a scanned layer traces once)."""
    lines = []
    for r in rows:
        for k, n in sorted(r.kernels.items()):
            lines.append(f"{r.label}: {k} x{n}")
    return lines


__all__ = ["ASSUMPTIONS", "FIT_FRACTION", "Row", "compile_auto_remat", "compile_program", "kernel_lines", "kernel_summary",
           "link_bandwidth", "price_collectives", "reference_added", "table", "turn_estimate", "turn_resident", "turn_ttff"]
