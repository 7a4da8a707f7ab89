"""Game outputs: files, frame counts/sizes/fps, game.json, gallery, atomic writes, bad output folders."""

import json
import os

import av
import numpy as np
import pytest
from PIL import Image

from animegamer_jax.io import media
from animegamer_jax.game.folder import atomic, fingerprint, gallery, hud, layout
from animegamer_jax.inference.vae_decode import FRAME_RANGE


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
    folder = atomic.write_game(str(tmp_path), "g", record(2), fr, fps=8)
    names = sorted(os.listdir(folder))
    assert names == [".animegamer-game", "contact_sheet.png", "game.json", "game.mp4", "index.html",
                     "turn_000.gif", "turn_000.mp4", "turn_001.gif", "turn_001.mp4"]
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []
    rec = json.load(open(os.path.join(folder, "game.json")))
    assert sorted(rec["files"]) == [n for n in names if not n.startswith(".") and n != "game.json"]
    assert rec["files"]["game.mp4"]["size"] == os.path.getsize(os.path.join(folder, "game.mp4"))
    assert rec["turns"][1]["video"] == "turn_001.mp4" and rec["turns"][1]["meters"]["stamina"] == 51
    with av.open(os.path.join(folder, "turn_000.mp4")) as c:
        s = c.streams.video[0]
        assert s.codec_context.name == "h264" and float(s.average_rate) == 8.0
    v = layout.read_video(os.path.join(folder, "turn_001.mp4"))
    # 24 px wide frames are enlarged 10x for the HUD; the frame sits at the top-left
    assert v.shape[0] == 17 and v.shape[2] == 240 and v.shape[1] > 160
    up = np.repeat(np.repeat(media.to_uint8(fr[1][5], FRAME_RANGE), 10, 0), 10, 1)
    assert np.abs(v[5, :160, :240].astype(int) - up.astype(int)).mean() < 12  # lossy H.264
    assert layout.read_video(os.path.join(folder, "game.mp4")).shape[0] == 34
    gif = Image.open(os.path.join(folder, "turn_000.gif"))
    assert gif.n_frames == 17 and gif.info["duration"] in (120, 130)  # GIF stores 10 ms units
    sheet = np.asarray(Image.open(os.path.join(folder, "contact_sheet.png")))
    assert sheet.shape == (2 * 16 + 2, 6 * 24 + 5 * 2, 3)
    np.testing.assert_array_equal(sheet[:16, :24], media.to_uint8(fr[0][0], FRAME_RANGE))
    page = open(os.path.join(folder, "index.html")).read()
    assert page.index("turn_000.mp4") < page.index("turn_001.mp4") and "playFrom" in page
    assert layout.is_finished(folder)


@pytest.mark.slow
def test_gallery_says_what_the_system_is(tmp_path):
    """index.html names the system and gives its checkpoint's description (escaped); neither line
    without them."""
    rec = dict(record(1), system="checkpoint checkpoints/tiny_system",
               system_description="trained on 71 clips <of> the sample films")
    page = open(os.path.join(atomic.write_game(str(tmp_path), "g", rec, frames(1), fps=8), "index.html")).read()
    assert ('<p class="muted" id="about">system: checkpoint checkpoints/tiny_system. trained on 71 clips '
            '&lt;of&gt; the sample films</p>') in page
    page = open(os.path.join(atomic.write_game(str(tmp_path), "h", record(1), frames(1), fps=8), "index.html")).read()
    assert 'id="about"' not in page


def test_hud_changes_with_meters():
    f = media.to_uint8(frames(1, t=1)[0], FRAME_RANGE)
    a = hud.draw_hud(f, {"social": 10, "entertainment": 50, "stamina": 90}, "x", 0)
    b = hud.draw_hud(f, {"social": 90, "entertainment": 50, "stamina": 90}, "x", 0)
    assert a.shape == b.shape and a.shape[1] % 2 == 0 and a.shape[2] % 2 == 0
    assert (a != b).any()


def test_failure_leaves_nothing(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(atomic, "write_gif", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        atomic.write_game(str(tmp_path), "g", record(1), frames(1), fps=8)
    assert os.listdir(tmp_path) == []


def _tree(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_users_folder_survives_and_overwrite(tmp_path):
    user = tmp_path / "keep"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(layout.OutputError, match=r"keep exists and was not written by animegamer_jax \(no "
                       r"\.animegamer-game marker\); it is left untouched\. Fix: pass another --game-id"):
        atomic.write_game(str(tmp_path), "keep", record(1), frames(1), fps=8, write_gif_files=False)
    assert _tree(user) == {"notes.txt": b"mine"}
    (tmp_path / "afile").write_text("x")  # a file of the user's with the game's name
    with pytest.raises(layout.OutputError, match="not written by animegamer_jax"):
        atomic.write_game(str(tmp_path), "afile", record(1), frames(1), fps=8, write_gif_files=False)
    assert (tmp_path / "afile").read_text() == "x"
    (tmp_path / "empty").mkdir()  # an empty folder holds nothing to lose: written
    atomic.write_game(str(tmp_path), "empty", record(1), frames(1), fps=8, write_gif_files=False)
    assert layout.is_finished(str(tmp_path / "empty"))
    first = _tree(tmp_path / "empty")
    with pytest.raises(layout.OutputError, match="holds a game from an earlier run; it is kept. Fix: pass "
                                                  "--overwrite"):
        atomic.write_game(str(tmp_path), "empty", record(2), frames(2), fps=8, write_gif_files=False)
    assert _tree(tmp_path / "empty") == first

    def boom(*a, **k):
        raise KeyboardInterrupt  # killed while replacing: the earlier game stays whole

    real = atomic.fileio.rename
    calls = []
    atomic.fileio.rename = lambda a, b: calls.append(b) or (boom() if len(calls) == 2 else real(a, b))
    try:
        with pytest.raises(KeyboardInterrupt):
            atomic.write_game(str(tmp_path), "empty", record(2), frames(2), fps=8, write_gif_files=False,
                               overwrite=True)
    finally:
        atomic.fileio.rename = real
    assert _tree(tmp_path / "empty") == first
    atomic.write_game(str(tmp_path), "empty", record(2), frames(2), fps=8, write_gif_files=False, overwrite=True)
    assert len(json.load(open(tmp_path / "empty" / "game.json"))["turns"]) == 2
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []


@pytest.mark.parametrize("gid", ["..", ".", "", "/abs/path", "a/b", "..\\x", ".hidden", " pad"])
def test_bad_game_ids(tmp_path, gid):
    with pytest.raises(layout.OutputError, match="is not a plain folder name"):
        atomic.write_game(str(tmp_path), gid, record(1), frames(1), fps=8)
    assert os.listdir(tmp_path) == []


def test_stale_temp_folders_cleaned_only_if_ours(tmp_path):
    ours = tmp_path / ".tmp-g-dead0000"
    ours.mkdir()
    (ours / layout.TMP_MARKER).write_bytes(b"")
    (ours / "turn_000.mp4").write_bytes(b"half")
    theirs = tmp_path / ".tmp-g-user"
    theirs.mkdir()
    atomic.write_game(str(tmp_path), "g", record(1), frames(1), fps=8, write_gif_files=False)
    assert sorted(os.listdir(tmp_path)) == [".tmp-g-user", "g"]


@pytest.mark.slow
def test_a_kill_between_the_two_renames_loses_no_game(tmp_path):
    """SIGKILL after the earlier game was moved aside and before the new one was renamed in: the game's
    folder is missing and both games sit in temp folders. The next write of that game (or the web
    server's start, for its ``web-*`` games) puts the newer finished one back before cleaning up."""
    import subprocess
    import sys

    # the state a kill leaves, by hand: the earlier game (2 turns, moved aside) and the new one (1 turn)
    for n, name in ((2, ".tmp-g-0000old2"), (1, ".tmp-g-0000new1")):
        atomic.write_game(str(tmp_path / "w"), "g", record(n), frames(n), fps=8, write_gif_files=False)
        os.rename(tmp_path / "w" / "g", tmp_path / name)
        (tmp_path / name / layout.TMP_MARKER).write_bytes(atomic.fileio.owner_stamp())
    (tmp_path / ".tmp-g-0000old2" / layout.ASIDE_MARKER).write_bytes(b"")
    os.rmdir(tmp_path / "w")
    # play's check before a write without --overwrite: the game is back first, so it is refused
    with pytest.raises(layout.OutputError, match="holds a game from an earlier run"):
        atomic.write_game(str(tmp_path), "g", record(3), frames(3), fps=8, write_gif_files=False)
    assert layout.verify_game(str(tmp_path / "g")) is None and not (tmp_path / "g" / layout.TMP_MARKER).exists()
    assert len(json.load(open(tmp_path / "g" / "game.json"))["turns"]) == 1  # the new one, not the one aside
    assert sorted(os.listdir(tmp_path)) == ["g"]

    # the web server's variant: only temp folders whose writer process is gone (this host)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host, ns = atomic.fileio.socket.gethostname(), atomic.fileio._pid_namespace()
    for name, owner in ((".tmp-web-1-aa-0000dead", f"{host} {dead.stdout.strip()} {ns}"),
                        (".tmp-web-2-bb-0000live", f"{host} {os.getpid()} {ns}"),
                        (".tmp-web-3-cc-0000away", f"another-host {dead.stdout.strip()} {ns}")):
        (tmp_path / name).mkdir()
        (tmp_path / name / layout.TMP_MARKER).write_text(owner + "\n")
    assert atomic.clean_orphaned_temp(str(tmp_path), "web-") == [".tmp-web-1-aa-0000dead"]
    assert sorted(os.listdir(tmp_path)) == [".tmp-web-2-bb-0000live", ".tmp-web-3-cc-0000away", "g"]


@pytest.mark.slow
def test_identical_inputs_give_identical_files_and_verify(tmp_path):
    """Two writes of one game: every file byte-identical (deterministic libx264); timings apart."""
    rec = dict(record(2), timings_s={"run": {"mllm": 1.0}})
    fp = fingerprint.fingerprint({"seed": 3})
    a = atomic.write_game(str(tmp_path / "a"), "g", rec, frames(2), fps=8, fingerprint=fp)
    b = atomic.write_game(str(tmp_path / "b"), "g", rec, frames(2), fps=8, fingerprint=fp)
    ta, tb = _tree(tmp_path / "a" / "g"), _tree(tmp_path / "b" / "g")
    assert json.loads(ta.pop("timings.json"))["run"]["mllm"] == 1.0
    assert "writing" in json.loads(tb.pop("timings.json"))["run"]
    assert sorted(ta) == sorted(tb) and all(ta[k] == tb[k] for k in ta), [k for k in ta if ta[k] != tb[k]]
    assert "timings_s" not in json.loads(ta["game.json"])
    assert layout.verify_game(a, fp) is None
    assert layout.verify_game(a, fingerprint.fingerprint({"seed": 4})) == "made differently (seed 3 -> 4)"
    os.remove(os.path.join(b, "turn_001.gif"))
    assert layout.verify_game(b, fp) == "file turn_001.gif is missing"
    with open(os.path.join(a, "turn_000.mp4"), "r+b") as f:
        f.seek(100)
        f.write(b"XXXXXXXX")
    assert layout.verify_game(a, fp) == "file turn_000.mp4 is damaged (sha256 differs)"
    open(os.path.join(a, "game.json"), "w").close()
    assert layout.verify_game(a, fp) == "game.json is missing or damaged"


def test_not_writable_output(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(layout.OutputError, match="not writable.*--out"):
        layout.check_writable(str(blocker / "games"))


def test_gallery_look_and_turns_of_different_instruction_lengths(tmp_path):
    rec = record(2)
    rec["meter_start"] = 50
    rec["turns"][1]["instruction"] = ("Character: B; Motion: " + "run and jump over the hills " * 6
                                      + "; Background: day.")
    folder = atomic.write_game(str(tmp_path), "g", rec, frames(2), fps=8, write_gif_files=False)
    # one frame size for every turn (the HUD panel does not grow with the text): game.mp4 holds both
    a, b = (layout.read_video(os.path.join(folder, f"turn_{k:03d}.mp4")) for k in range(2))
    assert a.shape == b.shape and layout.read_video(os.path.join(folder, "game.mp4")).shape[0] == 34
    page = open(os.path.join(folder, "index.html")).read()
    assert page.count("<video ") == 2 and page.count(" controls ") == 2
    assert gallery.GALLERY_CSS in page and "--link: #ffd479" in page  # readable links on the dark page
    assert "http://" not in page and "https://" not in page  # nothing from outside
    # meters as bars with this turn's change: turn 1 from meter_start 50, turn 2 from turn 1
    assert page.count('class="meters"') == 2
    assert 'aria-valuenow="55" aria-label="social"><span class="fill social" style="width:55%">' in page
    assert '<span class="delta up">+5</span>' in page and '<span class="delta down">-5</span>' in page
    assert '<span class="delta ">+0</span>' in page and '<span class="delta up">+1</span>' in page
