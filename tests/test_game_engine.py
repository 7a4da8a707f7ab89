"""Game engine and CLIs on the random stand-in system: seeds, compile-once, window, batching, resume, errors."""

import io
import json
import os
import re
import signal

import jax.numpy as jnp
import numpy as np
import pytest

from animegamer_jax.commands import cli
from animegamer_jax.commands import generate, play
from animegamer_jax.io import fileio

from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.config import load_config
from animegamer_jax.game import engine as engine_mod
from animegamer_jax.game.folder import atomic, fingerprint, hud, layout
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.commands.game_flags import parse_game_flags
from animegamer_jax.inference.standin_model import StandinTurnModel
from animegamer_jax.inference.clip_sampler import turn_key
from animegamer_jax.inference.instructions import Game, parse_instruction
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_model import TurnModel
from animegamer_jax.models.cogvideox.dit import flow_value
from animegamer_jax.commands.play import define_flags
from tests.subproc import run_python

TEXTS = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
         "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.",
         "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest.",
         "Character: Bunny; Motion: gently sit under a tree; Background: evening meadow."]


def game(gid, seed, n=3):
    return Game(gid, tuple(parse_instruction(t) for t in TEXTS[:n]), seed)


@pytest.fixture(scope="module")
def engine():
    cfg = load_config("configs/tiny.py")
    return GameEngine(cfg, StandinTurnModel(cfg))


def test_flow_table_release_semantics():
    got = flow_value(jnp.array([1, 2, 3, 4, 5, 0, -3]), (0.5, 2.5, 10.0, 15.0, 40.0))
    np.testing.assert_array_equal(np.asarray(got), [0.5, 2.5, 10, 15, 40, 40, 40])


def test_standin_is_a_turn_model_whose_missing_capabilities_are_refused():
    """The stand-in implements the TurnModel protocol with one capability (reference); a config that
    asks for another (the preview decoder, the turn-window KV cache) is one ValueError naming the fix."""
    cfg = load_config("configs/tiny.py")
    model = StandinTurnModel(cfg)
    assert isinstance(model, TurnModel)
    assert model.reference is not None and not model.free_decoding
    assert (model.kv_cache, model.streaming, model.characters, model.preview) == (None,) * 4
    for override, says in (("game.decoder=preview", "--config.game.decoder=full"),
                           ("mllm.history_attention=turn_window", "history_attention=window_recompute")):
        with pytest.raises(ValueError, match=re.escape(says)):
            GameEngine(load_config("configs/tiny.py", [override]), model)


def test_turn_keys_distinct_and_stable():
    keys = {tuple(turn_key(s, k)) for s in range(3) for k in range(4)}
    assert len(keys) == 12
    np.testing.assert_array_equal(turn_key(5, 2), turn_key(5, 2))


@pytest.mark.slow
def test_seeds_and_compile_once(engine):
    a = engine.play([game("a", 1)])[0]
    sizes = engine.cache_sizes()
    compiles = dict(engine.compiles)
    assert sizes == {"mllm": 1, "sampling": 1, "vae": 1}
    assert all(v == 1 for v in compiles.values())
    b = engine.play([game("b", 1)])[0]
    c = engine.play([game("c", 2)])[0]
    # nothing recompiled after the first turn of the first game
    assert engine.cache_sizes() == sizes and engine.compiles == compiles
    assert a["turns"][0].frames.shape == (17, 64, 96, 3)
    for ta, tb in zip(a["turns"], b["turns"]):
        np.testing.assert_array_equal(ta.frames, tb.frames)
        assert ta.states == tb.states
    assert all(np.abs(ta.frames - tc.frames).max() > 1e-3 for ta, tc in zip(a["turns"], c["turns"]))
    # meters follow the states (start 50, +5 x change, clamp)
    m = {"social": 50, "entertainment": 50, "stamina": 50}
    for t in a["turns"]:
        _, sc, et, st = t.states
        m = {"social": min(100, max(0, m["social"] + 5 * sc)),
             "entertainment": min(100, max(0, m["entertainment"] + 5 * et)),
             "stamina": min(100, max(0, m["stamina"] + 5 * st))}
        assert t.meters == m


@pytest.mark.slow
def test_mllm_input_holds_last_w_turns(engine, monkeypatch):
    seen = []
    real = engine_mod.stack_inputs

    def spy(rows):
        seen.append(rows[0])
        return real(rows)

    monkeypatch.setattr(engine_mod, "stack_inputs", spy)
    res = engine.play([game("w", 4, n=4)])[0]
    w = engine.spec.window
    assert w == 3
    for k, inp in enumerate(seen):
        used = list(range(max(0, k - (w - 1)), k))
        assert int(inp.hist_valid.sum()) == len(used)
        for j, t in enumerate(used):
            np.testing.assert_array_equal(inp.hist_reps[j], res["turns"][t].rep)
        # the world ids of each history turn are that turn's own predicted states
        worlds = [i for i in range(inp.length) if inp.ids[i] == mllm_tokenizer.ML_ID][:-1]
        assert len(worlds) == len(used)
        for p, t in zip(worlds, used):
            got = tuple(mllm_tokenizer.strength_value(int(inp.ids[p + o])) for o in (1, 4, 7, 10))
            assert got == res["turns"][t].states


@pytest.mark.slow
def test_batch_of_4_on_8_devices_equals_one_by_one():
    """Batch layout (4 games + filler rows on 8 devices) and play's latency layout (one game on 8
    devices, batch 1) both give each game's 1-device result."""
    out = run_python("""
        import numpy as np, jax
        from animegamer_jax.config import load_config
        from animegamer_jax.game.engine import GameEngine
        from animegamer_jax.inference.instructions import Game, parse_instruction
        from animegamer_jax.inference.standin_model import StandinTurnModel
        from animegamer_jax import parallel
        T = TEXTS_HERE
        cfg = load_config("configs/tiny.py")
        sysm = StandinTurnModel(cfg)
        games = [Game(f"g{i}", tuple(parse_instruction(t) for t in T[i % 2:i % 2 + 2 + i % 2]), 10 + i)
                 for i in range(4)]
        big = GameEngine(cfg, sysm)
        assert big.batch_size == 8, big.batch_size
        batched = big.play(games)
        one = GameEngine(cfg, sysm, mesh=parallel.mesh_from_config(cfg, devices=jax.devices()[:1]))
        assert one.batch_size == 1
        # play's default latency layout: one game on all 8 devices, batch 1 (no filler rows)
        from animegamer_jax.inference.layout import apply_layout
        lat_cfg = apply_layout(cfg, "latency", 8)
        lat = GameEngine(lat_cfg, sysm, latency=True)
        assert lat.batch_size == 1 and dict(lat.mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 1, "context": 4}
        rows = []
        orig_step = lat.step
        lat.step = lambda runs, *a, **k: (rows.append(len(runs)), orig_step(runs, *a, **k))[1]
        worst = 0.0
        for i, (g, rb) in enumerate(zip(games, batched)):
            r1 = one.play([g])[0]
            assert len(r1["turns"]) == len(rb["turns"]) == len(g.turns)
            pairs = list(zip(r1["turns"], rb["turns"]))
            if i < 2:
                pairs += list(zip(r1["turns"], lat.play([g])[0]["turns"]))
            for a, b in pairs:
                assert a.states == b.states and a.meters == b.meters
                worst = max(worst, float(np.abs(a.frames - b.frames).max()))
        assert set(rows) == {1}, rows
        print("WORST", worst)
    """.replace("TEXTS_HERE", repr(TEXTS)), devices=8)
    worst = float(out.split("WORST")[1])
    assert worst < 1e-5


def _jsonl(path, seeds, extra=()):
    path.write_text("\n".join([json.dumps({"game_id": f"g{i}", "seed": s, "turns": TEXTS[:2]})
                               for i, s in enumerate(seeds)] + list(extra)) + "\n")


@pytest.mark.slow
def test_generate_resumes_verified(tmp_path, monkeypatch, capsys):
    """Killed mid-write: no temp folder left; resume skips only games whose fingerprint and files
    check out, replays the others saying why; a user's folder of a game's name stops the run."""
    jl, out = tmp_path / "games.jsonl", tmp_path / "out"
    _jsonl(jl, [0, 1, 2])
    real_gif, gifs = hud.write_gif, []

    def killing_gif(*a, **k):
        gifs.append(a[0])
        if len(gifs) == 3:
            raise KeyboardInterrupt  # Ctrl-C while writing the second game
        return real_gif(*a, **k)

    monkeypatch.setattr(atomic, "write_gif", killing_gif)
    assert generate.main([str(jl), "--standin", "--out", str(out)]) == 130
    assert "rerun the same command to resume" in capsys.readouterr().err
    assert os.listdir(out) == ["g0"]  # the interrupted write left no temp folder
    monkeypatch.setattr(atomic, "write_gif", real_gif)
    (out / "g1").mkdir()  # an empty folder: nothing to lose, written
    stale = out / ".tmp-g1-deadbeef"  # what a SIGKILL mid-write leaves
    stale.mkdir()
    (stale / layout.TMP_MARKER).write_bytes(b"")
    done_mtime = os.path.getmtime(out / "g0" / "game.json")
    played = []
    real_play = GameEngine.play
    monkeypatch.setattr(GameEngine, "play", lambda self, games, **kw: played.extend(g.game_id for g in games)
                        or real_play(self, games, **kw))
    assert generate.main([str(jl), "--standin", "--out", str(out)]) == 0
    assert played == ["g1", "g2"]
    assert "2 games to play (0 replayed), 1 already finished" in capsys.readouterr().out
    assert os.path.getmtime(out / "g0" / "game.json") == done_mtime
    assert sorted(os.listdir(out)) == ["g0", "g1", "g2"]
    rec = json.load(open(out / "g2" / "game.json"))
    assert rec["seed"] == 2 and len(rec["states"]) == 2 and rec["fingerprint"]["parts"]["seed"] == 2
    assert set(json.load(open(out / "g2" / "timings.json"))["run"]) == {"mllm", "sampling", "vae", "writing"}

    # a folder of the user's named like a game: nothing is played, the folder survives
    (out / "g3").mkdir()
    (out / "g3" / "notes.txt").write_text("mine")
    _jsonl(jl, [0, 1, 2, 3])
    played.clear()
    assert generate.main([str(jl), "--standin", "--out", str(out)]) == 2
    assert "g3 exists and was not written by animegamer_jax" in capsys.readouterr().err
    assert played == [] and os.listdir(out / "g3") == ["notes.txt"]

    # edited seed, a deleted turn video, an emptied game.json: exactly those are replayed
    _jsonl(jl, [5, 1, 2])
    os.remove(out / "g1" / "turn_001.mp4")
    open(out / "g2" / "game.json", "w").close()
    assert generate.main([str(jl), "--standin", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert sorted(played) == ["g0", "g1", "g2"]
    assert "3 games to play (3 replayed), 0 already finished" in text
    assert "replaying g0: made differently (seed 0 -> 5)" in text
    assert "replaying g1: file turn_001.mp4 is missing" in text
    assert "replaying g2: game.json is missing or damaged" in text
    for g in ("g0", "g1", "g2"):
        assert layout.verify_game(str(out / g)) is None


def test_fingerprint_names_mode_and_override_changes():
    base = load_config("configs/tiny.py")
    ref = load_config("configs/tiny.py", ["game.mode=reference"])
    ref2 = load_config("configs/tiny.py", ["game.mode=reference", "game.fps=12", "game.checkpoint=/elsewhere"])
    a = fingerprint.game_fingerprint(apply_mode(base), TEXTS[:2], 3, "sys")
    b = fingerprint.game_fingerprint(apply_mode(ref), TEXTS[:2], 3, "sys")
    c = fingerprint.game_fingerprint(apply_mode(ref2), TEXTS[:2], 3, "sys")
    changes = fingerprint.fingerprint_changes(a["parts"], b["parts"])
    assert changes[0] == 'mode "default" -> "reference"' and "config.mllm.history_window 3 -> 1" in changes
    assert not any("game.mode" in c for c in changes)
    assert fingerprint.fingerprint_changes(b["parts"], c["parts"]) == ["config.game.fps 8 -> 12"]  # checkpoint path ignored
    # the configs lost eval.out_dir (eval's --out); a fingerprint holds the value each config had, so
    # games fingerprinted before keep their fingerprints (and game.json its bytes)
    assert a["parts"]["config"]["eval"]["out_dir"] == "outputs/eval_tiny" and "out_dir" not in a["parts"]["config"]["game"]
    full = fingerprint.game_fingerprint(load_config("configs/animegamer_2b_7b.py"), TEXTS[:2], 3, "sys")
    assert full["parts"]["config"]["eval"]["out_dir"] == "outputs/eval"
    assert fingerprint.fingerprint_changes(a["parts"], fingerprint.game_fingerprint(
        apply_mode(base), TEXTS[1:3], 3, "sys")["parts"]) == ["instructions changed"]


def test_fingerprint_leaves_out_the_device_layout_and_old_games_still_match():
    """Where a game ran (mesh, sharding rules, play's layout) is no part of what it is: play's latency
    layout and generate's / the web app's mesh give one fingerprint, and a game saved when the
    fingerprint held them (every game before issue 53) matches by fingerprint.same_making."""
    from animegamer_jax.inference.layout import apply_layout

    base = apply_mode(load_config("configs/tiny.py"))
    fp = fingerprint.game_fingerprint(base, TEXTS[:2], 3, "sys")
    latency = fingerprint.game_fingerprint(apply_layout(base, "latency", 4), TEXTS[:2], 3, "sys")
    assert latency == fp and "mesh" not in fp["parts"]["config"] and "sharding_rules" not in fp["parts"]["config"]
    assert not {"play_layout", "latency_weights"} & set(fp["parts"]["config"]["game"])
    old = json.loads(json.dumps(fp["parts"]))
    old["config"]["mesh"] = {"axes": ["data", "fsdp", "tensor", "context"], "shape": [-1, 1, 1, 1]}
    old["config"]["sharding_rules"] = [["embed", "fsdp"]]
    old["config"]["game"]["play_layout"] = "latency"
    saved = fingerprint.fingerprint(old)
    assert saved["sha256"] != fp["sha256"] and fingerprint.same_making(saved, fp) is None
    old["config"]["game"]["fps"] = 12
    assert fingerprint.same_making(fingerprint.fingerprint(old), fp) == ["config.game.fps 12 -> 8"]
    assert fingerprint.same_making(None, fp) == fingerprint.same_making({"sha256": "x"}, fp) == ["fingerprint differs"]


def test_generate_checks_every_game_before_playing(tmp_path, capsys, monkeypatch):
    jl, out = tmp_path / "games.jsonl", tmp_path / "out"
    long = "Character: Bunny; Motion: " + " ".join(["hop"] * 80) + "; Background: day."
    _jsonl(jl, [0, 1], [json.dumps({"game_id": "long", "turns": [TEXTS[0], long]})])
    monkeypatch.setattr(GameEngine, "play", lambda *a, **k: pytest.fail("played before validating"))
    assert generate.main([str(jl), "--standin", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {jl}:3 turn 1: instruction 'Character: Bunny; Motion: hop hop hop" in err
    assert "tokens, more than game.max_instruction_tokens=" in err and long not in err
    assert not out.exists()  # --out is created with the first game, not by the check


class _Typed(io.StringIO):
    """stdin that runs ``check(n)`` before the n-th line is read and ends with Ctrl-C."""

    def __init__(self, text, check):
        super().__init__(text)
        self.n, self.check = 0, check

    def readline(self, *a):
        self.n += 1
        self.check(self.n)
        line = super().readline(*a)
        if not line:
            raise KeyboardInterrupt
        return line


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != "timings.json"}


@pytest.mark.slow
def test_play_script_and_stdin(tmp_path, monkeypatch, capsys):
    script = tmp_path / "s.txt"
    script.write_text("# comment\n" + "\n".join(TEXTS[:2]) + "\n")
    out = tmp_path / "o"
    assert play.main([str(script), "--standin", "--out", str(out), "--config.game.seed=7"]) == 0
    text = capsys.readouterr().out
    assert "contact sheet:" in text and "NOT trained" in text and "compilation:" in text
    rec = json.load(open(out / "s" / "game.json"))
    assert rec["seed"] == 7 and rec["instructions"] == TEXTS[:2]
    first = _files(out / "s")
    # a second run keeps the first game unless --overwrite; with it, every file is byte-identical
    assert play.main([str(script), "--standin", "--out", str(out), "--config.game.seed=7"]) == 2
    assert "s holds a game from an earlier run; it is kept. Fix: pass --overwrite" in capsys.readouterr().err
    assert _files(out / "s") == first
    assert play.main([str(script), "--standin", "--out", str(out), "--config.game.seed=7", "--overwrite"]) == 0
    again = _files(out / "s")
    assert sorted(again) == sorted(first) and [k for k in first if first[k] != again[k]] == []
    assert {"turn_000.mp4", "turn_000.gif", "contact_sheet.png", "game.json"} <= set(first)

    def check(n):  # typed turns are on disk as soon as they are played
        if n == 3:
            assert len(json.load(open(out / "live" / "game.json"))["turns"]) == 1
        if n == 5:
            assert len(json.load(open(out / "live" / "game.json"))["turns"]) == 2

    monkeypatch.setattr("sys.stdin", _Typed("\ufeff# typed\n" + TEXTS[0] + "\nnot an instruction\n" + TEXTS[1]
                                            + "\n", check))
    assert play.main(["-", "--standin", "--out", str(out), "--game-id", "live", "--config.game.seed=7"]) == 130
    cap = capsys.readouterr()
    assert "error: <stdin>:3: 'not an instruction' is not a 'Key: value' field" in cap.err
    assert f"interrupted: 2 turn(s) saved in {out}/live" in cap.err and "Traceback" not in cap.err
    assert "contact sheet:" in cap.out  # the saved game's summary
    live = json.load(open(out / "live" / "game.json"))
    # the same turns typed interactively give the same states, and the same video bytes, as the script
    assert live["states"] == rec["states"]
    assert (out / "live" / "turn_001.mp4").read_bytes() == first["turn_001.mp4"]


def test_play_interrupt_before_any_turn_is_a_clean_exit(tmp_path, monkeypatch, capsys):
    """Ctrl-C before the first turn is saved: exit 130, no usage error, nothing written."""
    monkeypatch.setattr("sys.stdin", _Typed("", lambda n: None))
    assert play.main(["-", "--standin", "--out", str(tmp_path / "o"), "--game-id", "g"]) == 130
    err = capsys.readouterr().err
    assert "interrupted: no turn was played; nothing written" in err and "error:" not in err
    assert not (tmp_path / "o" / "g").exists()


@pytest.mark.slow
def test_play_ctrl_c_during_a_save_waits_for_it(tmp_path, monkeypatch, capsys):
    """A Ctrl-C (a real SIGINT) that arrives while turn 2 is being written: the write finishes, the
    turn is counted as saved and not printed, and nothing else is played."""
    real_write, calls = atomic.append_turn, []

    def append_turn(*a, **k):  # turn 2's save (turn 1 makes the folder)
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)  # delivered at once without the held section
        return real_write(*a, **k)

    monkeypatch.setattr(atomic, "append_turn", append_turn)
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(TEXTS[:3]) + "\n"))
    out = tmp_path / "o"
    assert play.main(["-", "--standin", "--out", str(out), "--game-id", "g"]) == 130
    cap = capsys.readouterr()
    assert f"interrupted: 2 turn(s) saved in {out}/g" in cap.err and "Traceback" not in cap.err
    assert re.findall(r"^turn (\d+): ", cap.out, re.MULTILINE) == ["1"]  # turn 2 saved, never printed
    assert len(json.load(open(out / "g" / "game.json"))["turns"]) == 2 and len(calls) == 1
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]


def test_signals_held_and_sigterm_as_interrupt():
    order = []
    with pytest.raises(KeyboardInterrupt):
        with fileio.signals_held():
            with fileio.signals_held():  # nested: the inner section hands the signal to the outer one
                signal.raise_signal(signal.SIGINT)
                order.append("inner done")
            order.append("outer done")
    assert order == ["inner done", "outer done"]
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C is not held (a save that hangs)
        with fileio.signals_held():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            order.append("not reached")
    assert order[-1] == "outer done"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(cli.Terminated) as e:
        with cli.sigterm_as_interrupt():
            with fileio.signals_held():
                signal.raise_signal(signal.SIGTERM)
                order.append("saved")
    assert order[-1] == "saved" and cli.interrupt_exit(e.value) == 143 and cli.interrupt_exit(KeyboardInterrupt()) == 130
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.parametrize("gid", ["ABS", "..", "a/b"])
def test_play_bad_game_id_touches_nothing(tmp_path, capsys, gid):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("mine")
    gid = str(victim) if gid == "ABS" else gid
    (tmp_path / "o").mkdir()
    script = tmp_path / "o" / "s.txt"
    script.write_text(TEXTS[0] + "\n")
    assert play.main([str(script), "--standin", "--out", str(tmp_path / "o"), "--game-id", gid]) == 2
    assert f"error: --game-id: game id {gid!r} is not a plain folder name" in capsys.readouterr().err
    assert os.listdir(victim) == ["notes.txt"] and os.listdir(tmp_path / "o") == ["s.txt"]


def test_play_keeps_a_users_folder(tmp_path, capsys):
    keep = tmp_path / "o" / "keep"
    keep.mkdir(parents=True)
    (keep / "notes.txt").write_text("mine")
    script = tmp_path / "s.txt"
    script.write_text(TEXTS[0] + "\n")
    for extra in ([], ["--overwrite"]):
        assert play.main([str(script), "--standin", "--out", str(tmp_path / "o"), "--game-id", "keep", *extra]) == 2
        assert "keep exists and was not written by animegamer_jax" in capsys.readouterr().err
        assert os.listdir(keep) == ["notes.txt"] and os.listdir(tmp_path / "o") == ["keep"]


@pytest.mark.parametrize("args,needle", [
    (["--config.game.nope=1"], "unknown config key"),
    (["--config.game.checkpoint="], "no checkpoint"),
    (["--checkpoint", "/nonexistent/ckpt"], "not found"),
    (["--standin", "--bogus"], "error: Unknown command line flag 'bogus'. See --help"),
    (["--standin", "second.txt"], "error: unexpected arguments ['second.txt']; play takes one script"),
])
def test_play_errors(tmp_path, capsys, args, needle):
    script = tmp_path / "s.txt"
    script.write_text(TEXTS[0] + "\n")
    extra = ["--standin"] if args[0].startswith("--config.game.nope") else []
    assert play.main([str(script), "--out", str(tmp_path / "o"), *extra, *args]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o" / "s").exists()


def test_play_bad_script_line(tmp_path, capsys):
    script = tmp_path / "s.txt"
    script.write_text(TEXTS[0] + "\nCharacter: X; Motion: run\n")
    assert play.main([str(script), "--standin", "--out", str(tmp_path / "o")]) == 2
    assert "s.txt:2: missing field(s) Background" in capsys.readouterr().err
    script.write_text(TEXTS[0] + "\nCharacter: X; Motion: " + "run " * 80 + "; Background: day\n")
    assert play.main([str(script), "--standin", "--out", str(tmp_path / "o")]) == 2
    assert "s.txt:2: instruction 'Character: X; Motion: run run" in capsys.readouterr().err


def test_config_comes_from_the_checkpoint_when_not_given(capsys):
    """docs/design.md#one-checkpoint-directory-for-a-whole-system: `play --checkpoint DIR` needs nothing
    else; --config and overrides still win."""
    f, rest, cfg = parse_game_flags("play", ["s.txt", "--checkpoint", "checkpoints/tiny_system",
                                             "--config.game.mode=reference",
                                             "--config.game.seed=7", "--nooverwrite", "--game-id", "g"], define_flags)
    assert cfg.name == "tiny" and cfg.mllm.hidden_size == 64 and rest == ["s.txt"]
    assert cfg.game.seed == 7 and cfg.game.mode == "reference" and f.game_id == "g" and not f.overwrite
    _, _, cfg = parse_game_flags("play", ["--config=configs/animegamer_2b_7b.py",
                                          "--checkpoint=checkpoints/tiny_system"])
    assert cfg.mllm.hidden_size == 4096 and cfg.game.mode == "default"
    with pytest.raises(cli.UsageError, match="unknown config key 'nope'"):
        parse_game_flags("play", ["--checkpoint=checkpoints/tiny_system", "--config.game.nope=1"])
    with pytest.raises(SystemExit) as e:
        parse_game_flags("play", ["--help"], define_flags, play.__doc__)
    assert e.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--config: Config file (default: the config saved in --checkpoint", "--config.a.b=value",
                 "--[no]overwrite", "--[no]standin", "--[no]demo", "--game-id: Alias for --game_id",
                 "--verify-checkpoint: Alias for --verify_checkpoint", "--out: Parent folder of the game folders"):
        assert flag in text, flag
    assert "--mode" not in text and "--seed" not in text  # config values are set as --config.game.mode / .seed


def test_play_script_ctrl_c_is_one_line(tmp_path, capsys, monkeypatch):
    script = tmp_path / "s.txt"
    script.write_text(TEXTS[0] + "\n")

    def interrupted(self, games, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(GameEngine, "play", interrupted)
    assert play.main([str(script), "--standin", "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    assert err == "interrupted: nothing written for this game (a script's game is written when it ends)\n"
    assert not (tmp_path / "o").exists()  # --out is created with the first game


def _files(folder):
    """{relative path: bytes} of a game folder, timings.json (wall times) left out."""
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            if n != "timings.json":
                p = os.path.join(root, n)
                out[os.path.relpath(p, folder)] = open(p, "rb").read()
    return out


@pytest.mark.slow
def test_generate_max_batch_games_equal_each_alone(tmp_path, capsys):
    """``generate --max_batch=2``: three games play as one batch of 2 and one of 1 + a filler row, and
    each game's files (timings aside) are byte for byte those of the game generated alone."""
    jl = tmp_path / "games.jsonl"
    _jsonl(jl, [0, 1, 2])
    assert generate.main([str(jl), "--standin", "--max_batch=2", "--out", str(tmp_path / "together")]) == 0
    assert "3 games to play (0 replayed), 0 already finished, batch 2 on mesh" in capsys.readouterr().out
    for i in (0, 1, 2):
        alone = tmp_path / f"alone{i}.jsonl"
        alone.write_text(jl.read_text().splitlines()[i] + "\n")
        assert generate.main([str(alone), "--standin", "--max_batch=2", "--out", str(tmp_path / f"alone{i}")]) == 0
        together, single = _files(tmp_path / "together" / f"g{i}"), _files(tmp_path / f"alone{i}" / f"g{i}")
        assert "turn_001.mp4" in together and "game.json" in together
        assert together == single, sorted(k for k in together if together[k] != single.get(k))
    clips = [(tmp_path / "together" / f"g{i}" / "turn_001.mp4").read_bytes() for i in (0, 1, 2)]
    assert len(set(clips)) == 3  # the rows are different games (their own seeds), not copies of one
    assert generate.main([str(jl), "--standin", "--max_batch=0", "--out", str(tmp_path / "x")]) == 2
    assert "max_batch" in capsys.readouterr().err and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_ctrl_c_after_the_command_returned_exits_130_at_once():
    """A SIGINT in the interpreter's shutdown after play returned (summary printed, files written):
    exit 130 with one line, not a KeyboardInterrupt traceback and status -2."""
    code = ("import os, signal, time\n"
            "from animegamer_jax.commands import cli\n"
            "import atexit\n"
            "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(5)))\n"
            "print('summary', flush=True)\n"
            "cli.exit_finished(0)\n")
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 130, (r.returncode, r.stderr[-500:])
    assert r.stdout.strip() == "summary"
    assert r.stderr.strip().splitlines() == ["interrupted: the command had already finished; everything it "
                                             "reported is written"], r.stderr
