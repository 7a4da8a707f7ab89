"""T5 tokenization of action texts (docs/encoders.md#t5-action-text) and the tiny sentencepiece for tests.

The release calls HF ``T5Tokenizer(text, max_length=30, padding="max_length", truncation=True)``:
sentencepiece pieces, truncated to ``max_length - 1`` so that EOS ``</s>`` (id 1) always ends the
sequence, then padded with id 0 to ``max_length``. We reproduce that with ``sentencepiece``
directly on the user's ``spiece.model`` (no package here ships T5's; it comes with the weights).
HF's 100 ``<extra_id_*>`` sentinels (ids 32000..32099) never occur in action texts and are not
handled.

:func:`train_spiece` trains a T5-style model on a corpus the caller passes;
``python -m animegamer_jax.commands.data tiny-t5-spiece`` trains the tiny model of ``configs/tiny.py`` on the
sample data's corpus (``animegamer_jax/data/tiny_t5_spiece.py``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from animegamer_jax.io import paths

#: T5 special ids (pad 0, eos 1, unk 2; T5 has no BOS).
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


class T5Tokenizer:
    """sentencepiece T5 tokenizer with the release's pad/truncate rule.

    Args:
      model_file: path to a T5 ``spiece.model`` (pad 0, eos 1, unk 2).
      max_length: tokens per text (30 in the release: docs/encoders.md#t5-action-text ``is_plan_3``).

    Raises:
      ValueError: the model's pad / eos ids are not T5's 0 / 1.
    """

    def __init__(self, model_file: str | os.PathLike, max_length: int = 30):
        # bytes through epath: a local file (repo-relative defaults resolved) or a URL
        proto = paths.as_path(paths.resource(model_file)).read_bytes()
        self.sp = spm.SentencePieceProcessor(model_proto=proto)
        if (self.sp.pad_id(), self.sp.eos_id()) != (PAD_ID, EOS_ID):
            raise ValueError(
                f"{model_file}: pad/eos ids are {self.sp.pad_id()}/{self.sp.eos_id()}, T5 needs {PAD_ID}/{EOS_ID}"
            )
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = max_length

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text`` followed by EOS, no padding or truncation."""
        return list(self.sp.encode(text)) + [EOS_ID]

    def __call__(self, texts: str | Sequence[str], max_length: int | None = None) -> np.ndarray:
        """Tokenizes one text or a batch.

        Returns:
          (B, max_length) int32 ids: pieces truncated to ``max_length - 1``, then EOS, then pad 0.
        """
        if isinstance(texts, str):
            texts = [texts]
        n = self.max_length if max_length is None else max_length
        out = np.full((len(texts), n), PAD_ID, np.int32)
        for i, ids in enumerate(self.sp.encode(list(texts))):
            ids = list(ids)[: n - 1] + [EOS_ID]
            out[i, : len(ids)] = ids
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with pad / eos dropped."""
        return self.sp.decode([int(i) for i in ids if int(i) not in (PAD_ID, EOS_ID)])


def train_spiece(texts: Iterable[str], vocab_size: int, model_type: str = "bpe",
                 normalization: str = "identity") -> bytes:
    """Trains a T5-style sentencepiece model (pad 0, eos 1, unk 2, no bos) in memory on the corpus ``texts``.

    ``vocab_size`` is an upper bound (``hard_vocab_limit=False``): tiny corpora yield fewer pieces.
    BPE rather than T5's unigram because unigram pruning on a corpus of a few hundred words
    collapses to near-characters; ``identity`` normalization keeps the file small (T5's ``nmt_nfkc``
    normalization tables would outweigh a tiny model's pieces). Returns the serialized model (write it
    to a ``.model`` file).
    """
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(list(texts)),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
        normalization_rule_name=normalization,
    )
    return buf.getvalue()
