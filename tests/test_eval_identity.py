"""Identity accuracy (eval/identity.py) on synthetic clips: nearest of K references in an image embedding."""

import json
import os

import numpy as np
import pytest

from animegamer_jax.data import toy_sprites, toy_world
from animegamer_jax.commands.eval import main as eval_main
from animegamer_jax.eval import embedders, identity
from animegamer_jax.game.folder import hud
def _refs():
    """3 toy characters on grey, 64x96."""
    chars = toy_sprites.make_characters(3)
    return np.stack([toy_sprites.reference_image(c, (96, 64)) for c in chars])


def _clip(ref, rs, t=9):
    """A clip of a reference: small shifts and pixel noise per frame (uint8 [T, 64, 96, 3])."""
    frames = [np.clip(np.roll(ref, rs.randint(-3, 4), axis=1).astype(int) + rs.randint(-20, 21, ref.shape), 0, 255)
              for _ in range(t)]
    return np.stack(frames).astype(np.uint8)


def test_clips_of_a_character_are_nearest_its_reference():
    refs, rs = _refs(), np.random.RandomState(0)
    named = [0, 1, 2, 2, 1, 0]
    clips = [_clip(refs[k], rs) for k in named]
    embed = embedders.standin_embedder().image
    res = identity.identity_accuracy(clips, named, refs, embed)
    assert res["accuracy"] == 1.0 and res["chance"] == pytest.approx(1 / 3) and res["num_clips"] == 6
    assert res["predicted"] == named and res["per_character"][2] == {"accuracy": 1.0, "num_clips": 2}
    wrong = identity.identity_accuracy(clips, [1, 2, 0, 0, 2, 1], refs, embed)  # every turn named another one
    assert wrong["accuracy"] == 0.0 and wrong["predicted"] == named
    scores = identity.identity_scores(clips[:1], refs, embed, frames_per_clip=0)
    assert scores.shape == (1, 3) and scores[0].argmax() == 0 and scores.max() <= 1.0
    with pytest.raises(ValueError, match="index the 3"):
        identity.identity_accuracy(clips[:1], [3], refs, embed)
    with pytest.raises(ValueError, match="one named character per clip"):
        identity.identity_accuracy(clips, [0], refs, embed)


def test_toy_references(tmp_path):
    world = str(tmp_path / "w")
    from configs import tiny
    toy_world.make_toy_world(world, tiny.get_config().data, num_characters=3, num_heldout=1, films_per_character=1,
                             scenes_per_film=2, scene_seconds=2.0, size=(48, 32), fps=8.0, seed=5)
    names, refs, held = identity.toy_references(world)
    assert names == [c.name for c in toy_sprites.make_characters(3, seed=5)] and refs.shape == (3, 32, 48, 3)
    assert sum(held) == 1 and np.array_equal(refs[1], toy_world.load_reference(world, names[1]))


def _scene(c, bg_name, cx, cy, radius, t=3, w=96, h=64):
    """uint8 [t, h, w, 3]: toy character ``c`` drawn at (cx, cy) px with ``radius`` px on a toy background,
    drifting one px a frame."""
    frames = []
    for k in range(t):
        canvas = toy_sprites.background(bg_name, w, h).astype(np.float32)
        toy_sprites.draw_sprite(canvas, c, cx + k, cy, radius)
        frames.append(canvas.astype(np.uint8))
    return np.stack(frames)


def test_crop_feature_finds_small_moving_sprites_the_standin_does_not():
    chars = toy_sprites.make_characters(3)
    refs = np.stack([toy_sprites.reference_image(c, (96, 64)) for c in chars])  # centred, radius 12.8 px, grey
    # small sprites away from the centre, at other sizes, on striped / checkered backgrounds
    places = [("stripes", 20, 20, 7), ("checkered", 70, 40, 9), ("stripes", 60, 32, 16), ("checkered", 25, 45, 6)]
    named = [0, 1, 2, 0, 1, 2, 0, 1, 2, 1, 2, 0]
    clips = [_scene(chars[k], *places[i % len(places)]) for i, k in enumerate(named)]
    mask = identity.foreground_mask(clips[0][:1])[0]
    ys, xs = np.nonzero(mask)
    assert mask.shape == (64, 96) and 100 < mask.sum() < 300  # the sprite (~pi 7^2 px), no stripes
    assert abs(ys.mean() - 20) < 2 and abs(xs.mean() - 20) < 2
    feat = identity.crop_feature(refs)
    assert feat.shape == (3, 16 * 16 * 3) and feat.dtype == np.float64 and np.abs(feat).max() <= 0.5
    res = identity.identity_accuracy(clips, named, refs, identity.crop_feature)
    assert res["accuracy"] == 1.0 and res["predicted"] == named
    # the whole-frame stand-in sees backgrounds and positions, not the sprite
    standin = identity.identity_accuracy(clips, named, refs, embedders.standin_embedder().image)
    assert standin["accuracy"] <= 0.5
    blank = identity.crop_feature(np.stack([toy_sprites.background("sky", 96, 64)]))  # no foreground: zeros
    assert not blank.any()
    with pytest.raises(ValueError, match=r"\[N, H, W, 3\]"):
        identity.crop_feature(refs[0])


def test_command_parts_games_scores_and_bad_inputs(tmp_path, capsys):
    """The command's games (deterministic, one character each, the world's scenes), scoring split by
    seen / held-out, the turn clip under the HUD, and one-line errors before anything loads."""
    world = str(tmp_path / "w")
    from configs import tiny
    toy_world.make_toy_world(world, tiny.get_config().data, num_characters=3, num_heldout=1, films_per_character=1,
                             scenes_per_film=2, scene_seconds=2.0, size=(48, 32), fps=8.0, seed=5)
    games = identity.toy_games(world, 2, 3, seed=1)
    assert games == identity.toy_games(world, 2, 3, seed=1) and games != identity.toy_games(world, 2, 3, seed=2)
    names, refs, held = identity.toy_references(world)
    assert [g["game_id"] for g in games] == [f"{n.lower()}-{k}" for n in names for k in range(2)]
    assert len({g["seed"] for g in games}) == 6
    manifest = toy_world.read_manifest(world)
    actions = {sc["action"] for f in manifest["films"] for sc in f["scenes"]}
    for g in games:
        assert len(g["turns"]) == 3
        for t in g["turns"]:
            char, motion, bg = (p.split(": ", 1)[1] for p in t.rstrip(".").split("; "))
            assert char == g["character"] and motion in actions and bg in toy_sprites.BACKGROUNDS.values()
    # scoring: clips of characters 0 (seen) and the held-out one, each nearest its own reference but one
    h = held.index(True)
    chars = toy_sprites.make_characters(3, seed=5)
    clips = [np.stack([toy_sprites.reference_image(chars[k], (96, 64))] * 2) for k in (0, h, h)]
    s = identity.score_games(clips, [0, h, 0], refs, held, names, identity.crop_feature)
    assert s["seen"] == 0.5 and s["heldout"] == 1.0 and s["all"] == pytest.approx(2 / 3)
    assert s["num_clips"] == {"all": 3, "seen": 2, "heldout": 1}
    assert s["per_character"] == {names[0]: 0.5, names[h]: 1.0}
    # a turn video's clip cut from under its HUD (frames enlarged 3x: 96 px wide < 240)
    clip = (np.arange(2 * 64 * 96 * 3) % 251).astype(np.uint8).reshape(2, 64, 96, 3)
    with_hud = hud.draw_hud(clip, {"social": 1, "entertainment": 2, "stamina": 3}, "Character: Pip", 0)
    assert np.array_equal(hud.clip_from_hud(with_hud, (64, 96)), clip)
    # bad inputs: one line, exit 2, nothing written
    out = str(tmp_path / "out")
    assert eval_main(["identity", "--system", "checkpoints/tiny_system", "--world", str(tmp_path / "none"), "--out", out]) == 2
    assert "no toy world" in capsys.readouterr().err and not os.path.exists(out)
    assert eval_main(["identity", "--world", world, "--out", out]) == 2
    assert "--system is required" in capsys.readouterr().err
    # --ground_truth: the world's own films, no system
    assert eval_main(["identity", "--ground_truth", "--world", world, "--out", out]) == 0
    gt = json.load(open(os.path.join(out, "ground_truth.json")))
    assert gt["identity"]["crop"]["all"] == 1.0 and gt["identity"]["crop"]["num_clips"]["heldout"] >= 1
    assert "| crop | 100.0 % | 100.0 % | 100.0 % |" in capsys.readouterr().out
