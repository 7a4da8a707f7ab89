"""benchmarks/referee_report.py: the referee's reports as one table report, and one more row added into it."""

import json

from animegamer_jax.eval import referee
from benchmarks import referee_report


def _report(v: float) -> dict:
    cols = {c: v for c in referee.COLUMNS}
    return {"splits": {s: dict(cols, num_turns=192) for s in referee_report.SPLITS},
            "chance": {c: 0.1 for c in referee.COLUMNS}, "by_turn": {"turns": ["1-5", "96-100"],
                                                                     **{c: [v, v] for c in referee.COLUMNS}}}


def test_rows_go_in_before_chance_and_keep_their_order(tmp_path):
    base, more = tmp_path / "base.json", tmp_path / "more.json"
    (tmp_path / "a.json").write_text(json.dumps(_report(1.0)))
    (tmp_path / "b.json").write_text(json.dumps(_report(0.5)))
    assert referee_report.main(["--row", f"truth={tmp_path / 'a.json'}", "--command", "c1", "--out", str(base)]) == 0
    assert referee_report.main(["--into", str(base), "--row", f"recipe={tmp_path / 'b.json'}", "--command", "c2",
                                "--note", "the recipe", "--out", str(more)]) == 0
    doc = json.loads(more.read_text())
    summary = doc["tables"][0]
    assert [r[0] for r in summary["rows"]] == ["truth", "recipe", "chance"]
    assert summary["rows"][1][1] == "50.0 / 50.0 / 50.0 / 50.0 / 50.0"
    assert [r[0] for r in doc["tables"][1]["rows"]] == ["truth", "recipe"]
    assert doc["commands"] == ["c1", "c2"] and doc["notes"][-1] == "the recipe"
    assert referee_report.main(["--into", str(tmp_path / "a.json"), "--row", f"x={tmp_path / 'b.json'}",
                                "--out", str(more)]) == 2  # a report that is no table report: one line, exit 2
