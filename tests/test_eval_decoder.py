"""eval.decoder: the shipped tiny system's D_a reproduces the sample footage it was trained on."""

import json
import os

import pytest

from animegamer_jax.data import loader, prepare, sample
from animegamer_jax.commands.eval import main as eval_main
from animegamer_jax.eval import decoder
from configs import tiny
from tests.subproc import ROOT

CKPT = os.path.join(ROOT, "checkpoints", "tiny_system")


def test_clip_indices():
    assert decoder.clip_indices(71, 12)[:3] == [0, 6, 13] and decoder.clip_indices(71, 12)[-1] == 70
    assert decoder.clip_indices(3, 12) == [0, 1, 2] and decoder.clip_indices(10, 1) == [0]


@pytest.fixture(scope="module")
def sample_clips(tmp_path_factory):
    """The sample film's 2 s clips every 1 s, labelled as in training (data/sample_variant_labels.jsonl)."""
    d = tmp_path_factory.mktemp("decoder")
    film = str(d / "sample_film.mp4")
    sample.make_sample_film(film)  # the training variant "sample_film" (data/README.md)
    cfg = tiny.get_config().data
    cfg.clip_stride_seconds = 1.0
    out = str(d / "clips")
    prepare.prepare_dataset([("sample_film", film)], os.path.join(ROOT, "data", "sample_variant_labels.jsonl"),
                            out, cfg)
    return out


@pytest.mark.slow
def test_shipped_system_draws_its_training_clips(sample_clips, tmp_path, capsys):
    """D_a's samples from E_a's s_a of 3 sample-film clips (the bunny, the bikes, the phone call) come
    within a few dB of the VAE's own reconstructions (a DiT that draws latent-block mosaics scores far
    below 18 dB here)."""
    out = str(tmp_path / "r.json")
    assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", sample_clips, "--clips", "3", "--json", out]) == 0
    res = json.load(open(out))
    assert [c["index"] for c in res["clips"]] == decoder.clip_indices(len(loader.ClipSource(sample_clips)), 3)
    assert [c["film_id"] for c in res["clips"]] == ["sample_film"] * 3
    for c in res["clips"]:
        assert c["sample"] > 18.0 and c["reconstruction"] - c["sample"] < 4.0, c
    assert "decoder sample PSNR" in capsys.readouterr().out
    assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", sample_clips, "--clips", "0"]) == 2
    assert eval_main(["decoder", "--checkpoint", CKPT, "stray"]) == 2
    assert "unexpected arguments ['stray']" in capsys.readouterr().err
    assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", str(tmp_path / "none")]) == 2
    assert "not a prepared dataset (no <name>/<config>/<version>/dataset_info.json)" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.paper  # the student variant of the decoder's command (about 30 s): `make test-paper`
def test_shipped_student_draws_them_in_4_steps(sample_clips, tmp_path, capsys):
    """The shipped few-step student (training phase d) at 4 steps, no CFG batch, scores within 1 dB of
    the teacher's guided sampler on the same 3 clips (issue 32's bar, here at the config's 8 teacher
    steps; docs/results.md#few-step-student-quality-and-cost has 50), and the checkpoint's teacher is still the default."""
    got = {}
    for name, extra in (("teacher", []), ("student", ["--config.diffusion.sampler=student", "--config.diffusion.num_sampling_steps=4"])):
        out = str(tmp_path / f"{name}.json")
        assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", sample_clips, "--clips", "3", "--json", out,
                             *extra]) == 0
        got[name] = json.load(open(out))
    text = capsys.readouterr().out
    assert "student 4 steps" in text and "dpmpp_2m 8 steps" in text
    assert abs(got["student"]["sample"] - got["teacher"]["sample"]) < 1.0, got
    assert all(c["sample"] > 18.0 for c in got["student"]["clips"]), got["student"]


@pytest.mark.slow
def test_dataset_of_another_size_is_refused_before_loading(sample_clips, tmp_path, capsys):
    """A dataset whose clips are not the system's size or length, or that has none, is one line naming both."""
    import shutil

    from animegamer_jax.data import datasets

    for name, change in (("small", {"height": 32}), ("short", {"num_frames": 9})):
        d = tmp_path / name
        shutil.copytree(sample_clips, d)
        meta_file = datasets.find(str(d)) / "metadata.json"
        meta = json.loads(meta_file.read_text())
        meta["config"].update(change)
        meta_file.write_text(json.dumps(meta))
        assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", str(d)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the system's config makes {'height': 64, 'width': 96, 'num_frames': 17}" in err
    assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", sample_clips, "--json", str(tmp_path / "no" / "r.json")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.slow
def test_sheet_shows_frame_reconstruction_and_sample(sample_clips, tmp_path, capsys):
    """--sheet: a row a scored clip of its middle frame, the VAE's reconstruction and the sample, each of
    which is closer to the clip's frame than a sample of another clip is."""
    import numpy as np
    from PIL import Image

    out = str(tmp_path / "sheet.png")
    assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", sample_clips, "--clips", "2", "--sheet", out]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", sample_clips, "--sheet", str(tmp_path / "no" / "s.png")]) == 2
    assert "its folder does not exist" in capsys.readouterr().err
    img = np.asarray(Image.open(out).convert("RGB")).astype(np.float32)
    h, w = 64, 96
    assert img.shape == (2 * h + 2, 3 * w + 2 * 2, 3)  # media.contact_sheet: 2-px white separators
    cell = lambda r, c: img[r * (h + 2):r * (h + 2) + h, c * (w + 2):c * (w + 2) + w]  # noqa: E731
    src = loader.ClipSource(sample_clips)
    for r, i in enumerate(decoder.clip_indices(len(src), 2)):
        frames = np.asarray(src[i]["frames"])
        mid = frames[len(frames) // 2].astype(np.float32)
        if frames.dtype != np.uint8:  # model space [-1, 1]
            mid = (mid + 1.0) * 127.5
        assert np.abs(cell(r, 0) - mid).mean() < 1.0  # the clip's own frame
        for c in (1, 2):
            own, other = np.abs(cell(r, c) - cell(r, 0)).mean(), np.abs(cell(r, c) - cell(1 - r, 0)).mean()
            assert own < other, (r, c, own, other)


def test_turn_distances_by_hand():
    """eval.representation's figures on made-up representations: MSE over Q x D to each clip, to the
    mean of the turn's action's clips, and the nearest clip of another action."""
    import numpy as np

    from animegamer_jax.eval import representation

    q_d = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]], np.float32)  # Q 2 x D 3, not constant
    clips = np.stack([q_d, -0.5 * q_d, 3.0 * q_d])  # actions a, a, b
    rows = [{"index": i, "film_id": "f", "clip_index": i, "action": a} for i, a in enumerate("aab")]
    turn = 0.4 * q_d
    r, none = representation.turn_distances([turn, turn], ["a", "c"], clips, rows)
    sq = float(np.mean(q_d ** 2))  # 5 / 6: every distance is (c - 0.4)^2 * sq for a clip c * q_d
    np.testing.assert_allclose([r["mse_to_mean"], r["rep_mean_square"]], [0.15 ** 2 * sq, 0.4 ** 2 * sq], rtol=1e-5)
    assert r["clips"] == 2 and r["nearest"]["index"] == 0 and r["farthest"]["index"] == 1
    np.testing.assert_allclose([r["nearest"]["mse"], r["farthest"]["mse"], r["nearest_other_action"]["mse"]],
                               [0.6 ** 2 * sq, 0.9 ** 2 * sq, 2.6 ** 2 * sq], rtol=1e-5)
    assert r["nearest_other_action"]["index"] == 2 and r["nearest_other_action"]["action"] == "b"
    assert none["clips"] == 0 and none["nearest"] is none["mse_to_mean"] is None
    assert none["nearest_other_action"]["index"] == 0
    with pytest.raises(ValueError, match="the clips'"):
        representation.turn_distances([turn[:1]], ["a"], clips, rows)


@pytest.mark.slow
def test_played_turns_land_on_their_actions_clips(sample_clips, tmp_path, capsys):
    """The shipped system's predicted s_a for a labelled instruction is nearer E_a of its action's clip than
    of any other clip of the sample film; an instruction no clip has reports no clip of its own."""
    game = tmp_path / "g.txt"
    game.write_text("Character: Bunny; Motion: steadily crawl out of burrow; Background: day meadow.\n"
                    "Character: Driver; Motion: steadily talk on phone in car; Background: day car.\n"
                    "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest.\n")
    out = str(tmp_path / "r.json")
    assert eval_main(["representation", "--checkpoint", CKPT, "--dataset", sample_clips, "--game", str(game),
                                "--json", out]) == 0
    turns = json.load(open(out))["turns"]
    assert [t["clips"] for t in turns] == [1, 1, 0]
    for t, clip_index in zip(turns[:2], (0, 7)):
        assert t["nearest"]["clip_index"] == t["farthest"]["clip_index"] == clip_index
        assert t["mse_to_mean"] == pytest.approx(t["nearest"]["mse"], rel=1e-5)
        assert t["nearest"]["mse"] < t["nearest_other_action"]["mse"], t
    assert turns[2]["nearest"] is None and turns[2]["nearest_other_action"] is not None
    assert "turn 3 'quickly chase a butterfly': 0 clip(s) with this action" in capsys.readouterr().out
    assert eval_main(["representation", "--checkpoint", CKPT, "--dataset", sample_clips]) == 2
    assert "--game is required" in capsys.readouterr().err
    assert eval_main(["representation", "--checkpoint", CKPT, "--game", str(tmp_path / "none.txt")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.slow
@pytest.mark.paper  # a second variant of the decoder's command (about 30 s): `make test-paper`
def test_reference_decodes_with_another_clip_of_the_same_character(sample_clips, tmp_path, capsys):
    """--reference: each clip is sampled with the first frame of the clip phase r pairs it with
    (data/references.py) through the reference adapter; the samples change, the VAE reconstruction does not."""
    from animegamer_jax.data import references
    paths = {k: str(tmp_path / f"{k}.json") for k in ("plain", "ref")}
    assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", sample_clips, "--clips", "2", "--json", paths["plain"]]) == 0
    assert eval_main(["decoder", "--checkpoint", CKPT, "--dataset", sample_clips, "--clips", "2", "--reference",
                         "--json", paths["ref"]]) == 0
    assert "with a reference image" in capsys.readouterr().out
    plain, ref = (json.load(open(p)) for p in paths.values())
    mined = references.dataset_references(sample_clips, "train", seed=tiny.get_config().seed)
    for a, b in zip(plain["clips"], ref["clips"]):
        assert "reference" not in a and b["reference"] == (mined[b["index"]] if mined[b["index"]] >= 0 else b["index"])
        assert a["reconstruction"] == pytest.approx(b["reconstruction"]) and a["sample"] != b["sample"]
        assert b["sample"] > 12.0
    assert any(c["reference"] != c["index"] for c in ref["clips"])
