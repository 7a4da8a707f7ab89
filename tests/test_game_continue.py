"""Saved games as save files: ``play --continue`` gives the turns of an uninterrupted game byte for
byte, ``--from_turn`` branches into a new folder leaving the source untouched, and a game that
cannot be continued (damaged, another system or config, a newer format) gets one line."""

import json
import os

import numpy as np
import pytest

from animegamer_jax.commands import play
from animegamer_jax.game.folder import layout
pytestmark = pytest.mark.slow  # its tests (or the fixtures they share) take over ~10 s each on a loaded 2-core host

TEXTS = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
         "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.",
         "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest."]
OTHER = "Character: Bunny; Motion: jump over a log; Background: night forest."


def _bytes(folder):
    return {p: open(os.path.join(folder, p), "rb").read() for p in sorted(os.listdir(folder))}


def _turn_files(folder):
    return {n: b for n, b in _bytes(folder).items() if n.startswith("turn_")}


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    """One 3-turn game played in one go (``a``), and the same game played as 2 turns then
    ``--continue`` with the 3rd (``b``)."""
    d = tmp_path_factory.mktemp("continue")
    (d / "a.txt").write_text("\n".join(TEXTS) + "\n")
    (d / "b.txt").write_text("\n".join(TEXTS[:2]) + "\n")
    (d / "c.txt").write_text(TEXTS[2] + "\n")
    out = d / "o"
    assert play.main([str(d / "a.txt"), "--standin", "--out", str(out), "--config.game.seed=7"]) == 0
    assert play.main([str(d / "b.txt"), "--standin", "--out", str(out), "--config.game.seed=7"]) == 0
    assert play.main(["--continue", str(out / "b"), str(d / "c.txt"), "--standin"]) == 0
    return d, out


def test_continue_gives_the_turns_of_one_go(games):
    d, out = games
    a, b = _turn_files(out / "a"), _turn_files(out / "b")
    assert sorted(a) == [f"turn_{k:03d}.{e}" for k in range(3) for e in ("gif", "mp4", "state.npz")]
    assert sorted(b) == sorted(a) and [n for n in a if a[n] != b[n]] == []
    ra, rb = (json.load(open(out / g / "game.json")) for g in ("a", "b"))
    assert rb["states"] == ra["states"] and rb["meters"] == ra["meters"] and rb["instructions"] == TEXTS
    assert rb["fingerprint"] == ra["fingerprint"] and rb["turns"] == ra["turns"]
    assert layout.verify_game(str(out / "b")) is None
    # the game video and contact sheet were remade for all three turns
    assert rb["save"]["derived"]["turns"] == 3 and len(layout.read_video(str(out / "b" / "game.mp4"))) == \
        len(layout.read_video(str(out / "a" / "game.mp4")))
    st = np.load(out / "b" / "turn_002.state.npz")
    assert int(st["turn"]) == 2 and int(st["seed"]) == 7 and list(st["states"]) == ra["states"][2]
    assert list(st["key"]) == ra["turns"][2]["turn_seed"]["key"]


def test_branch_from_turn_leaves_the_source_untouched(games, capsys):
    d, out = games
    (d / "other.txt").write_text(OTHER + "\n")
    before = _bytes(out / "a")
    assert play.main(["--continue", str(out / "a"), "--from_turn", "1", str(d / "other.txt"), "--standin",
                      "--out", str(out)]) == 0
    assert _bytes(out / "a") == before
    new = _turn_files(out / "a-from1")
    assert sorted(new) == sorted(n for n in before if n.startswith("turn_00") and n[5:8] in ("000", "001"))
    assert {n: new[n] for n in new if n.startswith("turn_000")} == {n: before[n] for n in new if
                                                                   n.startswith("turn_000")}
    assert new["turn_001.mp4"] != before["turn_001.mp4"]
    rec = json.load(open(out / "a-from1" / "game.json"))
    assert rec["instructions"] == [TEXTS[0], OTHER] and layout.verify_game(str(out / "a-from1")) is None
    # a branch never replaces a game, and says so (it does not suggest --overwrite, which would not apply)
    branch = out / "a-from1"
    kept = _bytes(branch)
    for extra in ([], ["--overwrite"]):
        assert play.main(["--continue", str(out / "a"), "--from_turn", "1", str(d / "other.txt"), "--standin",
                          "--out", str(out), *extra]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: {branch} holds a game; a branch starts a new game folder and never replaces one (--overwrite "
            f"does not apply). Fix: pass another --game-id or --out"]
    assert _bytes(branch) == kept


def test_refusals_are_one_line(games, capsys, tmp_path):
    d, out = games
    src = out / "a"

    def refused(folder, *extra):
        assert play.main(["--continue", str(folder), str(d / "c.txt"), "--standin", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and f"cannot continue {folder}" in err
        return err

    import shutil
    for name, edit in [("other", lambda r: r["fingerprint"]["parts"].__setitem__("system", "ckpt:abc")),
                       ("newer", lambda r: r["save"].__setitem__("format", layout.SAVE_FORMAT + 1)),
                       ("old", lambda r: r.pop("save"))]:
        g = tmp_path / name
        shutil.copytree(src, g)
        rec = json.load(open(g / "game.json"))
        edit(rec)
        (g / "game.json").write_text(json.dumps(rec))
        before = _bytes(g)
        err = refused(g)
        assert {"other": "played by system 'ckpt:abc'", "newer": "saved by a newer animegamer_jax",
                "old": "saved before games could be continued"}[name] in err
        assert _bytes(g) == before
    g = tmp_path / "damaged"
    shutil.copytree(src, g)
    (g / "turn_001.state.npz").write_bytes(b"")
    assert "turn 2's file turn_001.state.npz is missing or damaged" in refused(g)
    assert "--from_turn 1" in refused(g)
    assert "played with other settings (config.game.meter_step 5 -> 10)" in refused(src, "--config.game.meter_step=10")
    assert play.main(["--from_turn", "1", "--standin"]) == 2
    assert "--from_turn needs the game to start from" in capsys.readouterr().err
    # a continued game keeps its seed: only an explicit --config.game.seed other than it is refused
    before = _bytes(src)
    assert play.main(["--continue", str(src), str(d / "c.txt"), "--standin", "--config.game.seed=8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--config.game.seed=8: " in err and "was played with seed 7" in err
    assert _bytes(src) == before


def test_continue_interactive(games, monkeypatch, capsys, tmp_path):
    """Instructions typed on stdin continue a game like a script does: the same turn bytes."""
    import io

    d, out = games
    g = tmp_path / "b"
    # a's first two turns (a branch, nothing typed), continued by typing the third: equal to a
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert play.main(["--continue", str(out / "a"), "--from_turn", "2", "--standin", "--out", str(tmp_path),
                      "--game-id", "b"]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("not an instruction\n" + TEXTS[2] + "\n"))
    assert play.main(["--continue", str(g), "--standin"]) == 0
    cap = capsys.readouterr()
    assert "error: <stdin>:1:" in cap.err and "turn 3: " + TEXTS[2] in cap.out
    assert _turn_files(g) == _turn_files(out / "a")
