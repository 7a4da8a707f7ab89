"""Tokenizer: exact ids of the AnimeGamer layouts; sentencepiece is the reference for plain text."""

import pytest
import sentencepiece as spm

from animegamer_jax.tokenizers import mllm_tokenizer


@pytest.fixture(scope="module")
def tok():
    return mllm_tokenizer.AnimeGamerTokenizer()


def test_vocab_layout(tok):
    assert tok.vocab_size == 32284
    assert tok.token_to_id("<frame_00000>") == 32000
    assert tok.token_to_id("<frame_00255>") == 32255
    assert tok.token_to_id("<img>") == 32256 and tok.token_to_id("</img>") == 32257
    assert tok.token_to_id("<frame>") == 32260 and tok.token_to_id("</frame>") == 32261
    assert tok.token_to_id("<Strength_-5>") == 32262 and tok.token_to_id("<Strength_5>") == 32272
    assert tok.token_to_id("<Strength_0>") == 32267 == mllm_tokenizer.strength_id(0)
    assert tok.token_to_id("<visual>") == 32273
    assert [tok.token_to_id(t) for t in ("<ML>", "</ML>", "<SC>", "</SC>", "<ET>", "</ET>", "<ST>", "</ST>",
                                         "<TURN>", "</TURN>")] == list(range(32274, 32284))
    with pytest.raises(ValueError, match="outside -5..5"):
        mllm_tokenizer.strength_id(6)


def test_video_block_is_230_ids(tok):
    text = "<img><frame>" + "".join(f"<frame_{i:05d}>" for i in range(226)) + "</frame></img>"
    ids = tok.encode(text)
    assert len(ids) == 230
    assert ids == tok.video_block_ids(226)
    assert ids[:2] == [32256, 32260] and ids[-2:] == [32261, 32257]


def test_world_string_is_14_ids_and_ml_is_one(tok):
    text = "<ML><Strength_2></ML><SC><Strength_-1></SC><ET><Strength_0></ET><ST><Strength_3></ST></ST></TURN>"
    ids = tok.encode(text)
    assert len(ids) == 14
    assert ids == tok.world_ids(2, -1, 0, 3)
    assert tok.encode("<ML>") == [32274]


def test_plain_text_matches_sentencepiece(tok):
    sp = spm.SentencePieceProcessor(model_file=mllm_tokenizer.default_model_path())
    for text in ["Character: Qiqi; Motion: gently fly on broomstick; Background: night sky.",
                 "Hello  world", " leading space", "tabs\tand\nnewlines", "unicode: café – 日本"]:
        assert tok.encode(text) == sp.encode(text), text
    assert tok.encode("hi", add_bos=True) == [1] + sp.encode("hi")


def test_text_after_turn_has_no_dummy_prefix(tok):
    ids = tok.encode("<TURN>Character: Qiqi;")
    assert ids[0] == mllm_tokenizer.TURN_ID
    assert ids[1] == tok.sp.piece_to_id("Character")  # not "▁Character"
    assert ids[1:] == tok.encode_plain("Character: Qiqi;")
    assert tok.decode(ids) == "<TURN>Character: Qiqi;"


def test_decode_and_parse_states_from_ids(tok):
    gen = [mllm_tokenizer.strength_id(3), mllm_tokenizer.ML_END_ID, mllm_tokenizer.SC_ID, mllm_tokenizer.strength_id(-2), mllm_tokenizer.SC_END_ID, mllm_tokenizer.ET_ID,
           mllm_tokenizer.strength_id(0), mllm_tokenizer.ET_END_ID, mllm_tokenizer.ST_ID, mllm_tokenizer.strength_id(5), mllm_tokenizer.ST_END_ID]
    assert tok.parse_states(gen) == (3, -2, 0, 5)
    assert tok.decode(gen) == "<Strength_3></ML><SC><Strength_-2></SC><ET><Strength_0></ET><ST><Strength_5></ST>"
    grammar = tok.state_grammar()
    assert len(grammar) == 11 and all(g in allowed for g, allowed in zip(gen, grammar))
    with pytest.raises(ValueError, match="not a <Strength_k> token"):
        tok.parse_states([mllm_tokenizer.ML_END_ID] * 11)


def test_bad_model_path():
    with pytest.raises(FileNotFoundError, match="not found"):
        mllm_tokenizer.AnimeGamerTokenizer("/nonexistent/tokenizer.model")
