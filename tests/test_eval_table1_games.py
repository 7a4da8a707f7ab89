"""Benchmark file format: the shipped benchmark loads; malformed files give clear errors."""

import json
import os

import numpy as np
import pytest

from animegamer_jax.eval import table1_games
from animegamer_jax.game import script
from animegamer_jax.inference import instructions

SHIPPED = "data/benchmark/benchmark.json"


def test_shipped_benchmark_loads():
    b = table1_games.load_benchmark(SHIPPED)
    assert len(b.games) == 3
    assert all(len(g.rounds) == 10 for g in b.games)
    assert b.num_rounds == 30
    refs = b.reference_images()
    assert set(refs) == {"Bunny", "Rider", "Caller"}
    for img in refs.values():
        assert img.dtype == np.uint8 and img.shape == (64, 96, 3)
        assert img.std() > 10  # a real picture, not a blank
    first = b.games[0].rounds[0]
    assert first.turn.text == "Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow."
    assert first.states == (2, 0, 1, -1)
    games = b.to_games()
    assert isinstance(games[0], instructions.Game) and games[0].seed == 11 and len(games[0].turns) == 10


def test_write_jsonl_round_trips_through_game_script(tmp_path):
    b = table1_games.load_benchmark(SHIPPED)
    out = str(tmp_path / "games.jsonl")
    b.write_jsonl(out)
    assert script.load_jsonl(out) == b.to_games()


def _write(tmp_path, obj, name="b.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return str(p)


def _valid(tmp_path):
    from PIL import Image
    Image.fromarray(np.zeros((4, 6, 3), np.uint8)).save(tmp_path / "a.png")
    return {"name": "t", "characters": {"A": "a.png"},
            "games": [{"game_id": "g", "rounds": [
                {"character": "A", "motion": "walk", "background": "day town",
                 "states": {"ML": 1, "SC": 0, "ET": 0, "ST": 0}},
                {"instruction": "Character: A; Motion: run; Background: night town.",
                 "states": [5, -5, 5, 0]}]}]}


def test_minimal_valid_and_instruction_form(tmp_path):
    b = table1_games.load_benchmark(_write(tmp_path, _valid(tmp_path)))
    assert b.games[0].rounds[1].states == (5, -5, 5, 0)
    assert b.games[0].rounds[1].turn.motion == "run"
    assert b.characters["A"] == os.path.join(str(tmp_path), "a.png")


@pytest.mark.parametrize("mutate, message", [
    (lambda o: o.pop("games"), "missing top-level key 'games'"),
    (lambda o: o.update(extra=1), r"unknown key\(s\) \['extra'\]"),
    (lambda o: o["games"][0]["rounds"][0].pop("states"), "round 0: missing 'states'"),
    (lambda o: o["games"][0]["rounds"][0]["states"].update(ML=0), r"state ML must be an integer in 1..5, got 0"),
    (lambda o: o["games"][0]["rounds"][0]["states"].update(SC=6), r"state SC must be an integer in -5..5"),
    (lambda o: o["games"][0]["rounds"][0]["states"].pop("ST"), r"missing \['ST'\]"),
    (lambda o: o["games"][0]["rounds"][0].update(character="B"), r"character\(s\) \['B'\] have no reference image"),
    (lambda o: o["games"][0].update(rounds=[]), "'rounds' must be a non-empty list"),
    (lambda o: o["games"].append(dict(o["games"][0])), "duplicated game_id"),
    (lambda o: o["characters"].update(A="missing.png"), "reference image of 'A' not found"),
    (lambda o: o["games"][0]["rounds"][1].update(instruction="Motion: run"), r"missing field\(s\) Character"),
    (lambda o: o["games"][0].update(seed="x"), "'seed' must be an integer"),
])
def test_malformed_files_name_the_problem(tmp_path, mutate, message):
    obj = _valid(tmp_path)
    mutate(obj)
    with pytest.raises(table1_games.BenchmarkError, match=message):
        table1_games.load_benchmark(_write(tmp_path, obj))


def test_missing_file_and_bad_json(tmp_path):
    with pytest.raises(table1_games.BenchmarkError, match="file not found"):
        table1_games.load_benchmark(str(tmp_path / "nope.json"))
    with pytest.raises(table1_games.BenchmarkError, match=r"b.json:1: invalid JSON"):
        table1_games.load_benchmark(_write(tmp_path, "{not json"))
