"""python -m animegamer_jax.commands.eval identity end to end: the shipped tiny system on a tiny toy world, games
named after each character without and with its reference, scored; the decoder PSNR without / with."""

import json
import os

import numpy as np
import pytest

from animegamer_jax.commands.eval import main as eval_main
from animegamer_jax.eval.games import played_clips
from animegamer_jax.eval import identity
from animegamer_jax.game.folder import layout
from animegamer_jax.train import toy_world as toy_driver
from configs import tiny
from tests.subproc import ROOT

CKPT = os.path.join(ROOT, "checkpoints", "tiny_system")
WORLD = dict(num_characters=3, num_heldout=1, num_backgrounds=2, films_per_character=1, scenes_per_film=2,
             scene_seconds=2.0, size=(96, 64), fps=8.0, seed=5)


@pytest.mark.slow
@pytest.mark.paper  # about 60 s on 2 cores: `make test-paper` (CI's 15 minutes leave no room)
def test_identity_command_end_to_end(tmp_path, capsys):
    data = toy_driver.make_data(str(tmp_path / "data"), tiny.get_config().data, **WORLD)
    out = str(tmp_path / "out")
    argv = ["--system", CKPT, "--world", data["world"], "--out", out, "--games_per_character", "1", "--turns", "1",
            "--decoder_clips", "1", "--dataset", data["train"]]
    assert eval_main(["identity", *argv]) == 0
    rep = json.load(open(os.path.join(out, "report.json")))
    names = list(rep["characters"])
    assert len(names) == 3 and sum(rep["characters"].values()) == 1 and rep["chance"] == pytest.approx(1 / 3)
    for feat in ("crop", "standin"):
        for v in ("without", "with"):
            r = rep["identity"][feat][v]
            assert r["num_clips"] == {"all": 3, "seen": 2, "heldout": 1} and 0.0 <= r["all"] <= 1.0
            assert sorted(r["per_character"]) == sorted(names)
    for g in identity.toy_games(data["world"], 1, 1):
        plain, ref = (layout.read_json(os.path.join(out, v, g["game_id"], "game.json")) for v in ("without", "with"))
        assert plain["turns"][0]["instruction"] == ref["turns"][0]["instruction"] == g["turns"][0]
        a, b = (played_clips(os.path.join(out, v, g["game_id"]))[0] for v in ("without", "with"))
        assert a.shape == b.shape == (17, 64, 96, 3) and not np.array_equal(a, b)  # the reference changed the turn
        assert os.path.isfile(os.path.join(out, "with", g["game_id"], "characters", f"{g['character']}.png"))
    d = rep["decoder"]
    assert d["clips"] == 1 and d["without"] != d["with"] and d["without"] > 5 and d["with"] > 5
    assert "reference" in d["per_clip"]["with"][0] and "reference" not in d["per_clip"]["without"][0]
    assert set(rep["acceptance"]) >= {"heldout_with", "heldout_3x_chance", "decoder_ok"}
    assert "| crop | with |" in open(os.path.join(out, "report.md")).read()
    capsys.readouterr()
    # rerun: every game is finished, nothing is played again, the same figures
    assert eval_main(["identity", *argv + ["--decoder_clips", "0"]]) == 0
    assert "0 games to play, 3 already finished" in capsys.readouterr().out
    again = json.load(open(os.path.join(out, "report.json")))
    assert again["identity"] == rep["identity"] and "decoder" not in again
    # other settings into the same folder are refused, nothing is overwritten
    before = open(os.path.join(out, "games.jsonl")).read()
    assert eval_main(["identity", *argv[:6] + ["--turns", "2"]]) == 2
    assert "games of other settings" in capsys.readouterr().err
    assert open(os.path.join(out, "games.jsonl")).read() == before
