"""Game state: meters, the sliding window, and the MLLM token layout vs the release's (docs/token_layout.md)."""

import numpy as np
import pytest

from animegamer_jax.inference.instructions import Game, parse_instruction
from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.config import load_config
from animegamer_jax.game.folder import layout
from animegamer_jax.game.engine import batches
from animegamer_jax.game.run import GameRun, Meters
from animegamer_jax.game.folder.saves import pending_games
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import InstructionTooLongError, WindowSpec, encode_instruction
from animegamer_jax.models.mistral.mllm import build_sequence

TEXTS = [
    "Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
    "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.",
    "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest.",
    "Character: Qiqi and Jiji; Motion: gently fly; Background: night sky.",
    "Character: Bunny; Motion: gently sit under a tree; Background: evening meadow.",
]


def video_string(nq):
    return "<img><frame>" + "".join(f"<frame_{i:05d}>" for i in range(nq)) + "</frame></img>"


def world_string(ml, sc, et, st):
    return (f"<ML><Strength_{ml}></ML><SC><Strength_{sc}></SC><ET><Strength_{et}></ET>"
            f"<ST><Strength_{st}></ST></ST></TURN>")


def release_layout(history, current, nq, window):
    """The release's prompt (inference_MLLM.py as described in docs/token_layout.md#per-turn-layout and
    docs/token_layout.md#masks), built from strings.

    ``history``: list of (text, states); the release puts ``<Strength_0>`` in every history field.
    """
    tok = mllm_tokenizer.get_tokenizer()
    ids, att, cmp, gen = [mllm_tokenizer.BOS_ID], [1], [False], [False]
    for text, _ in history[len(history) - (window - 1):] if window > 1 else []:
        head = tok.encode("<TURN>" + text)
        vid = tok.encode(video_string(nq))
        world = tok.encode(world_string(0, 0, 0, 0))
        ids += head + vid + world
        att += [1] * (len(head) + len(vid) + len(world))
        cmp += [False] * len(head) + [False, False] + [True] * nq + [False, False] + [False] * len(world)
        gen += [False] * (len(head) + len(vid) + len(world))
    head = tok.encode("<TURN>" + current)
    vid = tok.encode(video_string(nq))
    ml = tok.encode("<ML>")
    ids += head + vid + ml
    att += [1] * len(head) + [1, 1] + [-1] * nq + [1, 1] + [1]
    cmp += [False] * (len(head) + len(vid) + 1)
    gen += [False] * len(head) + [False, False] + [True] * nq + [False, False] + [False]
    return np.array(ids), np.array(att), np.array(cmp), np.array(gen)


def test_meters_app_semantics():
    m = Meters()
    m = m.update([3, 5, -2, 1])
    assert m.as_dict() == {"social": 75, "entertainment": 40, "stamina": 55}
    for _ in range(10):
        m = m.update([1, 5, -5, 0])
    assert m.as_dict() == {"social": 100, "entertainment": 0, "stamina": 55}


def test_reference_layout_equals_release_paper_size():
    cfg = load_config("configs/animegamer_2b_7b.py", ["game.mode=reference"])
    spec = WindowSpec.from_config(cfg)
    assert (spec.window, spec.readout, spec.history_states, spec.num_queries) == (1, "last", "zero", 226)
    run = GameRun(spec, rep_dim=8)
    for k, text in enumerate(TEXTS[:3]):
        ids_cur = encode_instruction(text, spec)
        inp = run.next_input(ids_cur)
        r_ids, r_att, r_cmp, r_gen = release_layout([], text, 226, 1)
        n = inp.length
        assert n == len(r_ids) == 1 + 1 + len(ids_cur) + 230 + 1
        np.testing.assert_array_equal(inp.ids[:n], r_ids)
        np.testing.assert_array_equal(inp.attention_mask[:n], r_att)
        np.testing.assert_array_equal(inp.cmp_mask[:n], r_cmp)
        np.testing.assert_array_equal(inp.gen_mask[:n], r_gen)
        assert not inp.ids[n:].any() and not inp.attention_mask[n:].any()
        # release read-out: the last 226 positions (off by 3 vs the queries, docs/token_layout.md#read-out)
        np.testing.assert_array_equal(inp.read_idx, np.arange(n - 226, n))
        assert inp.ids[inp.last_idx] == mllm_tokenizer.ML_ID
        run.finish_turn(ids_cur, (k + 1, 2, -1, 3), np.full((226, 8), k, np.float32))


def test_release_history_layout_with_zero_states():
    cfg = load_config("configs/tiny.py")
    spec = WindowSpec(3, 24, cfg.game.max_instruction_tokens, "last", "zero")
    run = GameRun(spec, rep_dim=4)
    hist = []
    for k, text in enumerate(TEXTS):
        ids_cur = encode_instruction(text, spec)
        inp = run.next_input(ids_cur)
        r = release_layout(hist, text, 24, 3)
        n = inp.length
        for got, want in zip((inp.ids, inp.attention_mask, inp.cmp_mask, inp.gen_mask), r):
            np.testing.assert_array_equal(got[:n], want)
        states = (k % 5, k - 2, 1, -k)
        run.finish_turn(ids_cur, states, np.full((24, 4), k, np.float32))
        hist.append((text, states))


@pytest.mark.parametrize("window", [1, 2, 3])
def test_window_holds_exactly_last_turns_with_own_states(window):
    spec = WindowSpec(window, 24, 48, "query", "own")
    run = GameRun(spec, rep_dim=4)
    tok = mllm_tokenizer.get_tokenizer()
    for k, text in enumerate(TEXTS):
        ids_cur = encode_instruction(text, spec)
        inp = run.next_input(ids_cur)
        first = max(0, k - (window - 1))
        used = list(range(first, k))
        # representations: slot j <- turn used[j], invalid slots zero
        for j in range(window - 1):
            if j < len(used):
                assert inp.hist_valid[j]
                np.testing.assert_array_equal(inp.hist_reps[j], np.full((24, 4), used[j] + 1.0))
                # the slot's positions are exactly that turn's query positions (cmp mask)
                assert inp.cmp_mask[inp.hist_pos[j]].all()
                first = mllm_tokenizer.FRAME_BASE_ID
                np.testing.assert_array_equal(inp.ids[inp.hist_pos[j]], np.arange(first, first + 24))
            else:
                assert not inp.hist_valid[j] and not inp.hist_reps[j].any()
        assert inp.cmp_mask.sum() == 24 * len(used)
        # each history turn carries its own predicted states
        want = [mllm_tokenizer.BOS_ID]
        for t in used:
            want += [mllm_tokenizer.TURN_ID, *tok.encode_plain(TEXTS[t]), *tok.video_block_ids(24),
                     *tok.world_ids(*((t % 5) + 1, t - 2, 1, -t))]
        want += [mllm_tokenizer.TURN_ID, *ids_cur, *tok.video_block_ids(24), mllm_tokenizer.ML_ID]
        np.testing.assert_array_equal(inp.ids[: inp.length], want)
        # query read-out: the current turn's 24 query slots
        assert inp.gen_mask[inp.read_idx].all() and inp.gen_mask.sum() == 24
        assert (inp.attention_mask[inp.read_idx] == -1).all()
        run.finish_turn(ids_cur, ((k % 5) + 1, k - 2, 1, -k), np.full((24, 4), k + 1.0, np.float32))
        assert inp.ids.shape == (spec.seq_len,)


def test_instruction_too_long_names_fix():
    spec = WindowSpec(1, 24, 8, "query", "own")
    with pytest.raises(InstructionTooLongError, match="max_instruction_tokens=8"):
        encode_instruction(TEXTS[0], spec)


def test_bad_mode():
    cfg = load_config("configs/tiny.py", ["game.mode=fancy"])
    with pytest.raises(ValueError, match="game.mode"):
        WindowSpec.from_config(cfg)


def test_reference_mode_applies_release_settings():
    cfg = apply_mode(load_config("configs/tiny.py", ["game.mode=reference"]))
    assert (cfg.mllm.history_window, cfg.mllm.readout, cfg.diffusion.cfg_schedule) == (1, "last", "release")
    base = apply_mode(load_config("configs/tiny.py"))
    assert (base.mllm.history_window, base.mllm.readout, base.diffusion.cfg_schedule) == (3, "query", "intended")


def test_generate_splits_games_over_processes_and_skips_finished(tmp_path):
    turn = parse_instruction(TEXTS[0])
    games = tuple(Game(f"g{i}", (turn,) * (1 + i % 2), i) for i in range(5))
    (tmp_path / "g2").mkdir()  # a finished game of ours (marker, game.json listing its files)
    (tmp_path / "g2" / layout.MARKER).write_text("{}")
    (tmp_path / "g2" / "game.json").write_text('{"files": {}, "fingerprint": null}')
    (tmp_path / "g4").mkdir()  # empty: played
    (tmp_path / ".tmp-g0-1234abcd").mkdir()  # a killed run's temp folder
    (tmp_path / ".tmp-g0-1234abcd" / layout.TMP_MARKER).write_text("")
    p0, done0, replay0 = pending_games(games, str(tmp_path), 0, 2)
    p1, done1, replay1 = pending_games(games, str(tmp_path), 1, 2)
    assert [g.game_id for g in p0] == ["g0", "g4"] and done0 == 1 and replay0 == {}
    assert [g.game_id for g in p1] == ["g1", "g3"] and done1 == 0 and replay1 == {}
    assert not (tmp_path / ".tmp-g0-1234abcd").exists()
    groups = batches(list(games), 2)
    assert [[g.game_id for g in b] for b in groups] == [["g0", "g2"], ["g4"], ["g1", "g3"]]


@pytest.mark.parametrize("window,history_states", [(3, "own"), (2, "zero"), (1, "own")])
def test_training_and_play_give_the_same_layout(window, history_states):
    """models/mistral/mllm.build_sequence (training) and inference/turn_inputs.build_turn_input (play): same ids and masks."""
    tok = mllm_tokenizer.get_tokenizer()
    spec = WindowSpec(window, 24, 48, "query", history_states)
    run = GameRun(spec, rep_dim=4)
    states = [((k % 5) + 1, k - 2, 1, -k) for k in range(len(TEXTS))]
    for k, text in enumerate(TEXTS):
        ids = encode_instruction(text, spec)
        play = run.next_input(ids)
        train = build_sequence(tok, TEXTS[: k + 1], states[:k], num_queries=24, history_window=window,
                               release_history_states=history_states == "zero")
        n = play.length
        assert n == len(train.input_ids) and not play.cmp_mask[n:].any() and not play.gen_mask[n:].any()
        np.testing.assert_array_equal(play.ids[:n], train.input_ids)
        np.testing.assert_array_equal(play.cmp_mask[:n], train.cmp_mask)
        np.testing.assert_array_equal(play.gen_mask[:n], train.gen_mask)
        np.testing.assert_array_equal(play.attention_mask[:n] == -1, train.gen_mask)
        assert train.num_history == min(k, window - 1) == int(play.hist_valid.sum())
        run.finish_turn(ids, states[k], np.zeros((24, 4), np.float32))
