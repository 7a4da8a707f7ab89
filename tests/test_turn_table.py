"""benchmarks/turn_table.py: one table of roofline turns assembled from animegamer-aot JSON reports."""

import json

import pytest

from benchmarks import turn_table

V6E = {"name": "v6e", "hbm_bytes": 32 * 2**30, "bf16_flops": 918e12, "hbm_bytes_per_s": 1640e9}


def _report(path, programs, chip=V6E):
    rows = [{"program": n, "kind": "turn", "note": "", "layout": "latency", "roofline_s": s, "runs": runs,
             "arguments": args, "temporaries": temps, "outputs": 0.0, "aliased": 0.0, "peak": args + temps,
             "first_chunk": chunk} for n, s, runs, args, temps, chunk in programs]
    path.write_text(json.dumps({"chip": chip, "programs": rows}))
    return str(path)


@pytest.fixture
def reports(tmp_path):
    g = 2**30
    bf16 = _report(tmp_path / "bf16.json", [("prefill", 0.030, 1, 13 * g, 0.1 * g, [1, 1]),
                                            ("decode", 0.010, 3, 13 * g, 0.1 * g, [1, 1]),
                                            ("pass_b", 0.020, 1, 12 * g, 0.0, [1, 1]),
                                            ("dit", 0.250, 1, 3 * g, 1 * g, [1, 1]),
                                            ("vae_decode", 0.400, 1, 0.5 * g, 4 * g, [2, 8]),
                                            ("preview_decode", 0.008, 1, 0.01 * g, 0.1 * g, [1, 1])])
    int8 = _report(tmp_path / "int8.json", [("prefill", 0.020, 1, 7 * g, 0.1 * g, [1, 1]),
                                            ("decode", 0.005, 3, 7 * g, 0.1 * g, [1, 1]),
                                            ("pass_b", 0.010, 1, 7 * g, 0.0, [1, 1])])
    return bf16, int8


def test_full_preview_and_int8_rows_add_up(reports, capsys):
    bf16, int8 = reports
    full, preview, both, q = turn_table.main([
        "--row", f"ONE v6e|student-4|bf16|full={bf16}", "--row", f"ONE v6e|student-4|bf16|preview={bf16}",
        "--row", f"ONE v6e|student-4|bf16|preview_then_full={bf16}",
        "--row", f"ONE v6e|student-4|int8|full={int8}+{bf16}"])
    mllm_dit = 0.030 + 0.030 + 0.020 + 0.250
    assert full["turn_s"] == pytest.approx(mllm_dit + 0.400)
    assert full["ttff_s"] == pytest.approx(mllm_dit + 0.400 * 2 / 8)  # the VAE's first chunk: 2 of 8 latent frames
    assert preview["turn_s"] == preview["ttff_s"] == pytest.approx(mllm_dit + 0.008)
    assert both["ttff_s"] == pytest.approx(mllm_dit + 0.008) and both["turn_s"] == pytest.approx(mllm_dit + 0.408)
    assert q["turn_s"] == pytest.approx(0.020 + 0.015 + 0.010 + 0.250 + 0.400)  # int8 MLLM from the first file
    # resident: the MLLM's largest args (13) + DiT (3) + VAE (0.5) + the largest stage's activations (VAE: 4) GiB
    assert full["resident_gib"] == pytest.approx(20.5) and full["resident_fraction"] == pytest.approx(20.5 / 32)
    out = capsys.readouterr().out
    assert "| ONE v6e | student-4 | int8 | full |" in out and f"**{q['turn_s']:.3f} / {q['turn_s'] / 0.4:.3f} s**" in out


def test_bad_rows_are_one_line(reports, tmp_path, capsys):
    bf16, int8 = reports
    h100 = _report(tmp_path / "h100.json", [("prefill", 0.01, 1, 0, 0, [1, 1])], chip=dict(V6E, name="h100"))
    for row, says in [(f"ONE v6e|student-4|int8|full={int8}", "no compiled latency-layout dit, vae_decode"),
                      (f"x|y|z|full={int8}+{h100}", "mixes reports of chips ['h100', 'v6e']"),
                      (f"x|y|z|fast={bf16}", "decoder 'fast' is not one of"),
                      (f"x|full={bf16}", "is not TARGET|SAMPLER|MLLM|DECODER"),
                      (f"x|y|z|full={tmp_path / 'none.json'}", "no such report")]:
        with pytest.raises(SystemExit) as e:
            turn_table.main(["--row", row])
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, (row, err)


def test_by_target_puts_targets_in_columns_and_programs_in_rows(reports, tmp_path, capsys):
    bf16, int8 = reports
    h100 = _report(tmp_path / "h100.json", [("dit", 0.120, 1, 3 * 2**30, 0.5 * 2**30, [1, 1])],
                   chip=dict(V6E, name="h100", hbm_bytes=80 * 2**30))
    rows = turn_table.main(["--by_target", "--row", f"ONE v6e|student-4|int8|full={int8}+{bf16}",
                            "--row", f"ONE v6e|student-4|bf16|none={bf16}"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| **turn s**, first frame s at 100 / 40 %; resident GiB | ONE v6e |"
    q = rows[0]
    assert out[2] == (f"| student-4, int8, full | **{q['turn_s']:.3f} / {q['turn_s'] / 0.4:.3f}**; "
                      f"{q['ttff_s']:.3f} / {q['ttff_s'] / 0.4:.3f}; 14.5 (45 %) |")
    assert out[3] == "| student-4, bf16, none | **0.330 / 0.825** |"  # MLLM + DiT only
    turn_table.main(["--by_target", "--reports", str(tmp_path), "--program", "ONE v6e|dit=bf16.json:dit",
                     "--program", "ONE H100|dit=h100.json:dit"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| peak GiB (% HBM); ms | ONE v6e | ONE H100 |"
    assert out[2] == "| dit | 4.00 (12 %); 250.0 | 3.50 (4 %); 120.0 |"


def test_results_md_tables_are_the_reports_rendered(capsys, monkeypatch):
    """Every `python -m benchmarks.turn_table` command in docs/results.md, run on the checked-in
    reports, prints exactly the table that follows it there."""
    import pathlib
    import re
    import shlex

    root = pathlib.Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "results.md").read_text()
    monkeypatch.chdir(root)
    commands = [m.group(1).replace("\\\n", " ") for m in
                re.finditer(r"^python -m benchmarks\.turn_table ((?:.*\\\n)*.*)$", doc, flags=re.M)]
    assert len(commands) >= 3
    for command in commands:
        turn_table.main(shlex.split(command))
        table = capsys.readouterr().out.strip()
        assert table.count("\n") >= 2 and f"```\n\n{table}\n" in doc, command


def test_table_report_prints_all_tables_or_its_headline(tmp_path, capsys):
    doc = {"question": "q?", "source": "made by hand", "commands": ["animegamer-aot --program=x"], "notes": ["n 7.5"],
           "tables": [{"name": "t", "columns": ["what", "A", "B"],
                       "rows": [["r1", "1.0; **2.5 s**; 9 s", "3.0; 4.5 s"], ["r2", "x", "-"]]}],
           "headline": {"table": "t", "columns": ["what", "B"], "rows": [["r1 step", "r1", 1]]}}
    path = tmp_path / "q.json"
    path.write_text(json.dumps(doc))
    assert turn_table.main(["--reports", str(path), "--headline"]) == "| what | B |\n|---|---|\n| r1 step | 4.5 s |"
    capsys.readouterr()
    full = turn_table.main(["--reports", str(path)])
    assert "source: made by hand" in full and "animegamer-aot --program=x" in full and "- n 7.5" in full
    assert "### t\n| what | A | B |\n|---|---|---|\n| r1 | 1.0; **2.5 s**; 9 s | 3.0; 4.5 s |\n| r2 | x | - |" in full
    for bad, says in [({"table": "t", "columns": None, "rows": [["r3", "r3", None]]}, "headline row 'r3' is not in"),
                      ({"table": "u", "columns": None, "rows": None}, "no table named 'u'")]:
        path.write_text(json.dumps(dict(doc, headline=bad)))
        with pytest.raises(SystemExit) as e:
            turn_table.main(["--reports", str(path), "--headline"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_results_md_points_at_reports_that_print(capsys, monkeypatch):
    """Every "all figures" report docs/results.md names prints, records its source, and holds the
    headline's figures in its full print."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    doc = (root / "docs" / "results.md").read_text()
    reports = re.findall(r"\(all figures[^`]*`python -m benchmarks\.turn_table --reports (\S+\.json)`", doc)
    assert len(reports) >= 10
    for path in reports:
        full = turn_table.main(["--reports", path])
        assert "source: " in full and "### " in full, path
        for line in turn_table.main(["--reports", path, "--headline"]).splitlines()[2:]:
            for cell in line.strip("|").split(" | ")[1:]:
                assert cell.strip() in full, (path, cell)
        capsys.readouterr()
