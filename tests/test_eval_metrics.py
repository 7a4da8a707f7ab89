"""Table 1 metrics on constructed inputs with known answers."""

import numpy as np
import pytest

from animegamer_jax.eval import metrics


def _random_embed(dim=16, seed=0):
    """A fixed random linear 'image encoder': identical images give identical embeddings."""

    def embed(frames):
        frames = np.asarray(frames, np.float64)
        flat = frames.reshape(frames.shape[0], -1)
        proj = np.random.default_rng(seed).standard_normal((flat.shape[1], dim))
        return flat @ proj

    return embed


def test_cosine_matrix_known_values():
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    b = np.array([[3.0, 0.0], [1.0, 1.0], [-1.0, 0.0]])
    got = metrics.cosine_matrix(a, b)
    want = np.array([[1.0, 1 / np.sqrt(2), -1.0], [0.0, 1 / np.sqrt(2), 0.0]])
    np.testing.assert_allclose(got, want, atol=1e-12)
    with pytest.raises(ValueError, match="widths differ"):
        metrics.cosine_matrix(np.ones((1, 3)), np.ones((1, 4)))


def test_clip_i_identical_images_is_one():
    embed = _random_embed()
    img = np.random.default_rng(3).integers(0, 256, (8, 12, 3), np.uint8)
    frames = np.stack([img] * 5)
    assert metrics.clip_i(embed(frames), embed(img[None])) == pytest.approx(1.0, abs=1e-12)
    other = np.random.default_rng(4).integers(0, 256, (8, 12, 3), np.uint8)
    assert metrics.clip_i(embed(frames), embed(other[None])) < 0.99


def test_clip_i_averages_over_frames_and_references():
    frames = np.array([[1.0, 0.0], [0.0, 1.0]])
    refs = np.array([[1.0, 0.0]])
    assert metrics.clip_i(frames, refs) == pytest.approx(0.5)
    refs2 = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert metrics.clip_i(frames, refs2) == pytest.approx(0.0)


def test_clip_t_is_mean_cosine_to_text():
    frames = np.array([[1.0, 1.0], [1.0, -1.0], [2.0, 0.0]])
    text = np.array([1.0, 0.0])
    assert metrics.clip_t(frames, text) == pytest.approx((2 / np.sqrt(2) + 1.0) / 3)


def test_level_metrics():
    acc, mae = metrics.level_metrics([1, 2, 5, 3], [1, 3, 2, 3])
    assert acc == pytest.approx(0.5)
    assert mae == pytest.approx((0 + 1 + 3 + 0) / 4)
    with pytest.raises(ValueError, match="equal non-empty"):
        metrics.level_metrics([1, 2], [1])


def test_state_metrics_score_meters_only_by_default():
    pred = np.array([[5, 1, 0, -2], [1, 0, 0, 0]])
    gt = np.array([[1, 1, 2, -2], [1, 3, 0, 0]])
    acc, mae = metrics.state_metrics(pred, gt)
    # SC/ET/ST entries: (1,1) (0,2) (-2,-2) (0,3) (0,0) (0,0): 4 of 6 equal; |err| sum 2+3=5.
    assert acc == pytest.approx(4 / 6)
    assert mae == pytest.approx(5 / 6)
    acc4, mae4 = metrics.state_metrics(pred, gt, fields=metrics.STATE_FIELDS)
    assert acc4 == pytest.approx(5 / 8)
    assert mae4 == pytest.approx(9 / 8)
    with pytest.raises(ValueError, match=r"int \[N>0, 4\]"):
        metrics.state_metrics(pred[:, :3], gt[:, :3])
    with pytest.raises(ValueError, match="unknown state field"):
        metrics.state_metrics(pred, gt, fields=("HP",))


def test_sample_frame_indices():
    np.testing.assert_array_equal(metrics.sample_frame_indices(17, 5), [0, 4, 8, 12, 16])
    np.testing.assert_array_equal(metrics.sample_frame_indices(4, 8), [0, 1, 2, 3])


def _moving_clip(step, frames=9, h=48, w=64):
    rng = np.random.default_rng(0)
    tex = rng.integers(0, 256, (h, w + step * frames), np.uint8)
    tex = np.stack([tex] * 3, -1)
    # smooth the texture so optical flow can track it
    import cv2
    tex = cv2.GaussianBlur(tex, (7, 7), 2.0)
    return np.stack([tex[:, i * step: i * step + w] for i in range(frames)])


def test_estimate_motion_level_with_stand_in_and_real_estimator():
    bins = (1.118, 5.0, 12.247, 24.495)
    still = np.stack([np.full((48, 64, 3), 90, np.uint8)] * 9)
    # stand-in estimator: known scope -> known level
    assert metrics.estimate_motion_level(still, bins, scope_fn=lambda f, r: 0.0) == 1
    assert metrics.estimate_motion_level(still, bins, scope_fn=lambda f, r: 13.0) == 4
    # the data pipeline's estimator: a still clip is level 1, a fast pan is above level 1
    assert metrics.estimate_motion_level(still, bins) == 1
    assert metrics.estimate_motion_level(_moving_clip(0), bins) == 1
    assert metrics.estimate_motion_level(_moving_clip(3), bins) >= 3


def test_evaluate_turns_end_to_end_known_answers():
    rng = np.random.default_rng(0)
    ref_a = rng.integers(0, 256, (8, 12, 3), np.uint8)
    ref_b = rng.integers(0, 256, (8, 12, 3), np.uint8)
    embed = _random_embed()
    vocab = {"walk": [1.0, 0.0], "meadow": [0.0, 1.0], "jump": [1.0, 1.0], "forest": [1.0, -1.0]}

    def text_embed(texts):
        return np.array([vocab[t] + [0.0] * 14 for t in texts])

    def image_embed(frames):
        e = embed(frames)
        e[:, :2] = 0.0  # image embeddings orthogonal to the first two text axes
        return e

    turns = [
        metrics.ScoredTurn(np.stack([ref_a] * 6), "walk", "meadow", ("A",),
                           np.array([1, 1, 0, 0]), np.array([1, 1, 0, 1]), seconds=2.0),
        metrics.ScoredTurn(np.stack([ref_b] * 6), "jump", "forest", ("B",),
                           np.array([3, 0, 0, 0]), np.array([2, 0, 0, 0]), seconds=4.0),
    ]
    scopes = iter([0.0, 6.0])
    out = metrics.evaluate_turns(turns, image_embed=image_embed, text_embed=text_embed,
                                 references={"A": ref_a, "B": ref_b},
                                 motion_bins=(1.118, 5.0, 12.247, 24.495), clip_frames=3,
                                 scope_fn=lambda f, r: next(scopes))
    assert out["CLIP-I"] == pytest.approx(1.0, abs=1e-9)
    assert out["CLIP-T"] == pytest.approx(0.0, abs=1e-9)
    assert out["CLIP-T^E"] == pytest.approx(0.0, abs=1e-9)
    # estimated levels 1 and 3 vs ground truth 1 and 2
    assert out["ACC-F"] == pytest.approx(0.5)
    assert out["MAE-F"] == pytest.approx(0.5)
    assert out["ACC-S"] == pytest.approx(5 / 6)
    assert out["MAE-S"] == pytest.approx(1 / 6)
    assert out["s/turn"] == pytest.approx(3.0)
    assert out["DreamSim"] is None
    assert out["turns"] == 2
    with pytest.raises(KeyError, match=r"no reference image for character\(s\) \['B'\]"):
        metrics.evaluate_turns(turns, image_embed=image_embed, text_embed=text_embed,
                               references={"A": ref_a}, motion_bins=(1.0, 2.0, 3.0, 4.0))


def test_field_accuracy_against_majority_baseline():
    gt = np.array([[3, 0, 2, 0], [3, 0, 1, 1], [2, 2, 1, -1], [3, 0, 2, 1]])
    pred = np.array([[3, 0, 2, 0], [2, 0, 1, 1], [2, 2, 2, -1], [3, 0, 2, 0]])
    f = metrics.field_accuracy(pred, gt)
    assert f["ML"] == {"acc": 0.75, "majority": 0.75, "majority_class": 3}
    assert f["SC"] == {"acc": 1.0, "majority": 0.75, "majority_class": 0}
    assert f["ET"] == {"acc": 0.75, "majority": 0.5, "majority_class": 1}  # tie 1 / 2: the smaller
    assert f["ST"] == {"acc": 0.75, "majority": 0.5, "majority_class": 1}
    with pytest.raises(ValueError, match=r"int \[N>0, 4\]"):
        metrics.field_accuracy(pred[:, :3], gt[:, :3])
