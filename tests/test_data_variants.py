"""More sample data from the same footage: overlapping clip windows, film variants (mirror, zoom,
speed) and the rule-based labels whose adverb and states follow the measured motion level."""

import json

import numpy as np
import pytest

from animegamer_jax.data import clips, label_schema, sample, scenes, video
from tests.subproc import ROOT


def test_overlapping_clip_windows():
    shots = [scenes.Scene(0, 0, 132), scenes.Scene(1, 132, 162), scenes.Scene(2, 162, 240)]
    back_to_back = clips.plan_clips("f", shots, 25.0)
    assert [s.start_frame for s in back_to_back] == [0, 50, 162]
    over = clips.plan_clips("f", shots, 25.0, stride_seconds=1.0)
    assert [s.start_frame for s in over] == [0, 25, 50, 75, 162, 187]
    assert [s.clip_index for s in over] == list(range(6))
    for s in over:  # never across a cut, always 2 s
        shot = shots[s.scene_id]
        assert s.end_frame - s.start_frame == 50 and shot.start_frame <= s.start_frame and s.end_frame <= shot.end_frame
    with pytest.raises(ValueError, match="stride_seconds"):
        clips.plan_clips("f", shots, 25.0, stride_seconds=0.01)


def test_rule_based_labels_follow_motion_and_shot():
    slow = sample.clip_label("v", 0, 0.0, 0, 0.5, 1)
    fast = sample.clip_label("v", 1, 1.0, 0, 0.5, 5)
    assert slow.action == "slowly crawl out of burrow" and fast.action == "frantically crawl out of burrow"
    assert (slow.stamina, fast.stamina) == (2, -2) and (slow.entertainment, fast.entertainment) == (1, 2)
    assert sample.clip_label("v", 0, 0.0, 0, 3.0, 3).action == "steadily stretch arms"
    # bikes.mp4 shots by source time (cuts at frames 30, 76, 137, 187 of 25 fps)
    names = [sample.clip_label("v", 0, 0.0, 1, t, 3) for t in (0.5, 2.0, 4.0, 6.0, 8.0)]
    assert [n.action.split(" ", 1)[1] for n in names] == ["traffic flows along road", "cars queue in traffic",
                                                          "ride past van", "cars drive past fence", "walk past bicycle"]
    phone = sample.clip_label("v", 0, 0.0, 2, 3.0, 4)
    assert phone.characters == ("Driver",) and phone.social == 3 and phone.instruction.startswith("Character: Driver;")
    # the states are a function of the instruction: same text -> same states
    seen = {}
    for src, t in ((0, 0.5), (0, 3.0), (1, 4.0), (1, 8.0), (2, 1.0), (2, 3.0)):
        for lv in range(1, 6):
            lab = sample.clip_label("v", 0, 0.0, src, t, lv)
            assert seen.setdefault(lab.instruction, lab.state_changes()) == lab.state_changes()
            assert all(-5 <= v <= 5 for v in lab.state_changes())
    assert len(seen) == 30


def test_film_variants(tmp_path):
    src = (("carphone_pristine.mp4", 0, 12),)
    paths = {}
    for v in (sample.Variant("base"), sample.Variant("mirror", mirror=True), sample.Variant("slow", speed=0.5),
              sample.Variant("zoom", zoom=2.0)):
        paths[v.film_id] = str(tmp_path / f"{v.film_id}.mp4")
        sample.make_sample_film(paths[v.film_id], size=(48, 32), sources=src, variant=v)
    frames = {k: np.stack([f for _, f in video.iter_frames(p)]).astype(np.float32) for k, p in paths.items()}
    n = len(frames["base"])
    # 12 source frames at 29.97 fps = 0.4 s: 11 frames at 25 fps; 0.5x plays 0.8 s: about twice as many
    assert n == 11 and abs(len(frames["slow"]) - 2 * n) <= 1
    assert frames["mirror"].shape == frames["base"].shape == frames["zoom"].shape == (n, 32, 48, 3)
    mirrored_err = np.abs(frames["mirror"] - frames["base"][:, :, ::-1]).mean()
    assert mirrored_err < 4.0 < np.abs(frames["mirror"] - frames["base"]).mean()
    m = len(frames["slow"][::2])
    assert np.abs(frames["slow"][::2] - frames["base"][:m]).mean() < 4.0
    # zoom 2: the centre 24x16 of the 96x64 resize, i.e. a 2x magnification of the base's centre
    centre = frames["base"][:, 8:24, 12:36]
    up = np.repeat(np.repeat(centre, 2, axis=1), 2, axis=2)
    assert np.abs(frames["zoom"] - up).mean() < np.abs(frames["zoom"] - frames["base"]).mean()
    with pytest.raises(ValueError, match="zoom >= 1"):
        sample.make_sample_film(str(tmp_path / "bad.mp4"), sources=src, variant=sample.Variant("bad", zoom=0.5))


def test_committed_variant_labels_parse(monkeypatch):
    monkeypatch.chdir(ROOT)
    ls = label_schema.read_labels("data/sample_variant_labels.jsonl")
    films = {f for f, _ in ls.clips}
    assert films == {v.film_id for v in sample.VARIANTS}
    adverbs = {lab.action.split(" ", 1)[0] for lab in ls.clips.values()}
    assert adverbs <= set(sample.ADVERBS.values()) and len(adverbs) >= 3


def test_heldout_benchmark_is_the_committed_one(monkeypatch):
    from animegamer_jax.eval import table1_games

    monkeypatch.chdir(ROOT)
    bench = sample.heldout_benchmark("data/sample_variant_labels.jsonl")
    with open("data/benchmark/sample_heldout.json") as f:
        assert json.load(f) == bench
    loaded = table1_games.load_benchmark("data/benchmark/sample_heldout.json")
    rounds = [r for g in loaded.games for r in g.rounds]
    assert len(rounds) == 8 and all(g.game_id.startswith(sample.HELDOUT_FILM) for g in loaded.games)
    levels = {v: k for k, v in sample.ADVERBS.items()}
    assert all(r.states[0] == levels[r.turn.motion.split()[0]] for r in rounds)


def test_training_variants_show_each_heldout_action_slow_and_fast(monkeypatch):
    """The held-out turns are learnable from the training variants: every held-out round's action is
    in a training film's labels at the same speed class (adverb level >= 4 or <= 3) with the same ET,
    and the close-ups make the +1 ET of a fast adverb visible within one action (crawl, stretch,
    talk, shout and more appear both slow and fast), not only across actions; and every held-out
    instruction's whole action text (adverb included) is some training clip's."""
    monkeypatch.chdir(ROOT)
    levels = {v: k for k, v in sample.ADVERBS.items()}
    train = [lab for (film, _), lab in label_schema.read_labels("data/sample_variant_labels.jsonl").clips.items()
             if film != sample.HELDOUT_FILM]
    by_action = {}
    for lab in train:
        adverb, action = lab.action.split(" ", 1)
        by_action.setdefault(action, set()).add((levels[adverb] >= 4, lab.entertainment))
    bench = sample.heldout_benchmark("data/sample_variant_labels.jsonl")
    for game in bench["games"]:
        for r in game["rounds"]:
            action = r["motion"].split(" ", 1)[1]
            assert (r["states"]["ML"] >= 4, r["states"]["ET"]) in by_action[action], r
    both = {a for a, seen in by_action.items() if {fast for fast, _ in seen} == {False, True}}
    assert {"crawl out of burrow", "stretch arms", "talk on phone in car", "shout on phone in car"} <= both
    for a in both:  # fast = slow + 1 ET, as sample.clip_label's rule says
        (slow_et,), (fast_et,) = ({e for f, e in by_action[a] if not f}, {e for f, e in by_action[a] if f})
        assert fast_et == slow_et + 1, a
    # every held-out instruction's action text, adverb included, is a training clip's
    # (sample_medium_mirror's "quickly crawl out of burrow": no other training film's crawl measures at
    # level 4), so the held-out turns test unseen clips, not unseen words
    seen = {lab.action for lab in train}
    assert all(r["motion"] in seen for game in bench["games"] for r in game["rounds"])
