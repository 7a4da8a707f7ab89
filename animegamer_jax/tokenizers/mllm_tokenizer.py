"""The AnimeGamer MLLM tokenizer: Mistral v0.1 sentencepiece + 284 AnimeGamer tokens (vocab 32284).

Reproduces the ids of the release's ``transformers.LlamaTokenizer`` (slow, ``legacy=False``,
``add_bos_token=True``) loaded from ``MLLM/VisualAR/animegamer_tokenizer``
(docs/token_layout.md#tokenizer-and-special-tokens) without transformers, whose v5 ``LlamaTokenizer`` silently
builds a 3-token vocabulary from a bare ``tokenizer.model`` (docs/token_layout.md#tokenizer-and-special-tokens):

1. ``▁`` in the text is read as a space, and one ``▁`` is prepended (``add_prefix_space``).
2. The text is split on the 284 added tokens (longest match). A leading lone ``▁`` before a
   *special* added token is dropped, so ``"<img>..."`` gets no extra piece.
3. Every other segment is encoded by sentencepiece with the dummy prefix turned off; a segment
   that starts with a space keeps it (encoded behind ``<unk>`` whose pieces are then removed,
   exactly as ``LlamaTokenizer._tokenize``).

Hence ``video_block_ids(226)`` has 230 ids, ``world_ids`` 14 and ``encode("<ML>")`` one id.
The default model file is the copy of Mistral v0.1's ``tokenizer.model`` that ships inside the
``mistral-common`` package (``mistral_common/data/tokenizer.model.v1``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Iterable, Sequence

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

SPIECE_UNDERLINE = "▁"
BASE_VOCAB_SIZE = 32000
VOCAB_SIZE = 32284

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
PAD_ID = UNK_ID  # the release pads with <unk>

FRAME_BASE_ID = 32000  # <frame_00000> ... <frame_00255>
NUM_FRAME_TOKENS = 256
IMG_ID, IMG_END_ID = 32256, 32257
VID_ID, VID_END_ID = 32258, 32259
FRAME_ID, FRAME_END_ID = 32260, 32261
STRENGTH_BASE_ID = 32262  # <Strength_-5> ... <Strength_5>
STRENGTH_MIN, STRENGTH_MAX = -5, 5
VISUAL_ID = 32273
ML_ID, ML_END_ID = 32274, 32275
SC_ID, SC_END_ID = 32276, 32277
ET_ID, ET_END_ID = 32278, 32279
ST_ID, ST_END_ID = 32280, 32281
TURN_ID, TURN_END_ID = 32282, 32283

#: state fields in model output order (docs/token_layout.md#state-fields)
STATE_FIELDS = ("ML", "SC", "ET", "ST")


def _added_tokens() -> list[tuple[str, bool]]:
    """The 284 added tokens in id order, each with its ``special`` flag (the table of
    docs/token_layout.md#tokenizer-and-special-tokens)."""
    toks: list[tuple[str, bool]] = [(f"<frame_{i:05d}>", False) for i in range(NUM_FRAME_TOKENS)]
    toks += [("<img>", True), ("</img>", True), ("<vid>", True), ("</vid>", True),
             ("<frame>", True), ("</frame>", True)]
    toks += [(f"<Strength_{k}>", False) for k in range(STRENGTH_MIN, STRENGTH_MAX + 1)]
    toks += [("<visual>", True)]
    for name in ("ML", "SC", "ET", "ST", "TURN"):
        toks += [(f"<{name}>", True), (f"</{name}>", True)]
    assert len(toks) == VOCAB_SIZE - BASE_VOCAB_SIZE
    return toks


ADDED_TOKENS: tuple[tuple[str, bool], ...] = tuple(_added_tokens())
ADDED_TOKEN_TO_ID: dict[str, int] = {t: BASE_VOCAB_SIZE + i for i, (t, _) in enumerate(ADDED_TOKENS)}
SPECIAL_TOKENS: frozenset[str] = frozenset(t for t, special in ADDED_TOKENS if special)


def strength_id(k: int) -> int:
    """Id of ``<Strength_k>`` for k in -5..5 (id = 32267 + k).

    Raises:
      ValueError: k outside -5..5.
    """
    if not STRENGTH_MIN <= int(k) <= STRENGTH_MAX:
        raise ValueError(f"state value {k} is outside {STRENGTH_MIN}..{STRENGTH_MAX}")
    return STRENGTH_BASE_ID - STRENGTH_MIN + int(k)


def strength_value(token_id: int) -> int:
    """Inverse of :func:`strength_id`; raises ValueError for any other id."""
    k = int(token_id) - (STRENGTH_BASE_ID - STRENGTH_MIN)
    if not STRENGTH_MIN <= k <= STRENGTH_MAX:
        raise ValueError(f"token id {token_id} is not a <Strength_k> token "
                         f"(ids {STRENGTH_BASE_ID}..{STRENGTH_BASE_ID + 10})")
    return k


def default_model_path() -> str:
    """Path of Mistral v0.1's sentencepiece model shipped inside ``mistral-common`` (located without
    importing the package).

    Raises:
      ModuleNotFoundError: mistral-common is not installed.
    """
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("mistral-common is not installed (pip install -r requirements.txt); it ships "
                                  "Mistral v0.1's tokenizer.model", name="mistral_common")
    return os.path.join(os.path.dirname(spec.origin), "data", "tokenizer.model.v1")


class AnimeGamerTokenizer:
    """Mistral v0.1 sentencepiece + the 284 AnimeGamer tokens at ids 32000..32283.

    Args:
      model_path: a sentencepiece ``tokenizer.model`` with 32000 pieces (Mistral v0.1's);
        default :func:`default_model_path`.

    Raises:
      FileNotFoundError: the model file does not exist.
      ValueError: the model does not have 32000 pieces (not Mistral v0.1's tokenizer).
    """

    vocab_size = VOCAB_SIZE
    bos_id, eos_id, pad_id, unk_id = BOS_ID, EOS_ID, PAD_ID, UNK_ID

    def __init__(self, model_path: str | None = None):
        path = model_path or default_model_path()
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"tokenizer model {path!r} not found; pass the Mistral v0.1 tokenizer.model path or "
                f"install mistral-common (pip install -r requirements.txt)")
        proto = sentencepiece_model_pb2.ModelProto()
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
        self.model_path = path
        # The reference processor: the file as is (dummy prefix on), for plain text and decode.
        self.sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        if self.sp.get_piece_size() != BASE_VOCAB_SIZE:
            raise ValueError(
                f"tokenizer model {path!r} has {self.sp.get_piece_size()} pieces, expected "
                f"{BASE_VOCAB_SIZE} (Mistral v0.1's tokenizer.model)")
        # legacy=False: segments are encoded with the dummy prefix off (LlamaTokenizer.get_spm_processor).
        proto.normalizer_spec.add_dummy_prefix = False
        self._sp_nodummy = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        self._unk_len = len(self._sp_nodummy.encode("<unk>"))
        pattern = "|".join(re.escape(t) for t in sorted(ADDED_TOKEN_TO_ID, key=len, reverse=True))
        self._split_re = re.compile(f"({pattern})")

    # ---- encoding ----
    def _encode_segment(self, text: str) -> list[int]:
        if not text:
            return []
        if not text.startswith((SPIECE_UNDERLINE, " ")):
            return self._sp_nodummy.encode(text)
        return self._sp_nodummy.encode("<unk>" + text)[self._unk_len:]

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of ``text`` exactly as the release's tokenizer gives them.

        Args:
          text: any string; added tokens (``<img>``, ``<frame_00007>``, ``<Strength_-2>``...) are
            recognised anywhere in it.
          add_bos: prepend ``<s>`` (id 1), as the HF tokenizer's ``__call__`` does.

        Returns:
          A list of ints in [0, 32284).
        """
        text = SPIECE_UNDERLINE + text.replace(SPIECE_UNDERLINE, " ")
        parts = [p for p in self._split_re.split(text) if p]
        if len(parts) > 1 and parts[0] == SPIECE_UNDERLINE and parts[1] in SPECIAL_TOKENS:
            parts = parts[1:]
        ids = [BOS_ID] if add_bos else []
        for p in parts:
            tid = ADDED_TOKEN_TO_ID.get(p)
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(self._encode_segment(p))
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """Sentencepiece ids of text that directly follows a token (no leading ``▁``).

        This is how the instruction text after ``<TURN>`` is tokenized
        (docs/token_layout.md#tokenizer-and-special-tokens).

        Raises:
          ValueError: the text contains an added token.
        """
        if self._split_re.search(text):
            raise ValueError(f"text {text!r} contains an AnimeGamer token; use encode()")
        return self._encode_segment(text)

    # ---- decoding ----
    def id_to_token(self, token_id: int) -> str:
        """Piece string of one id (added tokens by name)."""
        token_id = int(token_id)
        if token_id >= BASE_VOCAB_SIZE:
            return ADDED_TOKENS[token_id - BASE_VOCAB_SIZE][0]
        return self.sp.id_to_piece(token_id)

    def token_to_id(self, token: str) -> int:
        """Id of one piece or added token; raises KeyError for an unknown token."""
        if token in ADDED_TOKEN_TO_ID:
            return ADDED_TOKEN_TO_ID[token]
        tid = self.sp.piece_to_id(token)
        if tid == UNK_ID and token != "<unk>":
            raise KeyError(f"unknown token {token!r}")
        return tid

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; added tokens are written by name with no spaces around them."""
        out: list[str] = []
        run: list[int] = []
        for tid in (int(i) for i in ids):
            if tid >= BASE_VOCAB_SIZE or tid in (BOS_ID, EOS_ID, UNK_ID):
                if run:
                    out.append(self.sp.decode(run))
                    run = []
                if skip_special_tokens and (tid in (BOS_ID, EOS_ID, UNK_ID) or
                                            (tid >= BASE_VOCAB_SIZE and ADDED_TOKENS[tid - BASE_VOCAB_SIZE][1])):
                    continue
                out.append(self.id_to_token(tid))
            else:
                run.append(tid)
        if run:
            out.append(self.sp.decode(run))
        return "".join(out)

    # ---- AnimeGamer layouts (docs/token_layout.md#per-turn-layout) ----
    @staticmethod
    def video_block_ids(num_queries: int = 226) -> list[int]:
        """``<img><frame><frame_00000>...<frame_{n-1}></frame></img>``: n + 4 ids (230 at n=226).

        Raises:
          ValueError: ``num_queries`` outside 1..256 (the vocabulary has 256 frame tokens).
        """
        if not 1 <= num_queries <= NUM_FRAME_TOKENS:
            raise ValueError(f"num_queries={num_queries} must be in 1..{NUM_FRAME_TOKENS}")
        return [IMG_ID, FRAME_ID, *range(FRAME_BASE_ID, FRAME_BASE_ID + num_queries), FRAME_END_ID, IMG_END_ID]

    @staticmethod
    def world_ids(ml: int, sc: int, et: int, st: int) -> list[int]:
        """The 14-id history state string, with the release's duplicated ``</ST>``
        (docs/token_layout.md#per-turn-layout).

        ``<ML><S_ml></ML><SC><S_sc></SC><ET><S_et></ET><ST><S_st></ST></ST></TURN>``.
        """
        return [ML_ID, strength_id(ml), ML_END_ID, SC_ID, strength_id(sc), SC_END_ID,
                ET_ID, strength_id(et), ET_END_ID, ST_ID, strength_id(st), ST_END_ID, ST_END_ID,
                TURN_END_ID]

    @staticmethod
    def state_grammar() -> tuple[tuple[int, ...], ...]:
        """Allowed ids at each of the 11 generated positions after the prompt's final ``<ML>``.

        Position 0, 3, 6, 9 hold a ``<Strength_k>``; the others are fixed
        (``</ML> <SC> _ </SC> <ET> _ </ET> <ST> _ </ST>``), docs/token_layout.md#state-fields.
        """
        strengths = tuple(range(STRENGTH_BASE_ID, STRENGTH_BASE_ID + 11))
        return (strengths, (ML_END_ID,), (SC_ID,), strengths, (SC_END_ID,), (ET_ID,), strengths,
                (ET_END_ID,), (ST_ID,), strengths, (ST_END_ID,))

    @staticmethod
    def parse_states(generated_ids: Sequence[int]) -> tuple[int, int, int, int]:
        """[ML, SC, ET, ST] from the ids generated after ``<ML>`` (positions 0, 3, 6, 9).

        Raises:
          ValueError: fewer than 10 ids, or a non-``<Strength_k>`` id at one of those positions.
        """
        ids = [int(i) for i in generated_ids]
        if len(ids) < 10:
            raise ValueError(f"need at least 10 generated ids to read the states, got {len(ids)}")
        return tuple(strength_value(ids[p]) for p in (0, 3, 6, 9))  # type: ignore[return-value]


@functools.lru_cache(maxsize=4)
def get_tokenizer(model_path: str | None = None) -> AnimeGamerTokenizer:
    """The :class:`AnimeGamerTokenizer` of ``model_path``, built once per path and cached."""
    return AnimeGamerTokenizer(model_path)
