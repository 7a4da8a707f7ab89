"""The tiny T5 sentencepiece of ``configs/tiny.py`` (``data/tiny_t5_spiece.model``): its corpus and its command.

  python -m animegamer_jax.commands.data tiny-t5-spiece [--out=data/tiny_t5_spiece.model] [--vocab_size=384]

The corpus (:func:`tiny_corpus`) is short generic phrases plus every action text the sample data's
labels can hold (:func:`sample_action_texts`, from ``data/sample.py``); ``t5_tokenizer.train_spiece``
trains the model on it. The committed file is this command's output, bit for bit
(tests/test_t5_tokenizer.py).
"""

from __future__ import annotations

import itertools
import os

from animegamer_jax.data import sample
from animegamer_jax.tokenizers.t5_tokenizer import train_spiece

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
    shots = sample.SHOTS
    actions = dict.fromkeys(action for _, action, _, _ in shots)
    backgrounds = dict.fromkeys(background for _, _, background, _ in shots)
    return [f"{adverb} {action}" for adverb in sample.ADVERBS.values() for action in actions] + list(backgrounds)


def tiny_corpus() -> list[str]:
    """The tiny model's corpus: short generic phrases (every subject x action x background) and the sample
    data's action texts (:func:`sample_action_texts`), so that every sample action is a few whole-word
    pieces (at most 6 with the default 384 pieces: each fits ``configs/tiny.py``'s 8 T5 tokens, EOS
    included, and no two share their 8 ids; without the sample texts, a BPE of the generic phrases
    spells rare adverbs such as "frantically" letter by letter)."""
    generic = [f"{s} {a} {b}" for s, a, b in itertools.product(_SUBJECTS, _ACTIONS, _BACKGROUNDS)]
    return generic + list(_ACTIONS) + list(_BACKGROUNDS) + sample_action_texts()


def train_tiny_spiece(out_path: str | os.PathLike, vocab_size: int = 384) -> str:
    """Writes the tiny T5 sentencepiece of ``configs/tiny.py`` (<= ``vocab_size`` pieces, trained on
    :func:`tiny_corpus`) to ``out_path``; returns the path."""
    out_path = os.fspath(out_path)
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "wb") as f:
        f.write(train_spiece(tiny_corpus(), vocab_size))
    return out_path
