"""T5 tokenization: a sentencepiece model trained on the fly, pad/truncate with EOS; the committed
tiny model is regenerated bit for bit by its script and fits configs/tiny.py."""

import numpy as np
import pytest
import sentencepiece as spm

from animegamer_jax.tokenizers import t5_tokenizer
from animegamer_jax.data import tiny_t5_spiece

TEXTS = ["softly talk", "run forward quickly", "the witch flies over the sea", "jump", "turn around and wave"] * 20


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "t5.model"
    path.write_bytes(t5_tokenizer.train_spiece(TEXTS, vocab_size=60))
    return path


def test_pad_truncate_eos(model_file):
    tok = t5_tokenizer.T5Tokenizer(model_file, max_length=6)
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
    texts = ["jump", "the witch flies over the sea"]
    ids = tok(texts)
    assert ids.shape == (2, 6) and ids.dtype == np.int32
    short = sp.encode("jump")
    assert len(short) < 5
    np.testing.assert_array_equal(ids[0], short + [1] + [0] * (5 - len(short)))
    long = sp.encode(texts[1])
    assert len(long) > 5  # truncated: 5 pieces kept, EOS last
    np.testing.assert_array_equal(ids[1], long[:5] + [1])
    assert tok.encode("jump") == short + [1]
    assert tok.decode(ids[0]) == "jump"
    np.testing.assert_array_equal(tok("jump"), ids[:1])
    assert tok(texts, max_length=30).shape == (2, 30)


def test_rejects_non_t5_special_ids(tmp_path):
    import io

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS), model_writer=buf, vocab_size=40,
                                   hard_vocab_limit=False, minloglevel=2)  # default: unk 0, bos 1, eos 2
    (tmp_path / "m.model").write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="pad/eos ids"):
        t5_tokenizer.T5Tokenizer(tmp_path / "m.model")


def test_committed_tiny_model_is_reproducible_and_fits_tiny_config(tmp_path):
    from configs import tiny

    cfg = tiny.get_config()
    committed = open(cfg.t5.spiece_model, "rb").read()
    assert tiny_t5_spiece.train_tiny_spiece(tmp_path / "t.model") and (tmp_path / "t.model").read_bytes() == committed
    tok = t5_tokenizer.T5Tokenizer(cfg.t5.spiece_model, cfg.t5.max_length)
    assert tok.vocab_size <= cfg.t5.vocab_size
    ids = tok(["the girl softly talk in the forest", "sit down"])
    assert ids.shape == (2, cfg.t5.max_length) and ids.max() < tok.vocab_size
    assert tok.decode(ids[1]) == "sit down"
    # every sample action text fits the tiny config's T5 tokens whole (EOS included) and no two share
    # their ids (the first, 256-piece model spelt "frantically" in 8 letter pieces: five actions, one input)
    texts = tiny_t5_spiece.sample_action_texts()
    assert len(texts) == 5 * 9 + 5 and texts[0] == "slowly crawl out of burrow" and texts[-1] == "day car"
    actions = texts[:45]
    assert max(len(tok.sp.encode(a)) for a in actions) <= 6  # + EOS = 7 <= t5.max_length 8
    ids = tok(actions)
    assert [tok.decode(r) for r in ids] == actions and len({tuple(r) for r in ids}) == len(actions)
