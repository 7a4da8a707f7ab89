"""Per-game state: running meters, the sliding window of past turns, and the MLLM token layout.

Follows docs/token_layout.md (the layout itself is built once, by
``models/mistral/mllm.py`` ``turn_layout``, for training and play):

* Sequence = ``[<s>]`` + up to W-1 history turns + the current turn. A history turn is
  ``<TURN> text <img><frame><frame_0..n-1></frame></img>`` + the 14 world ids (with the release's
  duplicated ``</ST>``); the current turn ends with ``<ML>`` instead of the world ids.
* Three 1-D masks: ``attention_mask`` (1 valid, -1 the current turn's query block which attends
  bidirectionally, 0 padding), ``ids_cmp_mask`` (history query slots, overwritten by the projected
  history representations), ``ids_gen_mask`` (the current turn's query slots).
* ``default`` mode: history turns carry their own predicted states. ``reference`` mode reproduces the
  release: window 1 (so no history at all) and, were there history, ``<Strength_0>`` for every field.

Sequences are right-padded to one fixed length per game shape (:func:`sequence_length`), so the
jitted MLLM step compiles once; the per-row read-out positions are passed as index arrays.

Meters follow the release demo ``app.py`` (docs/token_layout.md#state-fields): social, entertainment and stamina start at 50,
each turn adds ``5 x`` the predicted change (SC, ET, ST) and clamps to 0..100. The app's display
quirk (showing 5 less when a change is 0, without storing it) is a UI bug and is not copied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from animegamer_jax import tokenizer as tk

METER_NAMES = ("social", "entertainment", "stamina")
#: world ids per history turn (docs/token_layout.md#per-turn-layout, includes the duplicated ``</ST>``)
WORLD_LEN = 14


class InstructionTooLongError(ValueError):
    """An instruction has more tokens than ``game.max_instruction_tokens``."""


@dataclasses.dataclass(frozen=True)
class Meters:
    """The three character meters of a game (app.py semantics, docs/token_layout.md#state-fields)."""

    social: int = 50
    entertainment: int = 50
    stamina: int = 50

    def update(self, states: Sequence[int], step: int = 5, lo: int = 0, hi: int = 100) -> "Meters":
        """Returns the meters after one turn.

        Args:
          states: ``[ML, SC, ET, ST]``; SC/ET/ST are changes in -5..5.
          step: meter units per unit of change (app.py: 5).
        """
        _, sc, et, st = (int(v) for v in states)
        clamp = lambda v: max(lo, min(hi, v))  # noqa: E731
        return Meters(clamp(self.social + step * sc), clamp(self.entertainment + step * et),
                      clamp(self.stamina + step * st))

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """A finished turn as kept in the window.

    Attributes:
      text_ids: instruction token ids (no BOS, no ``<TURN>``).
      states: the turn's own predicted ``(ML, SC, ET, ST)``.
      rep: its predicted representation s_a, float32 ``[Q, D]`` (Q = 226 at paper size).
    """

    text_ids: tuple[int, ...]
    states: tuple[int, int, int, int]
    rep: np.ndarray


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """How a game builds its MLLM input.

    Attributes:
      window: W, turns the MLLM sees including the current one (>= 1).
      num_queries: Q, query tokens per turn (226 at paper size).
      max_text: instruction token budget per turn (sequences are padded to it).
      readout: ``"query"`` (hidden states at the query positions) or ``"last"`` (release ``[-Q:]``).
      history_states: ``"own"`` (each history turn shows its predicted states) or ``"zero"``
        (the release's ``<Strength_0>`` bug, docs/token_layout.md#per-turn-layout).
    """

    window: int
    num_queries: int
    max_text: int
    readout: str = "query"
    history_states: str = "own"

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"history window must be >= 1, got {self.window}")
        if self.readout not in ("query", "last"):
            raise ValueError(f"readout must be 'query' or 'last', got {self.readout!r}")
        if self.history_states not in ("own", "zero"):
            raise ValueError(f"history_states must be 'own' or 'zero', got {self.history_states!r}")

    @classmethod
    def from_config(cls, config) -> "WindowSpec":
        """From ``config.game.mode`` (+ ``mllm.history_window``, ``mllm.readout``, ``rep``, ``game``).

        Raises:
          ValueError: unknown ``game.mode``.
        """
        nq = config.rep.num_text_tokens + config.rep.num_image_tokens
        mode = config.game.mode
        if mode == "reference":
            return cls(1, nq, config.game.max_instruction_tokens, "last", "zero")
        if mode != "default":
            raise ValueError(f"game.mode must be 'default' or 'reference', got {mode!r}")
        return cls(config.mllm.history_window, nq, config.game.max_instruction_tokens,
                   config.mllm.readout, "own")

    @property
    def seq_len(self) -> int:
        """The padded sequence length L of every turn of every game with this spec."""
        block = 1 + self.max_text + self.num_queries + 4
        return 1 + (self.window - 1) * (block + WORLD_LEN) + block + 1


@dataclasses.dataclass
class TurnInput:
    """One row of the MLLM batch (numpy, host side).

    Attributes:
      ids: int32 ``[L]`` right-padded with ``PAD_ID``.
      attention_mask: int32 ``[L]``: 1 valid, -1 current queries (bidirectional block), 0 padding.
      cmp_mask: bool ``[L]`` history query slots.
      gen_mask: bool ``[L]`` current query slots.
      hist_reps: float32 ``[W-1, Q, D]`` history representations, oldest first, zero-padded.
      hist_pos: int32 ``[W-1, Q]`` positions of each history slot's queries (0 where unused).
      hist_valid: bool ``[W-1]``.
      read_idx: int32 ``[Q]`` positions whose final hidden states become s_a (per ``readout``).
      last_idx: int32 scalar, position of the final ``<ML>`` (state decoding starts after it).
      length: number of valid positions.
    """

    ids: np.ndarray
    attention_mask: np.ndarray
    cmp_mask: np.ndarray
    gen_mask: np.ndarray
    hist_reps: np.ndarray
    hist_pos: np.ndarray
    hist_valid: np.ndarray
    read_idx: np.ndarray
    last_idx: int
    length: int


def encode_instruction(text: str, spec: WindowSpec, tok: tk.AnimeGamerTokenizer | None = None,
                       where: str = "") -> tuple[int, ...]:
    """Instruction ids (no BOS), checked against the per-turn budget.

    Args:
      where: where the instruction comes from (``"game.txt:3"``), starts the error message.

    Raises:
      InstructionTooLongError: more than ``spec.max_text`` tokens (names ``where``, the count and
        the fix; the text is shortened to its start).
    """
    tok = tok or tk.get_tokenizer()
    ids = tuple(tok.encode_plain(text))
    if len(ids) > spec.max_text:
        head = text if len(text) <= 60 else text[:57] + "..."
        raise InstructionTooLongError(
            f"{where + ': ' if where else ''}instruction {head!r} has {len(ids)} tokens, more than "
            f"game.max_instruction_tokens={spec.max_text}. Fix: shorten it or raise "
            f"--config.game.max_instruction_tokens")
    return ids


def validate_games(games: Sequence[Any], spec: WindowSpec, tok: tk.AnimeGamerTokenizer | None = None) -> None:
    """Encodes every instruction of every game up front, so a bad one stops the run before its first turn.

    ``games``: :class:`animegamer_jax.game.script.Game` s; each turn's ``where`` (file:line) names it.

    Raises:
      InstructionTooLongError: the first instruction over the budget (file:line, game id, turn).
    """
    tok = tok or tk.get_tokenizer()
    for g in games:
        for j, t in enumerate(g.turns):
            where = getattr(t, "where", "") or f"game {g.game_id!r} turn {j + 1}"
            encode_instruction(t.text, spec, tok, where=where)


def build_turn_input(history: Sequence[TurnRecord], current_ids: Sequence[int], spec: WindowSpec,
                     rep_dim: int) -> TurnInput:
    """Builds the MLLM input of the current turn from the last ``W-1`` finished turns.

    Args:
      history: every finished turn of the game, oldest first (only the last W-1 are used).
      current_ids: the current instruction's ids.
      spec: window / read-out / padding.
      rep_dim: D of the representations.
    """
    from animegamer_jax.models.mistral.mllm import turn_layout  # the one token layout (training uses it too)

    nh = spec.window - 1
    used = list(history[len(history) - nh:]) if nh > 0 else []
    seq = turn_layout([rec.text_ids for rec in used] + [tuple(current_ids)], [rec.states for rec in used],
                      num_queries=spec.num_queries, history_window=spec.window,
                      release_history_states=spec.history_states == "zero")
    hist_reps = np.zeros((max(nh, 0), spec.num_queries, rep_dim), np.float32)
    hist_pos = np.zeros((max(nh, 0), spec.num_queries), np.int32)
    hist_valid = np.zeros((max(nh, 0),), bool)
    cmp_pos = np.flatnonzero(seq.cmp_mask).reshape(len(used), spec.num_queries)
    for j, rec in enumerate(used):
        hist_reps[j] = rec.rep
        hist_pos[j] = cmp_pos[j]
        hist_valid[j] = True
    length = len(seq.input_ids)
    if length > spec.seq_len:
        raise InstructionTooLongError(f"turn sequence has {length} ids > padded length {spec.seq_len}")
    pad = spec.seq_len - length
    q0 = int(np.flatnonzero(seq.gen_mask)[0])
    if spec.readout == "query":
        read_idx = np.arange(q0, q0 + spec.num_queries, dtype=np.int32)
    else:
        read_idx = np.arange(length - spec.num_queries, length, dtype=np.int32)
    att = np.where(seq.gen_mask, -1, 1).astype(np.int32)  # -1: the bidirectional current query block
    return TurnInput(
        ids=np.concatenate([seq.input_ids, np.full(pad, tk.PAD_ID, np.int32)]),
        attention_mask=np.concatenate([att, np.zeros(pad, np.int32)]),
        cmp_mask=np.concatenate([seq.cmp_mask, np.zeros(pad, bool)]),
        gen_mask=np.concatenate([seq.gen_mask, np.zeros(pad, bool)]),
        hist_reps=hist_reps, hist_pos=hist_pos, hist_valid=hist_valid,
        read_idx=read_idx, last_idx=length - 1, length=length)


def stack_inputs(rows: Sequence[TurnInput]) -> dict[str, np.ndarray]:
    """Stacks rows into the batch dict the jitted MLLM step takes (leading dim B)."""
    keys = ("ids", "attention_mask", "cmp_mask", "gen_mask", "hist_reps", "hist_pos", "hist_valid", "read_idx")
    out = {k: np.stack([getattr(r, k) for r in rows]) for k in keys}
    out["last_idx"] = np.asarray([r.last_idx for r in rows], np.int32)
    return out


@dataclasses.dataclass
class GameRun:
    """The running state of one game: finished turns (the window source) and the meters."""

    spec: WindowSpec
    rep_dim: int
    meters: Meters = dataclasses.field(default_factory=Meters)
    history: list[TurnRecord] = dataclasses.field(default_factory=list)
    meter_log: list[dict[str, int]] = dataclasses.field(default_factory=list)

    def next_input(self, current_ids: Sequence[int]) -> TurnInput:
        """The MLLM input of the next turn."""
        return build_turn_input(self.history, current_ids, self.spec, self.rep_dim)

    def finish_turn(self, text_ids: Sequence[int], states: Sequence[int], rep: np.ndarray,
                    meter_step: int = 5) -> Meters:
        """Records a finished turn (its own states and representation) and updates the meters."""
        st = tuple(int(v) for v in states)
        self.history.append(TurnRecord(tuple(text_ids), st, np.asarray(rep, np.float32)))  # type: ignore[arg-type]
        self.meters = self.meters.update(st, meter_step)
        self.meter_log.append(self.meters.as_dict())
        return self.meters
