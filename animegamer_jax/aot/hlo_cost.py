"""Trip-count-aware FLOP and byte totals read from optimized HLO text.

XLA's ``compiled.cost_analysis()`` prices a ``while`` loop as one pass of its body and condition
(``HloCostAnalysis::HandleWhile``), so programs built on ``lax.scan`` / ``fori_loop`` (layer scans,
sampling-step loops, tile scans) are undercounted by the trip count. ``program_cost`` walks the text
of ``jax.jit(f).lower(...).compile().as_text()`` and multiplies loop bodies out.

Counted (formulas from XLA's ``xla/service/hlo_cost_analysis.cc``; 1 FMA = 2 FLOPs):

* ``dot``: 2 * prod(result dims) * prod(lhs contracting dim sizes)  (``HandleDot``).
* ``convolution``: 2 * (input features / feature_group_count) * output features *
  (batch / batch_group_count) * prod over spatial dims of the valid (output, kernel) position
  pairs, which honours padding, strides and dilations (``GetConvolutionFlops``). Without padding
  this is the textbook 2 * prod(result dims) * prod(kernel spatial dims) * C_in / groups. The TPU
  compiler emits dots as window-less convolutions (``dim_labels=bf_io->bf``); both are handled.
* Called computations: a ``fusion``'s ``calls=``; ``call`` / ``async-start``; ``conditional``:
  the maximum over its branches (per field, as XLA does); ``while``: body * n + condition * (n+1).
  n is ``backend_config`` ``"known_trip_count":{"n":"7"}`` (XLA:CPU prints it) or, when absent (the
  TPU compiler prints none), read from the counted-loop pattern: tuple element k starts at a
  constant, the body adds a constant to it and the condition compares it with a constant. Other
  loops count once and are tallied in ``unknown_trip_counts``.
* Bytes: every instruction at the top level of a non-fusion computation adds its operand bytes read
  plus result bytes written, times the enclosing trip counts. As in XLA's ``HandleFusion`` /
  ``FusionParameterReadBytes``, a (fused) slice or dynamic-slice reads only its slice, an in-place
  dynamic-update-slice reads and writes only its update (also through a nested fusion, e.g. a relayout
  copy, whose result is only sliced), and a fused parameter used by several
  other ops is read once. ``copy-start`` counts its operand twice (read + write); so does the TPU
  compiler's sliced prefetch, per piece: each ``slice-start`` counts its slice twice (its result tuple
  also names the whole source buffer, which it does not read), and the ``ConcatBitcast`` custom call
  that joins the ``slice-done`` pieces into one buffer counts nothing (a bitcast); the pieces are s8
  views of the source's tiled buffer, so these count its padded bytes. Other sizes are logical
  (elements * dtype bits / 8): TPU tile padding and memory spaces (HBM vs VMEM) are ignored.

Ignored: elementwise ops and reductions (so ``flops`` is a little below XLA's, which counts one per
output element), transcendentals, sort, fft, collectives' arithmetic; ``to_apply`` computations of
reduce / scatter / sort are never walked. Custom-calls count 0 FLOPs, except the attention kernels
(splash ``splash_mha_fwd`` / ``_dq`` / ``_dkv``, cuDNN ``__cudnn$fmha*``), priced from their q / k
operand shapes (``_ATTENTION``), and XLA:GPU's cuDNN convolutions (``__cudnn$conv*``), priced as the
convolution; their bytes are counted and ``custom_calls`` counts them all.
No bytes for parameter, constant, tuple, get-tuple-element, bitcast, the while / call /
conditional instruction itself (its computations are walked) or ``*-done`` / ``*-update`` ops.
"""

from __future__ import annotations

import math
import re
from collections import namedtuple
from dataclasses import dataclass
from types import SimpleNamespace

__all__ = ["Collective", "Cost", "collectives", "program_cost", "top_bytes"]


@dataclass(frozen=True)
class Cost:
    """Totals for one run of the entry computation. ``loops``: one ``(while name, trip count or
    None, FLOPs of one body iteration)`` per while instruction, nested loops once each."""

    flops: float
    bytes_accessed: float
    loops: tuple = ()
    unknown_trip_counts: int = 0
    custom_calls: int = 0


# args: the raw text between the opcode's parentheses; attrs: everything after them.
_Instr = namedtuple("_Instr", "name shape op args operands attrs")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s*\(.*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_NO_BYTES = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "call", "conditional",
             "async-start", "after-all", "partition-id", "replica-id", "opt-barrier", "domain", "add-dependency"}


def _balanced(s: str, i: int) -> int:
    """Index just past the bracket group that opens at s[i]."""
    depth = 0
    for j in range(i, len(s)):
        depth += 1 if s[j] in "({[" else -1 if s[j] in ")}]" else 0
        if depth == 0:
            return j + 1
    return len(s)


def _parse(text: str) -> tuple[dict, str | None]:
    """{computation name: namespace(instrs={name: _Instr}, root=name, params={number: name})}, entry."""
    comps, cur, entry = {}, None, None
    for line in text.splitlines():
        line = re.sub(r"/\*.*?\*/", "", line)  # tuple shapes carry /*index=5*/ comments
        if cur is None:
            m = _HEADER.match(line) if line[:1] not in " \t" else None
            if m:
                cur = comps[m.group(1)] = SimpleNamespace(instrs={}, root="", params={})
                entry = m.group(1) if line.startswith("ENTRY") else entry
        elif line.strip() == "}":
            cur = None
        elif m := _INSTR.match(line):
            rest = m.group(3)
            end = _balanced(rest, 0) if rest.startswith("(") else rest.find(" ")
            shape, rest = rest[:end], rest[end:].lstrip()
            op = re.match(r"[\w\-]+", rest).group(0)
            close = _balanced(rest, len(op))
            ins = _Instr(m.group(2), shape, op, rest[len(op) + 1:close - 1],
                         re.findall(r"%([\w.\-]+)", rest[len(op):close]), rest[close:])
            cur.instrs[ins.name] = ins
            cur.root = ins.name if m.group(1) else cur.root
            if op == "parameter":
                cur.params[int(ins.args)] = ins.name
    return comps, entry


def _dims(shape: str) -> list:
    m = _ARRAY.search(shape)
    return [int(re.sub(r"\D", "", d)) for d in m.group(2).split(",") if d.strip()] if m else []


def _nbytes(shape: str) -> float:
    """Logical bytes of an array or (nested) tuple shape, layouts and tiling annotations ignored."""
    total = 0.0
    for dt, dims in _ARRAY.findall(shape):
        bits = 8 if dt == "pred" else int((re.search(r"\d+", dt) or [0])[0])  # token, opaque: 0
        total += math.prod(int(re.sub(r"\D", "", d)) for d in dims.split(",") if d.strip()) * bits / 8
    return total


def _nelems(shape: str) -> float:
    """Elements of an array or (nested) tuple shape."""
    return float(sum(math.prod(int(re.sub(r"\D", "", d)) for d in dims.split(",") if d.strip())
                     for _, dims in _ARRAY.findall(shape)))


def _slice_bytes(ins: _Instr, comp) -> float:
    """Bytes of the piece a ``slice`` / ``slice-start`` takes: ``slice={[start:limit(:stride)], ...}``
    of its operand, at the operand's element size."""
    src = comp.instrs[ins.operands[0]].shape
    m = re.search(r"slice=\{([^}]*)\}", ins.attrs)
    elems, size = _nelems(src), _nbytes(src)
    if not m or not elems:
        return size
    n = 1
    for lo, hi, st in re.findall(r"\[(-?\d+):(-?\d+)(?::(\d+))?\]", m.group(1)):
        n *= -(-(int(hi) - int(lo)) // int(st or 1))
    return n * size / elems


def _attr(ins: _Instr, key: str) -> str | None:
    m = re.search(r"\b" + key + r"=%?([\w.\-]+)", ins.attrs)
    return m.group(1) if m else None


def _conv_flops(ins: _Instr, comp) -> float:
    lhs, rhs = (_dims(comp.instrs[o].shape) for o in ins.operands[:2])
    out = _dims(ins.shape)
    ll, rl, ol = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attrs).groups()
    window = re.search(r"window=\{([^}]*)\}", ins.attrs)
    per_dim = {k: v.split("x") for k, v in re.findall(r"(\w+)=([\d_x\-]+)", window[1] if window else "")}
    count = 1  # product over spatial dims of the valid (output, kernel) position pairs
    for s, d in enumerate(sorted(c for c in ll if c.isdigit())):
        n_in, n_k, n_out = lhs[ll.index(d)], rhs[rl.index(d)], out[ol.index(d)]
        stride, rdil, bdil, pad = (int(per_dim[k][s].split("_")[0]) if k in per_dim else dflt for k, dflt
                                   in (("stride", 1), ("rhs_dilate", 1), ("lhs_dilate", 1), ("pad", 0)))
        valid = 0
        for k in range(n_k):  # input index u = o*stride - pad + k*rdil must be a kept point in range
            c = k * rdil - pad
            if bdil == 1:  # closed form: o in [ceil(-c/stride), floor((n_in-1-c)/stride)] and [0, n_out)
                valid += max(0, min(n_out - 1, (n_in - 1 - c) // stride) - max(0, -(c // stride)) + 1)
            else:
                valid += sum((o * stride + c) % bdil == 0 and 0 <= (o * stride + c) // bdil < n_in
                             for o in range(n_out))
        count *= valid
    groups = int((re.search(r"feature_group_count=(\d+)", ins.attrs) or [0, 1])[1])
    bgroups = int((re.search(r"batch_group_count=(\d+)", ins.attrs) or [0, 1])[1])
    return 2.0 * (lhs[ll.index("f")] // groups) * out[ol.index("f")] * (lhs[ll.index("b")] // bgroups) * count


class _Walker:
    def __init__(self, comps: dict):
        self.comps, self.memo, self.loops, self.unknown = comps, {}, {}, 0

    def read(self, comp, ins: _Instr, k: int) -> float:
        """Bytes ``ins`` reads from its operand k (a slice reads only the slice)."""
        if k == 0 and ins.op in ("slice", "dynamic-slice"):
            return _nbytes(ins.shape)
        if k == 0 and ins.op == "dynamic-update-slice":
            return _nbytes(comp.instrs[ins.operands[1]].shape)
        if ins.op == "fusion":
            fused = self.comps[_attr(ins, "calls")]
            name, total, plain = fused.params.get(k), 0.0, False
            for u in (u for u in fused.instrs.values() if name and name in u.operands):
                for j in (j for j, o in enumerate(u.operands) if o == name):
                    if u.op == "fusion":
                        total += min(self.read(fused, u, j), self._sliced_cap(fused, u, name))
                    elif u.op in ("slice", "dynamic-slice", "dynamic-update-slice"):
                        total += self.read(fused, u, j)
                    elif not plain:  # other users share one read
                        plain, total = True, total + _nbytes(fused.instrs[name].shape)
            return total
        return _nbytes(comp.instrs[ins.operands[k]].shape)

    def _sliced_cap(self, comp, inner: _Instr, param: str) -> float:
        """Upper bound of what a nested fusion ``inner`` reads of ``param`` when every use of its result
        is a (dynamic-)slice (a relayout ``copy`` fused under a layer scan's ``dynamic-slice``: only the
        slice is computed, so only its elements are read): the slices' elements at ``param``'s element
        size; infinite otherwise."""
        users = [u for u in comp.instrs.values() if inner.name in u.operands]
        if not users or any(u.op not in ("slice", "dynamic-slice") or u.operands[0] != inner.name for u in users):
            return math.inf
        p_bytes, p_elems = _nbytes(comp.instrs[param].shape), _nelems(comp.instrs[param].shape)
        return sum(_nelems(u.shape) for u in users) * (p_bytes / p_elems if p_elems else 0.0)

    def written(self, comp, ins: _Instr) -> float:
        if ins.op == "fusion":
            fused = self.comps[_attr(ins, "calls")]
            root = fused.instrs[fused.root]
            return sum(self.written(fused, fused.instrs[o]) for o in root.operands) if root.op == "tuple" \
                else self.written(fused, root)
        if ins.op == "dynamic-update-slice":
            return _nbytes(comp.instrs[ins.operands[1]].shape)
        return _nbytes(ins.shape)

    def instr_bytes(self, comp, ins: _Instr) -> float:
        """Bytes one run of the top-level (unfused) instruction ``ins`` reads plus writes."""
        if ins.op == "copy-start":
            return 2 * _nbytes(comp.instrs[ins.operands[0]].shape)
        if ins.op == "slice-start":  # result ((source), piece, context): only the piece moves
            return 2 * _slice_bytes(ins, comp)
        if ins.op == "custom-call" and re.search(r'custom_call_target="ConcatBitcast"', ins.attrs):
            return 0.0
        return self.written(comp, ins) + sum(self.read(comp, ins, k) for k in range(len(ins.operands)))

    def trace(self, comp, name: str, outer: tuple = ()):
        """('gte', k) | ('const', v) | ('add', k, step) | None: what a loop-counter value is made of."""
        ins = comp.instrs.get(name)
        if ins is None:
            return None
        if ins.op == "constant" and re.fullmatch(r"-?\d+", ins.args.strip()):
            return ("const", int(ins.args))
        if ins.op == "get-tuple-element" and not outer and comp.instrs[ins.operands[0]].op == "parameter":
            return ("gte", int(re.search(r"index=(\d+)", ins.attrs).group(1)))
        if ins.op in ("copy", "bitcast", "convert", "reshape"):
            return self.trace(comp, ins.operands[0], outer)
        if ins.op == "parameter" and outer:  # fused parameter: the fusion's operand, one level up
            (ocomp, fusion), rest = outer[0], outer[1:]
            return self.trace(ocomp, fusion.operands[int(ins.args)], rest)
        if ins.op == "fusion":
            fused = self.comps[_attr(ins, "calls")]
            return self.trace(fused, fused.root, ((comp, ins),) + outer)
        if ins.op in ("add", "subtract") and len(ins.operands) == 2:
            a, b = (self.trace(comp, o, outer) for o in ins.operands)
            if ins.op == "add" and b and b[0] == "gte":
                a, b = b, a
            if a and b and a[0] == "gte" and b[0] == "const":
                return ("add", a[1], b[1] if ins.op == "add" else -b[1])
        return None

    def infer_trips(self, comp, w: _Instr) -> int | None:
        """Trip count of a counted loop: i = i0; while i <cmp> bound: i += step."""
        cond, body = self.comps[_attr(w, "condition")], self.comps[_attr(w, "body")]
        c, ctx = cond.instrs[cond.root], ()
        while c.op == "fusion":
            fused = self.comps[_attr(c, "calls")]
            c, ctx, cond = fused.instrs[fused.root], ((cond, c),) + ctx, fused
        if c.op != "compare":
            return None
        a, b = (self.trace(cond, o, ctx) for o in c.operands)
        d = re.search(r"direction=(\w+)", c.attrs).group(1)
        if b and b[0] == "gte":
            a, b, d = b, a, {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(d, d)
        init = comp.instrs[w.operands[0]]
        if not (a and b and a[0] == "gte" and b[0] == "const" and init.op == "tuple"):
            return None
        i0 = self.trace(comp, init.operands[a[1]])
        step = self.trace(body, body.instrs[body.root].operands[a[1]])
        if not (i0 and i0[0] == "const" and step and step[0] == "add" and step[1] == a[1]):
            return None
        i0, s, bound = i0[1], step[2], b[1]
        if d in ("LE", "GE"):
            bound, d = bound + (1 if d == "LE" else -1), d[0] + "T"
        if (d == "LT" and s > 0) or (d == "GT" and s < 0) or (d == "NE" and s and (bound - i0) % s == 0):
            return max(0, -((i0 - bound) // s))
        return None

    def cost(self, name: str, fused: bool) -> tuple:
        """(flops, bytes, custom-call instructions) of one run of computation ``name``."""
        if (name, fused) in self.memo:
            return self.memo[name, fused]
        comp, flops, nbytes, ncc = self.comps[name], 0.0, 0.0, 0
        for ins in comp.instrs.values():
            sub = None
            if ins.op == "dot":
                lhs = _dims(comp.instrs[ins.operands[0]].shape)
                contracting = re.search(r"lhs_contracting_dims=\{([\d,\s]*)\}", ins.attrs)
                flops += 2.0 * math.prod(_dims(ins.shape)) * math.prod(
                    lhs[int(d)] for d in (contracting[1].split(",") if contracting else []) if d.strip())
            elif ins.op == "convolution":
                flops += _conv_flops(ins, comp)
            elif ins.op == "custom-call":
                ncc += 1
                flops += _custom_call_flops(ins, comp)
            elif ins.op == "fusion":
                sub = self.cost(_attr(ins, "calls"), True)
            elif ins.op in ("call", "async-start"):
                sub = self.cost(_attr(ins, "to_apply") or _attr(ins, "calls"), fused)
            elif ins.op == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
                names = re.findall(r"%?([\w.\-]+)", branches[1]) if branches else \
                    [_attr(ins, "true_computation"), _attr(ins, "false_computation")]
                subs = [self.cost(n, fused) for n in names if n]
                sub = tuple(max(s[i] for s in subs) for i in range(3)) if subs else None
            elif ins.op == "while":
                m = _TRIP.search(ins.attrs)
                n = int(m.group(1)) if m else self.infer_trips(comp, ins)
                body, cond = self.cost(_attr(ins, "body"), fused), self.cost(_attr(ins, "condition"), fused)
                self.loops[ins.name] = (ins.name, n, body[0])
                self.unknown += n is None
                k, kc = (1, 1) if n is None else (n, n + 1)
                sub = (k * body[0] + kc * cond[0], k * body[1] + kc * cond[1], body[2] + cond[2])
            if sub:
                flops, nbytes, ncc = flops + sub[0], nbytes + sub[1], ncc + sub[2]
            if fused or ins.op in _NO_BYTES or ins.op.endswith(("-done", "-update")):
                continue
            nbytes += self.instr_bytes(comp, ins)
        self.memo[name, fused] = (flops, nbytes, ncc)
        return self.memo[name, fused]


#: attention kernels (custom calls) -> (FLOPs per q element per key, layout): splash's forward is
#: Q K^T and P V (2 matmuls = 4), its dq kernel recomputes Q K^T and forms dP = dO V^T and dS K (6),
#: its dkv kernel Q K^T, dP, P^T dO and dS^T Q (8); cuDNN's backward does all five (10). Splash
#: operands are [(B,) N, L, H], cuDNN's [B, L, N, H].
_ATTENTION = ((re.compile(r"splash_mha_fwd|flash_attention_fwd"), 4.0, "nlh"),
              (re.compile(r"splash_mha_dq"), 6.0, "nlh"), (re.compile(r"splash_mha_dkv"), 8.0, "nlh"),
              (re.compile(r"cudnn\$fmha\w*Backward"), 10.0, "blnh"), (re.compile(r"cudnn\$fmha"), 4.0, "blnh"))


def _custom_call_flops(ins: _Instr, comp) -> float:
    """FLOPs of a custom call XLA lowered a convolution to (cuDNN ``__cudnn$conv*``: priced as the
    convolution, from its window / dim_labels and first result) or an attention kernel (splash /
    cuDNN fmha: from its q and k operands, the first two floating operands of rank >= 3 with the same
    head dim); 0 for any other custom call."""
    target = re.search(r'custom_call_target="([^"]*)"', ins.attrs)
    target = target[1] if target else ""
    if "$conv" in target and "dim_labels=" in ins.attrs:
        return _conv_flops(ins, comp)
    key = ins.name + " " + target
    for pattern, per, layout in _ATTENTION:
        if pattern.search(key):
            break
    else:
        return 0.0
    arrays = []
    for op in ins.operands:
        shape = comp.instrs[op].shape if op in comp.instrs else ""
        m = _ARRAY.match(shape.strip("( "))
        if m and m.group(1) in ("bf16", "f16", "f32") and len(_dims(shape)) >= 3:
            arrays.append(_dims(shape))
    if len(arrays) < 2 or arrays[0][-1] != arrays[1][-1]:
        return 0.0
    q, k = arrays[0], arrays[1]
    keys = k[-2] if layout == "nlh" else k[-3]
    return per * math.prod(q) * keys


def top_bytes(hlo_text: str, n: int = 10) -> list[tuple[float, str, str, str]]:
    """The ``n`` instructions that access the most bytes over the whole run (trip counts applied; every
    branch of a conditional counted, an upper bound): ``(bytes, opcode, result shape, op_name)``, for
    reading where a program's memory traffic goes."""
    comps, entry = _parse(hlo_text)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    walker, out = _Walker(comps), {}

    def visit(name: str, mult: float) -> None:
        comp = comps[name]
        for ins in comp.instrs.values():
            if ins.op == "while":
                m = _TRIP.search(ins.attrs)
                k = int(m.group(1)) if m else (walker.infer_trips(comp, ins) or 1)
                visit(_attr(ins, "body"), mult * k)
                visit(_attr(ins, "condition"), mult * (k + 1))
                continue
            if ins.op in ("call", "async-start"):
                visit(_attr(ins, "to_apply") or _attr(ins, "calls"), mult)
                continue
            if ins.op == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
                for b in (re.findall(r"%?([\w.\-]+)", branches[1]) if branches else
                          [_attr(ins, "true_computation"), _attr(ins, "false_computation")]):
                    if b:
                        visit(b, mult)
                continue
            if ins.op in _NO_BYTES or ins.op.endswith(("-done", "-update")):
                continue
            nbytes = walker.instr_bytes(comp, ins)
            meta = re.search(r'op_name="([^"]*)"', ins.attrs)
            out[(name, ins.name)] = (nbytes * mult, ins.op, ins.shape[:80], meta[1][-120:] if meta else "")

    visit(entry, 1.0)
    return sorted(out.values(), key=lambda r: -r[0])[:n]


#: collective opcodes (async forms counted at their ``-start``) -> what their payload is: "out" (the gathered
#: result) or "in" (the operands)
_COLLECTIVES = {"all-gather": "out", "all-gather-start": "out", "reduce-scatter": "in", "all-reduce": "in",
                "all-reduce-start": "in", "all-to-all": "in", "ragged-all-to-all": "in", "collective-permute": "in",
                "collective-permute-start": "in", "collective-broadcast": "in"}


@dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled program.

    op: its opcode without ``-start``; payload: bytes per device (all-gather: its gathered result; the
    others: their operands, a combined collective's summed); groups: the device groups
    (partition ids as the program's device assignment orders them; one group of all devices for ``{}``;
    a permute's source-target pairs); runs: how often one run of the program executes it (enclosing trip
    counts); loop: the innermost enclosing ``while`` ("" at the top level); loop_runs: that loop's runs
    (its trip count x its own enclosing trip counts, 1 at the top level)."""

    op: str
    payload: float
    groups: tuple
    runs: float
    loop: str = ""
    loop_runs: float = 1.0

    @property
    def group_size(self) -> int:
        return max((len(g) for g in self.groups), default=1)


def _iota(dims: str, perm: str | None) -> list[int]:
    """Device ids of XLA's iota list ``[dims]`` (comma-separated), transposed by ``perm`` when given, read
    row-major (numpy: ``arange(prod).reshape(dims).transpose(perm).ravel()``)."""
    d = [int(x) for x in dims.split(",")]
    if not perm:
        return list(range(math.prod(d)))
    p = [int(x) for x in perm.split(",")]
    strides = [math.prod(d[i + 1:]) for i in range(len(d))]
    td = [d[k] for k in p]
    ids = []
    for flat in range(math.prod(td)):
        idx, rem = [], flat
        for n in reversed(td):
            idx.append(rem % n)
            rem //= n
        idx = idx[::-1]
        ids.append(sum(idx[k] * strides[p[k]] for k in range(len(p))))
    return ids


def _groups(ins: _Instr, num_devices: int) -> tuple:
    """Device groups of a collective: ``replica_groups={{0,1},{2,3}}``, the iota form ``[2,4]<=[4,2]T(1,0)``,
    the mesh form ``mesh['a'=4,'b'=2] {'a'}`` (ids row-major over the mesh, or ``device_ids=([4,2]T(1,0))``
    / an explicit list at each mesh position; a group varies the named axes),
    ``{}`` (all devices) or a permute's ``source_target_pairs``."""
    m = re.search(r"source_target_pairs=\{((?:\{[\d,\s]*\},?\s*)*)\}", ins.attrs)
    if m:
        return tuple(tuple(int(x) for x in g.split(",") if x.strip()) for g in re.findall(r"\{([\d,\s]*)\}", m[1]))
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", ins.attrs)
    if m:
        shape = [int(x) for x in m[1].split(",")]
        ids = _iota(m[2], m[3])
        size = shape[-1] if len(shape) > 1 else len(ids)
        return tuple(tuple(ids[i:i + size]) for i in range(0, len(ids), size))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\((.*?)\))?\s*\{([^}]*)\}", ins.attrs)
    if m:  # mesh axes, the device at each mesh position (row-major; iota unless device_ids), the spanned axes
        axes = [(a, int(n)) for a, n in re.findall(r"'?([\w.\-]+)'?\s*=\s*(\d+)", m[1])]
        span = set(re.findall(r"'?([\w.\-]+)'?", m[3]))
        sizes = [n for _, n in axes]
        ids = list(range(math.prod(sizes)))
        if m[2]:
            it = re.fullmatch(r"\s*\[([\d,]+)\](?:T\(([\d,]+)\))?\s*", m[2])
            ids = _iota(it[1], it[2]) if it else [int(x) for x in re.findall(r"\d+", m[2])]
        keyed: dict[tuple, list[int]] = {}
        for pos, dev in enumerate(ids):
            rem, coords = pos, []
            for n in reversed(sizes):
                coords.append(rem % n)
                rem //= n
            coords = coords[::-1]
            keyed.setdefault(tuple(c for (a, _), c in zip(axes, coords) if a not in span), []).append(dev)
        return tuple(tuple(g) for g in keyed.values())
    m = re.search(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}", ins.attrs)
    groups = tuple(tuple(int(x) for x in g.split(",") if x.strip()) for g in re.findall(r"\{([\d,\s]*)\}", m[1])) \
        if m else ()
    groups = tuple(g for g in groups if g)
    return groups or (tuple(range(num_devices)),)


def collectives(hlo_text: str) -> tuple[list[Collective], dict[str, tuple[float, float, float]]]:
    """Every collective of the optimized HLO text (:class:`Collective`), fusions and async computations
    included, and ``{while name: (runs of its body, FLOPs, bytes of one body run)}`` for pricing what a
    loop body's compute can hide."""
    comps, entry = _parse(hlo_text)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    m = re.search(r"num_partitions=(\d+)", hlo_text)
    num = int(m[1]) if m else 1
    if num == 1:
        m = re.search(r"replica_count=(\d+)", hlo_text)
        num = int(m[1]) if m else 1
    walker, out, loops = _Walker(comps), [], {}

    def visit(name: str, mult: float, loop: str, loop_runs: float) -> None:
        comp = comps[name]
        for ins in comp.instrs.values():
            if ins.op == "while":
                t = _TRIP.search(ins.attrs)
                k = int(t.group(1)) if t else (walker.infer_trips(comp, ins) or 1)
                body = _attr(ins, "body")
                f, b, _ = walker.cost(body, False)
                loops[ins.name] = (mult * k, f, b)
                visit(body, mult * k, ins.name, mult * k)
                continue
            if ins.op in _COLLECTIVES:
                operands = sum(_nbytes(comp.instrs[o].shape) for o in ins.operands if o in comp.instrs)
                if _COLLECTIVES[ins.op] == "out":
                    payload = _nbytes(ins.shape) - (operands if ins.op.endswith("-start") else 0.0)
                else:
                    payload = operands
                out.append(Collective(ins.op.removesuffix("-start"), payload, _groups(ins, num), mult, loop,
                                      loop_runs))
                continue
            for key in ("calls", "to_apply") if ins.op in ("fusion", "call", "async-start") else ():
                sub = _attr(ins, key)
                if sub in comps:
                    visit(sub, mult, loop, loop_runs)
            if ins.op == "conditional":  # one branch runs: the one that moves the most
                branches = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
                best: list = []
                for b in (re.findall(r"%?([\w.\-]+)", branches[1]) if branches else
                          [_attr(ins, "true_computation"), _attr(ins, "false_computation")]):
                    if b in comps:
                        before = len(out)
                        visit(b, mult, loop, loop_runs)
                        got = out[before:]
                        del out[before:]
                        if sum(c.payload * c.runs for c in got) > sum(c.payload * c.runs for c in best):
                            best = got
                out.extend(best)

    visit(entry, 1.0, "", 1.0)
    return out, loops


def program_cost(hlo_text: str) -> Cost:
    """Trip-count-aware totals for the optimized HLO module text of a compiled executable."""
    comps, entry = _parse(hlo_text)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    walker = _Walker(comps)
    flops, nbytes, ncc = walker.cost(entry, False)
    return Cost(flops, nbytes, tuple(walker.loops.values()), walker.unknown, ncc)
