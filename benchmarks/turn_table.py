"""docs/results.md's tables: roofline turns from `animegamer-aot --json` reports, and table reports.

Run (no compile; reads the JSON reports that ``python -m animegamer_jax.commands.aot ... --json=FILE`` wrote):
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
* ``preview_then_full``: first frame after the preview decode, turn = full + preview;
* ``none``: MLLM + DiT only (the VAE decode not compiled); no first frame, no resident figure.

``--program "TARGET|LABEL=FILE:PROGRAM"`` rows instead show one compiled program each: peak GiB per
chip, % of the chip's HBM and roofline ms per run x runs. ``--reports DIR`` is prefixed to every
relative FILE. ``--by_target`` prints one table with a column per TARGET (in order of first mention)
and a row per variant (SAMPLER, MLLM, DECODER and the report's games per chip; or LABEL): the
question's figures only (turn and first frame at 100 % / 40 %, resident GiB; per player-turn at
40 % when a chip plays several games), the per-stage detail staying in the reports.

Times are roofline seconds at 100 % of the chip's peak (aot/report.py ``ASSUMPTIONS``) and divided by
0.4 for "at 40 %". Resident = report.turn_resident (full; the preview decoder's arguments added for
the preview modes). Prints a markdown table; ``--json`` writes the rows.

Exits 2 with one line for a missing file, a malformed row, a report without a needed
program, or reports of different chips in one row.

``--reports FILE.json`` (a file, no ``--row`` / ``--program``) prints a table report instead: a JSON
file holding one question's figures ("question", "source", "commands", "notes" (list of str), "tables":
a list of {"name", "columns": header cells, "rows": lists of cells, the first the row's label}; and
optionally "turn_table": this tool's argv, whose table comes first, assembled from aot reports). All its
tables print, each under a "### name" line (the turn_table argv also prints its per-stage table), after
the source, the commands and the notes;
``--headline`` prints only the report's "headline": {"table": NAME, "columns": [header cells kept] or
null for all, "rows": [[label shown, label in the table, index of the "; "-separated part or null], ...]
or null for all}, or {"turn_table": true} for the argv's table.

docs/results.md's tables are this tool's output from the reports in benchmarks/reports/
(tests/test_turn_table.py re-renders them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from animegamer_jax.io import fileio
from animegamer_jax.aot import report

STAGES = ("prefill", "decode", "pass_b", "dit")
DECODERS = ("full", "preview", "preview_then_full", "none")
AT = 0.4


def _fail(msg: str) -> None:
    print(f"turn_table: {msg}", file=sys.stderr)
    sys.exit(2)


def _doc(path: str) -> dict:
    """One aot JSON report, parsed."""
    try:
        doc = json.loads(fileio.read_bytes(path).decode())
    except FileNotFoundError:
        _fail(f"{path}: no such report. Fix: write it with python -m animegamer_jax.commands.aot "
                         f"... --json={path}")
    except ValueError as e:
        _fail(f"{path}: not a JSON report ({e}). Fix: pass an animegamer-aot --json file")
    return doc


def _rows(path: str) -> tuple[tuple[str, float], list[report.Row], int]:
    """((chip name, HBM bytes), the report's rows, its games per chip) of one aot JSON report."""
    doc = _doc(path)
    names = {f.name for f in dataclasses.fields(report.Row)}
    rows = []
    for p in doc.get("programs", []):
        r = report.Row(**{k: v for k, v in p.items() if k in names})
        r.first_chunk = tuple(r.first_chunk)
        rows.append(r)
    chip = doc.get("chip") or {}
    return ((str(chip.get("name", doc.get("device_kind", "?"))), float(chip.get("hbm_bytes") or 0)), rows,
            int(doc.get("games_per_chip") or 1))


def _path(path: str, reports: str) -> str:
    path = path.strip()
    return os.path.join(reports, path) if reports and "://" not in path and not os.path.isabs(path) else path


def program_row(spec: str, reports: str = "") -> dict:
    """One program's figures from ``TARGET|LABEL=FILE:PROGRAM`` (module docstring)."""
    try:
        head, where = spec.split("=", 1)
        target, label = (s.strip() for s in head.split("|"))
        path, program = where.rsplit(":", 1)
    except ValueError:
        _fail(f"--program {spec!r} is not TARGET|LABEL=FILE:PROGRAM")
    (chip, hbm), rows, games = _rows(_path(path, reports))
    got = [r for r in rows if r.program == program.strip() and r.status == "ok" and r.roofline_s is not None]
    if not got:
        _fail(f"--program {spec!r}: no compiled {program.strip()} in {path}")
    r = got[0]
    return {"target": target, "label": label, "chip": chip, "games": games, "peak_gib": r.peak / 2**30,
            "hbm_fraction": r.peak / hbm if hbm else None, "ms": r.roofline_s * r.runs * 1e3, "files": path}


def assemble(spec: str, reports: str = "") -> dict:
    """One table row from ``TARGET|SAMPLER|MLLM|DECODER=FILE[+FILE...]`` (module docstring)."""
    try:
        head, files = spec.split("=", 1)
        target, sampler, mllm, decoder = (s.strip() for s in head.split("|"))
    except ValueError:
        _fail(f"--row {spec!r} is not TARGET|SAMPLER|MLLM|DECODER=FILE[+FILE...]")
    if decoder not in DECODERS:
        _fail(f"--row {spec!r}: decoder {decoder!r} is not one of {', '.join(DECODERS)}")
    got: dict[str, report.Row] = {}
    chips, games = set(), set()
    for path in files.split("+"):
        chip, rows, g = _rows(_path(path, reports))
        chips.add(chip)
        games.add(g)
        for r in rows:
            if r.kind == "turn" and r.layout == "latency" and r.status == "ok" and r.roofline_s is not None:
                got.setdefault(r.program, r)
    if len(chips) > 1:
        _fail(f"--row {spec!r} mixes reports of chips {sorted(c for c, _ in chips)}")
    chip, hbm = chips.pop()
    need = STAGES + (("vae_decode",) if decoder not in ("preview", "none") else ()) + (
        ("preview_decode",) if decoder not in ("full", "none") else ())
    missing = [n for n in need if n not in got]
    if missing:
        _fail(f"--row {spec!r}: no compiled latency-layout {', '.join(missing)} in {files}")
    ms = {n: got[n].roofline_s * got[n].runs for n in got}
    five = [got[n] for n in STAGES] + ([got["vae_decode"]] if "vae_decode" in got else [])
    before = sum(ms[n] for n in STAGES)
    if decoder == "full":
        turn, (ttff, _) = report.turn_estimate(five), report.turn_ttff(five)
    elif decoder == "none":
        turn, ttff = before, None
    elif decoder == "preview":
        turn = ttff = before + ms["preview_decode"]
    else:
        turn, ttff = report.turn_estimate(five) + ms["preview_decode"], before + ms["preview_decode"]
    resident = report.turn_resident(five) if "vae_decode" in got and decoder != "none" else None
    if resident is not None and decoder != "full":
        resident += got["preview_decode"].arguments
    return {"target": target, "sampler": sampler, "mllm": mllm, "decoder": decoder, "chip": chip, "games": max(games),
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
        res = _resident(r["resident_gib"], r["resident_fraction"])
        out.append(f"| {r['target']} | {r['sampler']} | {r['mllm']} | {r['decoder']} | {cell('prefill')} | "
                   f"{cell('decode')} | {cell('pass_b')} | {cell('dit')} | {cell('vae_decode')} | "
                   f"{cell('preview_decode')} | {_pair(r['turn_s'], bold=True)} | "
                   f"{_pair(r['ttff_s'], bold=True)} | {res} |")
    return "\n".join(out)


def _pair(s: float | None, bold: bool = False) -> str:
    """``s`` at 100 % / at 40 % of peak, in seconds ("-" for None)."""
    if s is None:
        return "-"
    text = f"{s:.3f} / {s / AT:.3f} s"
    return f"**{text}**" if bold else text


def _resident(gib: float | None, fraction: float | None) -> str:
    if gib is None:
        return "-"
    return f"{gib:.1f}" + ("" if fraction is None else f" ({100 * fraction:.0f} %)")


def by_target(rows: list[dict]) -> str:
    """One table, a column per target. A turn row's cell: "**turn at 100 % / 40 %**; first frame at
    100 % / 40 % (s); resident GiB (% HBM)", and the turn per player at 40 % (s) when a chip plays B > 1
    games; a program row's cell: "peak GiB (% HBM); roofline ms"."""
    targets = list(dict.fromkeys(r["target"] for r in rows))
    variants: dict[str, dict[str, str]] = {}
    for r in rows:
        if "label" in r:
            key = r["label"]
            frac = "" if r["hbm_fraction"] is None else f" ({100 * r['hbm_fraction']:.0f} %)"
            cell = f"{r['peak_gib']:.2f}{frac}; {r['ms']:.1f}"
        else:
            key = ", ".join([r["sampler"], r["mllm"], r["decoder"]] + ([f"B {r['games']}"] if r["games"] > 1 else []))
            parts = [f"**{r['turn_s']:.3f} / {r['turn_s'] / AT:.3f}**"]
            if r["ttff_s"] is not None:
                parts.append(f"{r['ttff_s']:.3f} / {r['ttff_s'] / AT:.3f}")
            if r["resident_gib"] is not None:
                parts.append(_resident(r["resident_gib"], r["resident_fraction"]))
            if r["games"] > 1 and r["decoder"] != "none":
                parts.append(f"{r['turn_s'] / AT / r['games']:.3f} a player")
            cell = "; ".join(parts)
        variants.setdefault(key, {})[r["target"]] = cell
    kinds = {"label" in r for r in rows}
    legend = ("peak GiB (% HBM); ms" if kinds == {True} else
              "**turn s**, first frame s at 100 / 40 %; resident GiB" if kinds == {False} else "")
    out = [f"| {legend} | " + " | ".join(targets) + " |", "|---|" + "---|" * len(targets)]
    for key, cells in variants.items():
        out.append(f"| {key} | " + " | ".join(cells.get(t, "-") for t in targets) + " |")
    return "\n".join(out)


def _table_md(columns: list[str], rows: list[list[str]]) -> str:
    """A markdown table; short rows are padded with empty cells."""
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(list(r) + [""] * (len(columns) - len(r))) + " |" for r in rows]
    return "\n".join(out)


def _table(doc: dict, name: str, path: str) -> dict:
    for t in doc.get("tables", []):
        if t.get("name") == name:
            return t
    _fail(f"{path}: no table named {name!r}. Fix: name one of its \"tables\"")


def headline(doc: dict, path: str) -> str:
    """The report's headline table (module docstring): chosen columns and rows of one of its tables,
    a row's cell optionally cut to one "; "-separated part."""
    h = doc.get("headline")
    if not isinstance(h, dict):
        _fail(f"{path}: no \"headline\". Fix: add one, or drop --headline")
    if h.get("turn_table"):
        return _render(_argv(doc, path))[0]
    t = _table(doc, h.get("table", ""), path)
    cols = h.get("columns") or t["columns"]
    missing = [c for c in cols if c not in t["columns"]]
    if missing:
        _fail(f"{path}: headline columns {missing} are not in table {t['name']!r}")
    idx = [t["columns"].index(c) for c in cols]
    by_label = {r[0]: r for r in t["rows"]}
    rows = []
    for label, source, part in (h.get("rows") or [[r[0], r[0], None] for r in t["rows"]]):
        if source not in by_label:
            _fail(f"{path}: headline row {source!r} is not in table {t['name']!r}")
        cells = [by_label[source][i] if i < len(by_label[source]) else "" for i in idx[1:]]
        if part is not None:
            cells = [c.split("; ")[part] if len(c.split("; ")) > part else c for c in cells]
        rows.append([label] + cells)
    return _table_md(cols, rows)


def table_report(path: str, only_headline: bool = False) -> str:
    """A table report (module docstring): its headline table, or every table under "### name" lines."""
    doc = _doc(path)
    if only_headline:
        return headline(doc, path)
    out = [f"## {doc.get('question', path)}", "", f"source: {doc.get('source', '-')}", ""]
    out += ["```"] + list(doc.get("commands", [])) + ["```", ""] if doc.get("commands") else []
    out += [f"- {n}" for n in doc.get("notes", [])] + ([""] if doc.get("notes") else [])
    if doc.get("turn_table"):
        text, rows = _render(_argv(doc, path))
        out += [f"### {doc.get('question', '')} (from the aot reports)", text, "",
                "### per stage, ms at 100 %", markdown([r for r in rows if "label" not in r]) if any(
                    "label" not in r for r in rows) else "", ""]
    for t in doc.get("tables", []):
        out += [f"### {t['name']}", _table_md(t["columns"], t["rows"]), ""]
    return "\n".join(out).rstrip()


def _argv(doc: dict, path: str) -> list[str]:
    """A table report's turn_table argv, its ``--reports`` folder taken relative to the report's folder."""
    argv = list(doc["turn_table"])
    if "--reports" in argv:
        i = argv.index("--reports") + 1
        argv[i] = _path(argv[i], os.path.dirname(path))
    return argv


def _render(argv: list[str]) -> tuple[str, list[dict]]:
    """The table of one command line (module docstring) and its rows."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.turn_table", description=__doc__.splitlines()[0])
    ap.add_argument("--row", action="append", default=[], help="TARGET|SAMPLER|MLLM|DECODER=FILE[+FILE...]")
    ap.add_argument("--program", action="append", default=[], help="TARGET|LABEL=FILE:PROGRAM")
    ap.add_argument("--reports", default="", help="folder prefixed to relative report files, or a table report")
    ap.add_argument("--by_target", action="store_true", help="one column per target, the question's figures only")
    ap.add_argument("--headline", action="store_true", help="with a table report: its headline table only")
    ap.add_argument("--json", default="", help="also write the rows here")
    a = ap.parse_args(argv)
    if a.reports.endswith(".json") and (a.row or a.program or a.by_target or a.json):
        _fail(f"--reports {a.reports} is a table report, printed alone (or with --headline); --row, --program, "
              "--by_target and --json read the compile reports of a folder. Fix: --reports=FOLDER with those")
    if a.headline and not a.reports.endswith(".json"):
        _fail("--headline prints a table report's headline. Fix: --reports=benchmarks/reports/X.json --headline")
    if not a.row and not a.program:
        if a.reports.endswith(".json"):
            return table_report(a.reports, a.headline), []
        _fail("no --row and no --program. Fix: name at least one row, or pass a table report as --reports")
    if a.program and not a.by_target:
        _fail("--program rows print only with --by_target. Fix: add --by_target")
    rows = [assemble(s, a.reports) for s in a.row] + [program_row(s, a.reports) for s in a.program]
    if a.json:
        fileio.write_text_atomic(a.json, json.dumps(rows, indent=1) + "\n")
    return (by_target(rows) if a.by_target else markdown(rows)), rows


def main(argv: list[str] | None = None) -> list[dict] | str:
    """Prints the table; returns its rows (the table's text for a table report)."""
    text, rows = _render(sys.argv[1:] if argv is None else argv)
    print(text)
    return rows or text


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
