"""One table of roofline turns from `animegamer-aot --json` reports: per stage, turn and time to first frame.

Run (no compile; reads the JSON reports that ``python -m animegamer_jax.aot ... --json=FILE`` wrote):
  python -m benchmarks.turn_table \\
      --row "ONE v6e|student-4|bf16|full=v6e1_student.json+v6e1_vae.json" \\
      --row "ONE v6e|student-4|int8|preview=v6e1_int8.json+v6e1_student.json+v6e1_vae.json" [--json out.json]

Each ``--row`` is ``TARGET|SAMPLER|MLLM|DECODER=FILE[+FILE...]``: a turn assembled from the reports'
turn programs (a program is taken from the FIRST file that compiled it, so the file with the row's
variant comes first); every report of a row must be for the same chip. DECODER is play's
``game.decoder``:

* ``full``: turn = prefill + decode x runs + pass B + DiT sampling + VAE decode (aot/report.py
  ``turn_estimate``); time to first frame = the same with the VAE's first chunk (``turn_ttff``);
* ``preview``: the preview decoder in place of the VAE decode, for both;
* ``preview_then_full``: first frame after the preview decode, turn = full + preview.

Times are roofline seconds at 100 % of the chip's peak (aot/report.py ``ASSUMPTIONS``) and divided by
0.4 for "at 40 %". Resident = report.turn_resident (full; the preview decoder's arguments added for
the preview modes). Prints a markdown table; ``--json`` writes the rows.

Exits 2 with one line for a missing file, a malformed row, a report without a needed
program, or reports of different chips in one row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from animegamer_jax import fileio
from animegamer_jax.aot import report

STAGES = ("prefill", "decode", "pass_b", "dit")
DECODERS = ("full", "preview", "preview_then_full")
AT = 0.4


def _fail(msg: str) -> None:
    print(f"turn_table: {msg}", file=sys.stderr)
    sys.exit(2)


def _rows(path: str) -> tuple[tuple[str, float], list[report.Row]]:
    """((chip name, HBM bytes), the report's rows) of one aot JSON report."""
    try:
        doc = json.loads(fileio.read_bytes(path).decode())
    except FileNotFoundError:
        _fail(f"{path}: no such report. Fix: write it with python -m animegamer_jax.aot "
                         f"... --json={path}")
    except ValueError as e:
        _fail(f"{path}: not a JSON report ({e}). Fix: pass an animegamer-aot --json file")
    names = {f.name for f in dataclasses.fields(report.Row)}
    rows = []
    for p in doc.get("programs", []):
        r = report.Row(**{k: v for k, v in p.items() if k in names})
        r.first_chunk = tuple(r.first_chunk)
        rows.append(r)
    chip = doc.get("chip") or {}
    return (str(chip.get("name", doc.get("device_kind", "?"))), float(chip.get("hbm_bytes") or 0)), rows


def assemble(spec: str) -> dict:
    """One table row from ``TARGET|SAMPLER|MLLM|DECODER=FILE[+FILE...]`` (module docstring)."""
    try:
        head, files = spec.split("=", 1)
        target, sampler, mllm, decoder = (s.strip() for s in head.split("|"))
    except ValueError:
        _fail(f"--row {spec!r} is not TARGET|SAMPLER|MLLM|DECODER=FILE[+FILE...]")
    if decoder not in DECODERS:
        _fail(f"--row {spec!r}: decoder {decoder!r} is not one of {', '.join(DECODERS)}")
    got: dict[str, report.Row] = {}
    chips = set()
    for path in files.split("+"):
        chip, rows = _rows(path.strip())
        chips.add(chip)
        for r in rows:
            if r.kind == "turn" and r.layout == "latency" and r.status == "ok" and r.roofline_s is not None:
                got.setdefault(r.program, r)
    if len(chips) > 1:
        _fail(f"--row {spec!r} mixes reports of chips {sorted(c for c, _ in chips)}")
    chip, hbm = chips.pop()
    need = STAGES + (("vae_decode",) if decoder != "preview" else ()) + (("preview_decode",) if decoder != "full" else ())
    missing = [n for n in need if n not in got]
    if missing:
        _fail(f"--row {spec!r}: no compiled latency-layout {', '.join(missing)} in {files}")
    ms = {n: got[n].roofline_s * got[n].runs for n in got}
    five = [got[n] for n in STAGES] + ([got["vae_decode"]] if "vae_decode" in got else [])
    before = sum(ms[n] for n in STAGES)
    if decoder == "full":
        turn, (ttff, _) = report.turn_estimate(five), report.turn_ttff(five)
    elif decoder == "preview":
        turn = ttff = before + ms["preview_decode"]
    else:
        turn, ttff = report.turn_estimate(five) + ms["preview_decode"], before + ms["preview_decode"]
    resident = report.turn_resident(five) if "vae_decode" in got else None
    if resident is not None and decoder != "full":
        resident += got["preview_decode"].arguments
    return {"target": target, "sampler": sampler, "mllm": mllm, "decoder": decoder, "chip": chip,
            "ms": {n: ms[n] * 1e3 for n in need}, "turn_s": turn, "ttff_s": ttff,
            "resident_gib": None if resident is None else resident / 2**30,
            "resident_fraction": None if resident is None or not hbm else resident / hbm, "files": files}


def markdown(rows: list[dict]) -> str:
    """The table: one line per row, stage columns in ms at 100 %, turn and ttff at 100 % and 40 %."""
    out = ["| target | DiT | MLLM | decoder | prefill | decode x runs | pass B | DiT sampling | VAE decode | preview "
           "| **turn** 100 % / 40 % | **first frame** 100 % / 40 % | resident GiB |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cell = lambda n: f"{r['ms'][n]:.1f}" if n in r["ms"] else "-"  # noqa: E731
        res = "-" if r["resident_gib"] is None else (
            f"{r['resident_gib']:.1f}" + ("" if r["resident_fraction"] is None else f" ({100 * r['resident_fraction']:.0f} %)"))
        out.append(f"| {r['target']} | {r['sampler']} | {r['mllm']} | {r['decoder']} | {cell('prefill')} | "
                   f"{cell('decode')} | {cell('pass_b')} | {cell('dit')} | {cell('vae_decode')} | "
                   f"{cell('preview_decode')} | **{r['turn_s']:.3f} / {r['turn_s'] / AT:.3f} s** | "
                   f"**{r['ttff_s']:.3f} / {r['ttff_s'] / AT:.3f} s** | {res} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", action="append", required=True, help="TARGET|SAMPLER|MLLM|DECODER=FILE[+FILE...]")
    ap.add_argument("--json", default="", help="also write the rows here")
    a = ap.parse_args(argv)
    rows = [assemble(s) for s in a.row]
    print(markdown(rows))
    if a.json:
        fileio.write_text_atomic(a.json, json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
