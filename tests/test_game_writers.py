"""Game outputs: files, frame counts/sizes/fps, game.json, gallery, atomic writes, bad output folders."""

import json
import os

import av
import numpy as np
import pytest
from PIL import Image

from animegamer_jax.game import writers


def record(n):
    return {"game_id": "g", "seed": 3, "config": "tiny",
            "turns": [{"turn": k, "instruction": f"Character: B; Motion: hop {k}; Background: day.",
                       "states": {"ML": 2, "SC": 1, "ET": -1, "ST": 0},
                       "meters": {"social": 55, "entertainment": 45, "stamina": 50 + k}} for k in range(n)]}


def frames(n, t=17, h=16, w=24, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.random((t, h, w, 3), dtype=np.float32) for _ in range(n)]


def test_write_game_files(tmp_path):
    fr = frames(2)
    folder = writers.write_game(str(tmp_path), "g", record(2), fr, fps=8)
    names = sorted(os.listdir(folder))
    assert names == ["contact_sheet.png", "game.json", "game.mp4", "index.html", "turn_000.gif",
                     "turn_000.mp4", "turn_001.gif", "turn_001.mp4"]
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []
    rec = json.load(open(os.path.join(folder, "game.json")))
    assert rec["turns"][1]["video"] == "turn_001.mp4" and rec["turns"][1]["meters"]["stamina"] == 51
    with av.open(os.path.join(folder, "turn_000.mp4")) as c:
        s = c.streams.video[0]
        assert s.codec_context.name == "h264" and float(s.average_rate) == 8.0
    v = writers.read_video(os.path.join(folder, "turn_001.mp4"))
    # 24 px wide frames are enlarged 10x for the HUD; the frame sits at the top-left
    assert v.shape[0] == 17 and v.shape[2] == 240 and v.shape[1] > 160
    up = np.repeat(np.repeat(writers.to_uint8(fr[1][5]), 10, 0), 10, 1)
    assert np.abs(v[5, :160, :240].astype(int) - up.astype(int)).mean() < 12  # lossy H.264
    assert writers.read_video(os.path.join(folder, "game.mp4")).shape[0] == 34
    gif = Image.open(os.path.join(folder, "turn_000.gif"))
    assert gif.n_frames == 17 and gif.info["duration"] in (120, 130)  # GIF stores 10 ms units
    sheet = np.asarray(Image.open(os.path.join(folder, "contact_sheet.png")))
    assert sheet.shape == (2 * 16 + 2, 6 * 24 + 5 * 2, 3)
    np.testing.assert_array_equal(sheet[:16, :24], writers.to_uint8(fr[0][0]))
    page = open(os.path.join(folder, "index.html")).read()
    assert page.index("turn_000.mp4") < page.index("turn_001.mp4") and "playFrom" in page
    assert writers.is_finished(folder)


def test_hud_changes_with_meters():
    f = writers.to_uint8(frames(1, t=1)[0])
    a = writers.draw_hud(f, {"social": 10, "entertainment": 50, "stamina": 90}, "x", 0)
    b = writers.draw_hud(f, {"social": 90, "entertainment": 50, "stamina": 90}, "x", 0)
    assert a.shape == b.shape and a.shape[1] % 2 == 0 and a.shape[2] % 2 == 0
    assert (a != b).any()


def test_failure_leaves_nothing(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(writers, "write_gif", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        writers.write_game(str(tmp_path), "g", record(1), frames(1), fps=8)
    assert os.listdir(tmp_path) == []


def test_partial_folder_is_replaced(tmp_path):
    partial = tmp_path / "g"
    partial.mkdir()
    (partial / "turn_000.mp4").write_bytes(b"half")
    assert not writers.is_finished(str(partial))
    writers.write_game(str(tmp_path), "g", record(1), frames(1), fps=8, write_gif_files=False)
    assert writers.is_finished(str(partial)) and (partial / "turn_000.mp4").stat().st_size > 100


def test_not_writable_output(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(writers.OutputError, match="not writable.*--out"):
        writers.check_writable(str(blocker / "games"))


def test_gallery_look_and_turns_of_different_instruction_lengths(tmp_path):
    rec = record(2)
    rec["meter_start"] = 50
    rec["turns"][1]["instruction"] = "Character: B; Motion: " + "run and jump over the hills " * 6 + "; Background: day."
    folder = writers.write_game(str(tmp_path), "g", rec, frames(2), fps=8, write_gif_files=False)
    # one frame size for every turn (the HUD panel does not grow with the text): game.mp4 holds both
    a, b = (writers.read_video(os.path.join(folder, f"turn_{k:03d}.mp4")) for k in range(2))
    assert a.shape == b.shape and writers.read_video(os.path.join(folder, "game.mp4")).shape[0] == 34
    page = open(os.path.join(folder, "index.html")).read()
    assert page.count("<video ") == 2 and page.count(" controls ") == 2
    assert writers.GALLERY_CSS in page and "--link: #ffd479" in page  # readable links on the dark page
    assert "http://" not in page and "https://" not in page  # nothing from outside
    # meters as bars with this turn's change: turn 1 from meter_start 50, turn 2 from turn 1
    assert page.count('class="meters"') == 2
    assert 'aria-valuenow="55" aria-label="social"><span class="fill social" style="width:55%">' in page
    assert '<span class="delta up">+5</span>' in page and '<span class="delta down">-5</span>' in page
    assert '<span class="delta ">+0</span>' in page and '<span class="delta up">+1</span>' in page
