"""The toy world (data/toy_world.py) through the real data pipeline, and reference pair mining (data/references.py)."""

import hashlib
import json
import os

import numpy as np
import pytest

from animegamer_jax.data import clips, datasets, label_schema, prepare, references, toy_motion, toy_sprites, toy_world
from animegamer_jax.commands.data import main as data_main
from configs import tiny

#: a small world: 4 characters (1 held out), 2 films each of 3 two-second scenes, 128x96 at 10 fps (films
#: of 64x48 do not repeat byte for byte: x264 varies on frames that small)
SMALL = dict(num_characters=4, num_heldout=1, num_backgrounds=3, films_per_character=2, scenes_per_film=3,
             scene_seconds=2.0, size=(128, 96), fps=10.0)


def _data_cfg():
    return tiny.get_config().data  # 64x96, 17 frames at 8 fps, 2 s clips back to back


def _digests(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("toy") / "world")
    return out, toy_world.make_toy_world(out, _data_cfg(), seed=3, **SMALL)


@pytest.mark.slow
def test_same_seed_same_bytes(world, tmp_path):
    out, manifest = world
    again = toy_world.make_toy_world(str(tmp_path / "again"), _data_cfg(), seed=3, **SMALL)
    first = _digests(out)
    assert again == manifest and _digests(str(tmp_path / "again")) == first
    # 4 references, 8 films, labels, manifest, 4 game scripts and their truth
    assert sorted(first) == sorted(manifest["files"] + ["manifest.json"]) and len(first) == 4 + 8 + 1 + 1 + 5
    other = toy_world.make_toy_world(str(tmp_path / "other"), _data_cfg(), seed=4, **SMALL)
    assert [f["scenes"] for f in other["films"]] != [f["scenes"] for f in manifest["films"]]


def test_pipeline_finds_the_cuts_and_labels_are_ground_truth(world):
    out, manifest = world
    labels = label_schema.read_labels(os.path.join(out, manifest["labels"]))
    assert len(manifest["films"]) == 8
    for film in manifest["films"]:
        specs, shots, info = clips.plan_film(os.path.join(out, film["path"]), film["film_id"], _data_cfg())
        assert film["cut_frames"] == [20, 40] and [s.start_frame for s in shots] == [0, 20, 40]
        assert info.num_frames == 60 and len(specs) == 3
        backgrounds = [s["background"] for s in film["scenes"]]
        assert all(a != b for a, b in zip(backgrounds, backgrounds[1:]))  # a cut always changes the background
        for spec, lab in zip(specs, label_schema.match_labels(film["film_id"], specs, labels)):
            scene = film["scenes"][spec.scene_id]
            verb = toy_motion.MOTIONS[scene["motion"]][0]
            assert lab.characters == (film["character"],) and lab.action.endswith(" " + verb)
            assert lab.background == toy_sprites.BACKGROUNDS[scene["background"]] and lab.action == scene["action"]
    # the first frame of a film shows its character's colours on its first background
    film = manifest["films"][0]
    c = toy_world.character_of(manifest, film["character"])
    frames = clips.resize_center_crop(next(iter(clips.extract_clips(
        os.path.join(out, film["path"]), clips.plan_film(os.path.join(out, film["path"]), "f", _data_cfg())[0][:1],
        64, 96))).first_frame, 64, 96)
    s0 = film["scenes"][0]
    want = toy_motion.render_frame(c, toy_sprites.background(s0["background"], 128, 96), toy_motion.START, s0["motion"],
                                  s0["quick"], 0.0)
    assert np.abs(frames.astype(int) - clips.resize_center_crop(want, 64, 96).astype(int)).mean() < 6


def test_heldout_characters_never_in_training_films(world):
    out, manifest = world
    held = set(manifest["heldout"])
    assert len(held) == 1 and {c["name"] for c in manifest["characters"] if c["heldout"]} == held
    by_id = {f["film_id"]: f for f in manifest["films"]}
    labels = label_schema.read_labels(os.path.join(out, "labels.jsonl"))
    for split in ("train", "heldout"):
        ids = [os.path.splitext(n)[0] for n in sorted(os.listdir(os.path.join(out, split)))]
        assert len(ids) == (6 if split == "train" else 2)
        for film_id in ids:
            names = {n for lab in labels.for_film(film_id) for n in lab.characters} | set(labels.casts[film_id])
            assert (names <= held) if split == "heldout" else not (names & held), (split, film_id, names)
            assert by_id[film_id]["split"] == split
    for c in manifest["characters"]:  # every reference PNG is its sprite on grey
        ref = toy_world.load_reference(out, c["name"])
        want = toy_sprites.reference_image(toy_sprites.Character(c["name"], c["shape"], c["colour"], c["colour2"],
                                                             c["pattern"]), (128, 96))
        assert ref.shape == (96, 128, 3) and np.array_equal(ref, want) and (ref != 128).any()


def _row(film, scene, index, *chars):
    return {"film_id": film, "scene_id": scene, "clip_index": index, "characters": chars}


def test_mine_references_prefers_another_scene_of_the_same_character():
    rows = [_row("a", 0, 0, "Pip"), _row("a", 0, 1, "Pip"), _row("a", 1, 2, "Bolt"), _row("a", 1, 3, "Bolt"),
            _row("b", 0, 0, "Pip"), _row("b", 1, 1, "Mira", "Pip"), _row("b", 1, 2), _row("c", 0, 0, "Zed")]
    refs = references.mine_references(rows, seed=0)
    assert refs[0] == refs[1] == 4  # Pip's only clip in another scene
    assert refs[4] in (0, 1)
    assert refs[2] == 3 and refs[3] == 2  # Bolt has one scene: the other clip of it
    assert refs[5] == -1 and refs[6] == -1 and refs[7] == -1  # Mira alone; nobody; Zed alone
    assert np.array_equal(references.mine_references(rows, seed=0), refs)
    # a reference depends on the set of clips, not their order
    perm = [7, 3, 5, 0, 6, 2, 4, 1]
    shuffled = references.mine_references([rows[i] for i in perm], seed=0)
    assert [perm[j] if j >= 0 else -1 for j in shuffled] == [refs[i] for i in perm]
    many = [_row(f"f{k}", s, i, "Pip") for k in range(3) for s in range(3) for i in range(2)]
    picks = {tuple(references.mine_references(many, seed)) for seed in range(4)}
    assert len(picks) > 1  # the seed matters


@pytest.mark.slow
def test_prepared_toy_world_references(world, tmp_path):
    out, manifest = world
    films = [(f["film_id"], os.path.join(out, f["path"])) for f in manifest["films"] if f["split"] == "train"][:4]
    report = prepare.prepare_dataset(films, os.path.join(out, "labels.jsonl"), str(tmp_path / "ds"), _data_cfg())
    assert report.num_clips == 12 and not report.skipped
    rows = references.clips_with_characters(str(tmp_path / "ds"))
    refs = references.dataset_references(str(tmp_path / "ds"), seed=1)
    assert len(rows) == len(refs) == 12
    for i, j in enumerate(refs):  # each of 2 characters has 2 films of 3 scenes: always another scene
        assert j >= 0 and rows[j]["characters"] == rows[i]["characters"]
        assert (rows[j]["film_id"], rows[j]["scene_id"]) != (rows[i]["film_id"], rows[i]["scene_id"])
    source = datasets.open_split(str(tmp_path / "ds"), "train")
    got = references.reference_frames(source, refs, [0, 5])
    assert got.shape == (2, 64, 96, 3) and got.dtype == np.uint8
    assert np.array_equal(got[1], source[int(refs[5])]["frames"][0])


def test_command(tmp_path, capsys):
    out = tmp_path / "w"
    args = ["--world=toy", f"--out_dir={out}", "--num_characters=3", "--num_heldout=1", "--films_per_character=1",
            "--scenes_per_film=2", "--scene_seconds=2", "--width=32", "--height=32", "--fps=8", "--seed=5",
            "--clip_stride_seconds=0"]
    assert data_main(["sample", *args]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["size"] == [32, 32] and len(manifest["films"]) == 3
    assert "held out" in capsys.readouterr().out
    assert data_main(["sample", *args]) == 0  # its own folder: written again
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    assert data_main(["sample", "--world=toy", f"--out_dir={foreign}", "--num_characters=3", "--num_heldout=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out_dir=") and err.count("\n") == 1
    assert os.listdir(foreign) == ["notes.txt"] and (foreign / "notes.txt").read_text() == "keep"
    assert data_main(["sample", "--world=toy", f"--out_dir={tmp_path / 'x'}", "--num_backgrounds=1"]) == 2
    assert "--num_backgrounds=1" in capsys.readouterr().err


@pytest.mark.slow
def test_phase_r_batches_take_the_mined_references(world, tmp_path):
    """Phase r's reference_frame is the first frame of the mined clip (another scene of the same character),
    picked by the records' dataset index; without the labels file, the within-batch pairing."""
    import shutil

    from animegamer_jax.data import batches
    from tests.train_helpers import phase_config
    out, manifest = world
    labels = str(tmp_path / "labels.jsonl")
    shutil.copy(os.path.join(out, "labels.jsonl"), labels)
    films = [(f["film_id"], os.path.join(out, f["path"])) for f in manifest["films"] if f["split"] == "train"][:4]
    ds = str(tmp_path / "ds")
    prepare.prepare_dataset(films, labels, ds, _data_cfg())
    fn, how = batches.mined_reference_frames(ds, "train", seed=1)
    assert how == "mined"
    refs = references.dataset_references(ds, seed=1)
    source = datasets.open_split(ds, "train")
    idx = np.array([3, 0, 7], np.int32)
    ex = {k: np.stack([source[int(i)][k] for i in idx]) for k in ("frames", "motion_level")}
    ex.update(index=idx, action=np.array(["walk left"] * 3), first_frame=ex["frames"][:, 0])
    cfg = phase_config("r")
    batch = batches.BatchBuilder(cfg, "reference", reference_frames=fn)(ex)
    for row, i in zip(batch["reference_frame"], idx):
        assert int(refs[i]) not in (-1, int(i))
        assert np.array_equal(row, source[int(refs[i])]["frames"][0])
    rows = references.clips_with_characters(ds)
    assert all(rows[int(refs[i])]["characters"] == rows[int(i)]["characters"] for i in idx)
    with pytest.raises(KeyError, match="index"):
        fn({"first_frame": ex["first_frame"]})
    os.remove(labels)  # no character labels: the within-batch default
    fn, how = batches.mined_reference_frames(ds, "train")
    assert how == "within-batch" and fn is batches.pick_reference_frames


def test_characters_from_the_seed_differ_in_two_features():
    chars = toy_sprites.make_characters(60, seed=0)
    assert len({c.name for c in chars}) == 60 and all(c.colour != c.colour2 for c in chars)
    assert all(sum(a != b for a, b in zip(x.features, y.features)) >= 2 for i, x in enumerate(chars) for y in chars[:i])
    assert toy_sprites.make_characters(8, seed=0) == chars[:8]  # a larger draw extends a smaller one
    assert toy_sprites.make_characters(8, seed=1) != chars[:8]
    assert len(toy_sprites.make_characters(toy_sprites.MAX_CHARACTERS, seed=0)) == toy_sprites.MAX_CHARACTERS
    with pytest.raises(ValueError, match="--num_characters"):
        toy_sprites.make_characters(toy_sprites.MAX_CHARACTERS + 1)


def test_states_carry_and_stay_in_range():
    """advance / feasible: a walk stops at the wall, a scale at its bound; jumps and spins end where they began;
    the last frame of a turn and the first of the next one show the sprite at the same place and size."""
    s = toy_motion.State(0.5, 1.0, 0.0)
    assert toy_motion.advance(s, "walk_right", True, 2.0).x == pytest.approx(0.8)
    assert toy_motion.advance(s, "walk_left", False, 2.0).x == pytest.approx(0.35)
    assert toy_motion.advance(toy_motion.State(0.75, 1.0, 0.0), "walk_right", True, 2.0).x == toy_motion.X_RANGE[1]
    assert not toy_motion.feasible(toy_motion.State(0.75, 1.0, 0.0), "walk_right", True, 2.0)
    assert toy_motion.advance(s, "grow", True, 2.0).scale == pytest.approx(1.35)
    assert toy_motion.advance(toy_motion.State(0.5, 1.3, 0.0), "grow", True, 2.0).scale == toy_motion.SCALE_RANGE[1]
    for m, q in toy_motion.ACTIONS:
        if m in ("jump", "spin", "stand"):
            end = toy_motion.advance(s, m, q, 2.0)
            assert end.x == s.x and end.scale == s.scale and min(end.angle, 2 * np.pi - end.angle) < 1e-9
        pose = toy_motion.sprite_pose(s, m, q, 2.0, 192, 128)
        nxt = toy_motion.sprite_pose(toy_motion.advance(s, m, q, 2.0), "stand", False, 0.0, 192, 128)
        assert np.allclose(pose[:3], nxt[:3], atol=1e-6), (m, q)


def test_grown_world_plan_splits_and_games():
    """The default plan: 60 characters (12 held out), 6 backgrounds, films whose scenes continue and never show
    a character's held-out compositions; game scripts whose turns continue, in their split."""
    chars, heldout, held_pairs, films = toy_world.plan_world()
    assert len(chars) == 60 and len(heldout) == 12 and len(films) == 120
    assert set(held_pairs) == {c.name for c in chars} - set(heldout)
    assert all(len(v) == round(0.2 * 7 * 6) for v in held_pairs.values())
    for f in films:
        banned = {tuple(p) for p in held_pairs.get(f["character"], ())}
        state = toy_motion.START
        for a, b in zip(f["scenes"], f["scenes"][1:] + [None]):
            assert toy_motion.State.from_json(a["start"]) == toy_motion.State.from_json(state.to_json())
            assert (a["motion"], a["background"]) not in banned and toy_motion.feasible(state, a["motion"], a["quick"], 2.0)
            assert b is None or b["background"] != a["background"]
            state = toy_motion.advance(state, a["motion"], a["quick"], 2.0)
    bgs = list(toy_sprites.BACKGROUNDS)[:6]
    shown = toy_world.shown_compositions(films)
    games = toy_world.plan_games(chars, heldout, held_pairs, bgs, 2.0, shown=shown)
    assert [len(games[s]) for s in toy_world.SPLITS] == [32, 32, 32, 1] and len(games["long"][0]["turns"]) == 100
    for split, gs in games.items():
        for g in gs:
            assert (g["character"] in heldout) == (split == "heldout_characters")
            banned = {tuple(p) for p in held_pairs.get(g["character"], ())}
            for t, u in zip(g["turns"], g["turns"][1:]):
                assert u["start"] == t["end"]
            for t in g["turns"]:
                assert ((t["motion"], t["background"]) in banned) == (t["composition"] == "heldout")
                pair = (t["motion"], t["background"])
                assert (t["composition"] == "shown") == (split != "heldout_characters" and pair in shown[g["character"]])
                assert t["instruction"] == toy_motion.instruction(g["character"], t["motion"], t["quick"], t["background"])
            if split == "heldout_compositions":
                assert all(t["composition"] == "heldout" for t in g["turns"])
    kinds = {s: [t["composition"] for g in games[s] for t in g["turns"]] for s in toy_world.SPLITS}
    assert kinds["heldout_characters"] == ["new_character"] * 192
    assert kinds["seen"].count("shown") >= 0.95 * 192 and kinds["long"].count("shown") >= 95  # rare fallbacks
    assert games == toy_world.plan_games(chars, heldout, held_pairs, bgs, 2.0, shown=shown)


def test_game_scripts_are_generate_jsonl(world):
    from animegamer_jax.game.script import load_jsonl

    out, manifest = world
    truth = toy_world.read_truth(out)
    assert set(manifest["games"]) == set(toy_world.SPLITS) and truth["seconds"] == 2.0
    for split, rel in manifest["games"].items():
        games = load_jsonl(os.path.join(out, rel))
        assert [g.game_id for g in games] == [g["game_id"] for g in truth["splits"][split]]
        assert [t.text for t in games[0].turns] == [t["instruction"] for t in truth["splits"][split][0]["turns"]]
