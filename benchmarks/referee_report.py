"""The referee's reports (``eval game``'s OUT/report.json) as one table report for docs/results.md.

    python benchmarks/referee_report.py --row "ground truth=GT/report.json" --row "stand-in=ST/report.json" \
        [--row LABEL=REPORT ...] --command "..." [--note "..."] --out benchmarks/reports/referee_toy.json
    python benchmarks/referee_report.py --into benchmarks/reports/referee_toy.json --row "LABEL=REPORT" \
        [--command ...] [--note ...] --out benchmarks/reports/referee_toy.json   # one more row, kept in order

Writes a table report (benchmarks/turn_table.py's format: ``python -m benchmarks.turn_table --reports
FILE [--headline]`` prints it): a summary table (a row per system; per split "motion / action /
background / character / meters exact" in %, the long game's turns 1-5 and 91-100, continuity and PSNR
on the seen split), one full table per split, and the chance row. Exits 2 with one line for a missing or
malformed report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from animegamer_jax.eval import referee  # noqa: E402

SPLITS = ("seen", "heldout_compositions", "heldout_characters", "long")
SHORT = ("motion", "action", "background", "character", "meters_exact")


def _pc(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _cell(cols: dict | None) -> str:
    return "-" if not cols else " / ".join(_pc(cols.get(c)) for c in SHORT)


def _full(c: str, v) -> str:
    if v is None:
        return "-"
    return f"{v:.2f} dB" if c == "psnr" else f"{v:.3f}" if c in ("ssim", "meters_mae") else f"{100 * v:.1f} %"


def build(rows: list[tuple[str, dict]], commands: list[str], notes: list[str], source: str) -> dict:
    """The table report of ``rows`` ((label, report.json content) in order)."""
    summary = []
    for label, rep in rows:
        sp, bt = rep["splits"], rep.get("by_turn") or {}
        first = {c: (bt.get(c) or [None])[0] for c in SHORT}
        last = {c: (bt.get(c) or [None])[-1] for c in SHORT}
        lab = (bt.get("turns") or ["", ""])
        long_cell = f"{_cell(first)} ({lab[0]}); {_cell(last)} ({lab[-1]})" if bt.get("turns") else "-"
        seen = sp.get("seen") or {}
        summary.append([label, _cell(sp.get("seen")), _cell(sp.get("heldout_compositions")),
                        _cell(sp.get("heldout_characters")), long_cell, _pc(seen.get("continuity")),
                        _full("psnr", seen.get("psnr"))])
    chance = rows[0][1]["chance"]
    summary.append(["chance", _cell(chance), _cell(chance), _cell(chance), "-", "-", "-"])
    tables = [{"name": "summary", "columns": ["system", "seen", "held-out compositions", "held-out characters",
                                              "long game (turns)", "continuity (seen) %", "PSNR (seen)"],
               "rows": summary}]
    for split in SPLITS:
        table = [[label] + [_full(c, (rep["splits"].get(split) or {}).get(c)) for c in referee.COLUMNS]
                 + [str((rep["splits"].get(split) or {}).get("num_turns", "-"))] for label, rep in rows]
        tables.append({"name": split, "columns": ["system", *referee.COLUMNS, "turns"], "rows": table})
    return {"question": "Does it follow the player? (the referee on the toy world)", "source": source,
            "commands": commands,
            "notes": ["Cells of the summary: motion / action / background / character / meters exact, % of the "
                      "split's turns (32 games x 6 turns; the long game: one of 100, per 5-turn bucket).", *notes],
            "tables": tables,
            "headline": {"table": "summary", "columns": None, "rows": None}}


def add_rows(doc: dict, new: dict) -> dict:
    """``doc`` (a table report of :func:`build`) with the rows of ``new`` (another, of the new reports) added:
    before the chance row in the summary, at the end of each split's table; its commands and notes (past
    the common first note) appended."""
    for table in doc["tables"]:
        extra = next(t for t in new["tables"] if t["name"] == table["name"])["rows"]
        extra = [r for r in extra if r[0] != "chance"]
        at = next((i for i, r in enumerate(table["rows"]) if r[0] == "chance"), len(table["rows"]))
        table["rows"][at:at] = extra
    doc["commands"] = doc["commands"] + [c for c in new["commands"] if c not in doc["commands"]]
    doc["notes"] = doc["notes"] + new["notes"][1:]
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", action="append", default=[], help="LABEL=PATH of an eval game report.json")
    ap.add_argument("--command", action="append", default=[])
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--source", default="eval game reports, made by the commands below")
    ap.add_argument("--into", default="", help="an existing table report to add the rows to")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    rows = []
    for spec in a.row:
        label, sep, path = spec.partition("=")
        if not sep:
            print(f"error: --row {spec!r}: expected LABEL=PATH", file=sys.stderr)
            return 2
        try:
            rep = json.load(open(path))
            rep["splits"]
        except (OSError, ValueError, KeyError) as e:
            print(f"error: --row {label}: {path}: not an eval game report ({e})", file=sys.stderr)
            return 2
        rows.append((label, rep))
    if not rows:
        print("error: pass at least one --row LABEL=PATH", file=sys.stderr)
        return 2
    doc = build(rows, a.command, a.note, a.source)
    if a.into:
        try:
            doc = add_rows(json.load(open(a.into)), doc)
        except (OSError, ValueError, KeyError, StopIteration) as e:
            print(f"error: --into {a.into}: not a table report of this script ({e})", file=sys.stderr)
            return 2
    with open(a.out, "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
