"""T5 tokenization of action texts (docs/encoders.md#t5-action-text) and the tiny sentencepiece for tests.

The release calls HF ``T5Tokenizer(text, max_length=30, padding="max_length", truncation=True)``:
sentencepiece pieces, truncated to ``max_length - 1`` so that EOS ``</s>`` (id 1) always ends the
sequence, then padded with id 0 to ``max_length``. We reproduce that with ``sentencepiece``
directly on the user's ``spiece.model`` (no package here ships T5's; it comes with the weights).
HF's 100 ``<extra_id_*>`` sentinels (ids 32000..32099) never occur in action texts and are not
handled.

``python -m animegamer_jax.t5_tokenizer --out data/tiny_t5_spiece.model`` regenerates the tiny
model of ``configs/tiny.py`` (:func:`train_tiny_spiece` on :func:`tiny_corpus`).
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

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
        from animegamer_jax import paths

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


def train_spiece(texts: Iterable[str], vocab_size: int, model_type: str = "bpe", normalization: str = "identity") -> bytes:
    """Trains a T5-style sentencepiece model (pad 0, eos 1, unk 2, no bos) in memory.

    ``vocab_size`` is an upper bound (``hard_vocab_limit=False``): tiny corpora yield fewer pieces.
    BPE rather than T5's unigram because unigram pruning on a corpus of a few hundred words
    collapses to near-characters; ``identity`` normalization keeps the file at a few KB (T5's
    ``nmt_nfkc`` tables add 240 KB). Returns the serialized model (write it to a ``.model`` file).
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


_SUBJECTS = ("the girl", "the boy", "the witch", "the cat", "the old man", "the pilot", "the fox spirit", "the robot")
_ACTIONS = (
    "softly talk", "run forward", "walk slowly", "fly on a broom", "jump over the fence", "turn around",
    "wave a hand", "smile and nod", "look up at the sky", "sit down", "stand up", "eat a rice ball",
    "swim in the water", "ride a bicycle", "open the door", "read a book", "cry quietly", "laugh loudly",
)
_BACKGROUNDS = (
    "in the forest", "by the sea", "in a small town", "on a grassy hill", "inside a wooden house",
    "under the night sky", "in the rain", "at the train station", "in a bakery", "above the clouds",
)


def sample_action_texts() -> list[str]:
    """Every action text the sample data's labels can hold (``data/sample.py``: each of the 9 shots'
    actions after each of the 5 motion-level adverbs, e.g. "frantically ride past van": 45 texts), then
    the shots' 5 backgrounds."""
    from animegamer_jax.data import sample

    shots = sample.SHOTS
    actions = dict.fromkeys(action for _, action, _, _ in shots)
    backgrounds = dict.fromkeys(background for _, _, background, _ in shots)
    return [f"{adverb} {action}" for adverb in sample.ADVERBS.values() for action in actions] + list(backgrounds)


def tiny_corpus() -> list[str]:
    """The tiny model's corpus: short generic phrases (every subject x action x background) and the sample
    data's action texts (:func:`sample_action_texts`), so that every sample action is a few whole-word
    pieces (at most 6 with the default 384 pieces: each fits ``configs/tiny.py``'s 8 T5 tokens, EOS
    included, and no two share their 8 ids; the first model, 256 pieces of the generic phrases alone,
    spelt "frantically" in 8 letter pieces, so five sample actions were one T5 input)."""
    generic = [f"{s} {a} {b}" for s, a, b in itertools.product(_SUBJECTS, _ACTIONS, _BACKGROUNDS)]
    return generic + list(_ACTIONS) + list(_BACKGROUNDS) + sample_action_texts()


def train_tiny_spiece(out_path: str | os.PathLike, vocab_size: int = 384) -> str:
    """Writes the tiny T5 sentencepiece of ``configs/tiny.py`` (<= ``vocab_size`` pieces) to ``out_path``."""
    out_path = os.fspath(out_path)
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "wb") as f:
        f.write(train_spiece(tiny_corpus(), vocab_size))
    return out_path


_CLI_DOC = "Train the tiny T5 sentencepiece used by configs/tiny.py."


def _define_flags(fv, argv: list[str]) -> None:
    from absl import flags

    flags.DEFINE_string("out", "data/tiny_t5_spiece.model", "Output .model file.", flag_values=fv)
    flags.DEFINE_integer("vocab_size", 384, "Most pieces of the trained model.", flag_values=fv)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m animegamer_jax.t5_tokenizer [--out=data/tiny_t5_spiece.model] [--vocab_size=384]``.

    Returns the exit status (2 with a one-line message on a bad command line).
    """
    import sys

    from animegamer_jax import cli

    try:
        f, _ = cli.parse_flags(["python -m animegamer_jax.t5_tokenizer", *(sys.argv[1:] if argv is None else argv)],
                               _define_flags, _CLI_DOC, positional=())
    except cli.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = train_tiny_spiece(f.out, f.vocab_size)
    print(f"wrote {path} ({T5Tokenizer(path).vocab_size} pieces)")
    return 0


def cli() -> None:
    """Console script ``animegamer-t5-tokenizer`` (pyproject.toml)."""
    raise SystemExit(main())


if __name__ == "__main__":
    cli()
