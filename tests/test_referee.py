"""The referee (eval/referee.py) on synthetic clips of the toy world, and ``eval game`` end to end on a small world."""

import dataclasses
import json
import os

import numpy as np
import pytest

from animegamer_jax.commands.eval import main as eval_main
from animegamer_jax.data import toy_motion, toy_sprites, toy_world
from animegamer_jax.eval import referee
from configs import tiny

BGS = list(toy_sprites.BACKGROUNDS)[:6]
TIMES = toy_motion.turn_times(2.0, 17, 8.0)


@pytest.fixture(scope="module")
def world():
    """(referee at 64x96, characters): 8 characters of seed 0 on the 6 default backgrounds (no files)."""
    chars = toy_sprites.make_characters(8)
    manifest = {"size": [192, 128], "fps": toy_motion.TOY_FPS, "backgrounds": {b: toy_sprites.BACKGROUNDS[b] for b in BGS},
                "characters": [{**dataclasses.asdict(c), "heldout": False} for c in chars]}
    return referee.Referee(manifest, 64, 96), chars


def _turn(motion, quick, bg, start=toy_motion.START):
    end = toy_motion.advance(start, motion, quick, 2.0)
    return {"motion": motion, "quick": quick, "background": bg, "start": start.to_json(), "end": end.to_json(),
            "states": list(toy_motion.state_changes(motion, quick))}


def test_every_action_on_every_background(world):
    """Each of the 13 actions read back from the engine's render (exact, and through H.264 for a few), with the
    character and the background; the sprite at the border, after a shrink, on two backgrounds of one hue."""
    ref, chars = world
    starts = [toy_motion.START, toy_motion.State(0.3, 0.75, 0.0), toy_motion.State(0.65, 1.3, 0.0)]
    n = 0
    for i, (m, q) in enumerate(toy_motion.ACTIONS):
        for j, bg in enumerate(BGS):
            start = next(s for s in starts[(i + j) % 3:] + starts if toy_motion.feasible(s, m, q, 2.0))
            turn, name = _turn(m, q, bg, start), chars[(i + j) % 8].name
            clip = ref.truth_clip(turn, name, TIMES)
            got = ref.score_turn(clip, turn, name, TIMES, states=turn["states"], pixels=False)
            assert (got["motion"], got["quick"] or m == "stand", got["background"], got["character"]) == (
                m, q or m == "stand", bg, name), (m, q, bg, name, got)
            assert got["action_ok"] and got["meters_exact"] and got["meters_mae"] == 0.0
            n += 1
    assert n == 13 * 6
    edge_cases = [("walk_right", True, "sky", toy_motion.State(toy_motion.X_RANGE[0], 1.0, 0.0)),  # from the left wall
                  ("jump", True, "ocean", toy_motion.State(toy_motion.X_RANGE[1], 1.4, 0.0)),  # at the right wall, largest
                  ("spin", False, "sky", toy_motion.State(0.5, toy_motion.SCALE_RANGE[0], 0.0)),  # after shrinking
                  ("shrink", True, "ocean", toy_motion.State(0.2, 1.0, 0.0)),  # the sky's hue, its waves
                  ("stand", False, "stripes", toy_motion.State(0.8, 0.6, 1.0))]
    for m, q, bg, start in edge_cases:
        turn = _turn(m, q, bg, start)
        for clip in (ref.truth_clip(turn, chars[3].name, TIMES), ref.film_clip(turn, chars[3].name, TIMES)):
            got = ref.score_turn(clip, turn, chars[3].name, TIMES, states=(0, 0, 0))
            assert got["action_ok"] and got["background_ok"] and got["character_ok"], (m, bg, got)
            assert got["meters_exact"] is (tuple(turn["states"]) == (0, 0, 0))
    # pixels: the render against itself, then through H.264 (about 40 dB)
    turn = _turn("jump", False, "desert")
    exact = ref.score_turn(ref.truth_clip(turn, chars[0].name, TIMES), turn, chars[0].name, TIMES)
    coded = ref.score_turn(ref.film_clip(turn, chars[0].name, TIMES), turn, chars[0].name, TIMES)
    assert exact["psnr"] == 100.0 and exact["ssim"] == pytest.approx(1.0)
    assert 30 < coded["psnr"] < 60 and 0.95 < coded["ssim"] < 1.0


def test_soft_and_bright_clips_are_read(world):
    """A clip decoded softer (Gaussian blur, sigma 1 px) or brighter (+30 levels) than the engine draws it:
    every action on every background, at least 76 of 78 read right (action, character, background)."""
    import cv2

    ref, chars = world
    for name, change in (("blur", lambda c: np.stack([cv2.GaussianBlur(f, (0, 0), 1.0) for f in c])),
                         ("bright", lambda c: np.clip(c.astype(int) + 30, 0, 255).astype(np.uint8))):
        ok = np.zeros(3, int)
        for i, (m, q) in enumerate(toy_motion.ACTIONS):
            for j, bg in enumerate(BGS):
                turn = _turn(m, q, bg, toy_motion.State(0.5, 1.3 if m == "shrink" else 1.0, 0.0))
                who = chars[(i + 2 * j) % 8].name
                got = ref.score_turn(change(ref.truth_clip(turn, who, TIMES)), turn, who, TIMES, pixels=False)
                ok += (got["action_ok"], got["character_ok"], got["background_ok"])
        assert (ok >= 76).all(), (name, ok)


def test_wrong_clips_are_wrong(world):
    """Another character, another background, another action, an empty plate, a turn that jumps away."""
    ref, chars = world
    turn = _turn("walk_left", False, "sky")
    other = ref.truth_clip(_turn("grow", True, "desert"), chars[5].name, TIMES)
    got = ref.score_turn(other, turn, chars[0].name, TIMES, states=(1, 2, -1))
    assert got["motion"] == "grow" and got["quick"] and got["background"] == "desert" and got["character"] == chars[5].name
    assert not (got["motion_ok"] or got["action_ok"] or got["background_ok"] or got["character_ok"])
    assert got["meters_exact"] is False and got["meters_mae"] == pytest.approx((1 + 2 + 0) / 3)  # truth (0, 0, -1)
    slow = ref.score_turn(ref.truth_clip(_turn("walk_left", True, "sky"), chars[0].name, TIMES), turn, chars[0].name,
                          TIMES)
    assert slow["motion_ok"] and not slow["action_ok"]  # the right motion at the wrong speed
    plate = np.repeat(np.clip(np.rint(ref.plates[0][0]), 0, 255).astype(np.uint8)[None], 17, axis=0)
    empty = ref.score_turn(plate, turn, chars[0].name, TIMES)
    assert empty["motion"] == "none" and empty["character"] is None and empty["first"] is None
    assert empty["background_ok"]
    # continuity: consecutive turns continue; a turn that starts elsewhere does not
    t1 = _turn("walk_right", True, "sky")
    t2 = _turn("jump", False, "desert", toy_motion.State.from_json(t1["end"]))
    far = _turn("jump", False, "desert", toy_motion.State(0.2, 0.7, 0.0))
    a, b, c = (ref.score_turn(ref.truth_clip(t, chars[1].name, TIMES), t, chars[1].name, TIMES, pixels=False)
               for t in (t1, t2, far))
    assert referee.continuous(a, b) and not referee.continuous(a, c) and not referee.continuous(a, empty)
    assert a["position_ok"] and b["position_ok"] and c["position_ok"]  # each where its own start state says
    moved = ref.score_turn(ref.truth_clip(far, chars[1].name, TIMES), t2, chars[1].name, TIMES, pixels=False)
    assert moved["action_ok"] and not moved["position_ok"]  # the right jump from the wrong place
    with pytest.raises(ValueError, match="17"):
        ref.score_turn(ref.truth_clip(t1, chars[1].name, TIMES)[:9], t1, chars[1].name, TIMES)
    rep = referee.summarize({"long": [[a, b, c, a, b, c]]}, {"backgrounds": BGS, "characters": [0] * 8})
    assert rep["by_turn"]["turns"] == ["1-5", "6-6"] and rep["by_turn"]["continuity"] == [0.5, 0.0]
    assert rep["splits"]["long"]["num_turns"] == 6 and rep["chance"]["character"] == 1 / 8
    assert rep["chance"]["action"] == 1 / 13 and rep["chance"]["motion"] == 1 / 7
    with pytest.raises(ValueError, match="expected"):
        ref.read(np.zeros((3, 32, 48, 3), np.uint8))


SMALL = dict(num_characters=8, num_heldout=2, films_per_character=1, scenes_per_film=3, scene_seconds=2.0,
             num_games=2, num_turns=3, long_turns=6)


@pytest.fixture(scope="module")
def small_world(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("refworld") / "world")
    toy_world.make_toy_world(out, tiny.get_config().data, **SMALL)
    return out


def _report(out):
    return json.loads(open(os.path.join(out, "report.json")).read())


@pytest.mark.slow
def test_eval_game_ground_truth_retrieval_and_standin(small_world, tmp_path, capsys):
    """``eval game`` on a K = 8 world: the ground truth at the ceiling, the retrieval floor below it on held-out
    characters, the stand-in near chance; one-line errors for bad flags."""
    gt = str(tmp_path / "gt")
    assert eval_main(["game", "--ground_truth", "--world", small_world, "--out", gt]) == 0
    rep = _report(gt)
    assert set(rep["splits"]) == set(toy_world.SPLITS) and rep["kind"] == "ground_truth"
    for split, cols in rep["splits"].items():
        assert cols["num_turns"] == 6  # 2 games x 3 turns; the long game's 6
        for c in ("motion", "action", "background", "character", "meters_exact", "continuity"):
            assert cols[c] == 1.0, (split, c)
        assert cols["meters_mae"] == 0.0 and cols["psnr"] > 30
    assert len(rep["by_turn"]["turns"]) == 2 and len(rep["turns"]) == 24
    assert "| seen | 6 |" in open(os.path.join(gt, "report.md")).read()
    vae = str(tmp_path / "vae")  # the same clips through the shipped tiny system's VAE (never tuned on toy clips)
    assert eval_main(["game", "--ground_truth", "--system", "checkpoints/tiny_system", "--world", small_world,
                      "--out", vae, "--splits", "seen", "--games", "1"]) == 0
    v = _report(vae)
    assert v["system"].endswith("(its VAE)") and v["splits"]["seen"]["num_turns"] == 3
    assert 10 < v["splits"]["seen"]["psnr"] < rep["splits"]["seen"]["psnr"] - 5
    rt = str(tmp_path / "rt")
    assert eval_main(["game", "--retrieval", "--world", small_world, "--out", rt, "--nopixels"]) == 0
    r = _report(rt)["splits"]
    assert r["heldout_characters"]["character"] == 0.0  # no training clip shows a held-out character
    assert r["seen"]["character"] == 1.0 and r["seen"]["continuity"] < 1.0  # clips start where their scene did
    st = str(tmp_path / "st")
    assert eval_main(["game", "--standin", "--world", small_world, "--out", st, "--nopixels"]) == 0
    s = _report(st)
    for col in ("motion", "action", "character"):  # within 2x of chance (1/7, 1/13, 1/8)
        assert np.mean([t[col + "_ok"] for t in s["turns"]]) <= 2 * s["chance"][col], col
    assert all(cols["motion"] == cols["action"] == 0.0 for cols in s["splits"].values())  # noise moves like no action
    assert os.path.isdir(os.path.join(st, "games", "seen", s["turns"][0]["game_id"]))
    capsys.readouterr()
    bad = [(["game", "--world", small_world, "--out", str(tmp_path / "x")], "pass --system"),
           (["game", "--ground_truth", "--retrieval", "--world", small_world, "--out", str(tmp_path / "x")], "one of"),
           (["game", "--retrieval", "--system", "checkpoints/tiny_system", "--world", small_world, "--out",
             str(tmp_path / "x")], "drop --system"),
           (["game", "--ground_truth", "--world", small_world, "--out", str(tmp_path / "x"), "--splits", "nope"],
            "unknown"),
           (["game", "--ground_truth", "--world", str(tmp_path / "none"), "--out", str(tmp_path / "x")],
            "no toy world")]
    for args, msg in bad:
        assert eval_main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], (args, err)
    assert not os.path.exists(str(tmp_path / "x"))
