"""One game's run: the running meters, the finished turns the MLLM's window is built from, a turn's result.

Meters follow the release demo ``app.py`` (docs/token_layout.md#state-fields): social, entertainment
and stamina start at 50, each turn adds ``5 x`` the predicted change (SC, ET, ST) and clamps to
0..100. The app's display quirk (showing 5 less when a change is 0, without storing it) is a UI bug
and is not copied. The MLLM inputs a run builds are inference/turn_inputs.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from animegamer_jax.inference.turn_inputs import (CachedTurnInput, CachePlan, TurnInput, TurnRecord, WindowSpec,
                                                  build_cached_turn_input, build_turn_input)

METER_NAMES = ("social", "entertainment", "stamina")


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


def _same_records(a: Sequence[TurnRecord], b: Sequence[TurnRecord]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


@dataclasses.dataclass
class GameRun:
    """The running state of one game: finished turns (the window source) and the meters.

    With ``history_attention = "turn_window"`` it also keeps the MLLM's KV cache (``kv_cache``, a
    :class:`TurnKVCache` of device arrays of batch 1, valid for exactly the turns in ``kv_records``);
    an engine step leaves its updated cache in ``kv_pending`` and :meth:`finish_turn` adopts it. A
    run without a matching cache (new, undone, resumed) gets it rebuilt by recompute
    (``GameEngine``).
    """

    spec: WindowSpec
    rep_dim: int
    meters: Meters = dataclasses.field(default_factory=Meters)
    history: list[TurnRecord] = dataclasses.field(default_factory=list)
    meter_log: list[dict[str, int]] = dataclasses.field(default_factory=list)
    kv_cache: Any = None
    kv_records: tuple[TurnRecord, ...] = ()
    kv_pending: tuple[tuple[TurnRecord, ...], Any] | None = None

    def cache_matches(self) -> bool:
        """True when ``kv_cache`` holds exactly this run's finished turns."""
        return self.kv_cache is not None and _same_records(self.kv_records, self.history)

    def next_cached_input(self, current_ids: Sequence[int], plan: CachePlan | None = None) -> CachedTurnInput:
        """The new tokens of the next turn for the rolling cache."""
        return build_cached_turn_input(self.history, current_ids, self.spec, self.rep_dim, plan)

    def next_input(self, current_ids: Sequence[int]) -> TurnInput:
        """The MLLM input of the next turn."""
        return build_turn_input(self.history, current_ids, self.spec, self.rep_dim)

    def finish_turn(self, text_ids: Sequence[int], states: Sequence[int], rep: np.ndarray,
                    meter_step: int = 5) -> Meters:
        """Records a finished turn (its own states and representation) and updates the meters."""
        st = tuple(int(v) for v in states)
        pending, self.kv_pending = self.kv_pending, None
        adopt = pending is not None and _same_records(pending[0], self.history)
        self.history.append(TurnRecord(tuple(text_ids), st, np.asarray(rep, np.float32)))  # type: ignore[arg-type]
        self.kv_cache = pending[1] if adopt else None
        self.kv_records = tuple(self.history) if adopt else ()
        self.meters = self.meters.update(st, meter_step)
        self.meter_log.append(self.meters.as_dict())
        return self.meters


@dataclasses.dataclass
class TurnResult:
    """One game's output for one turn.

    Attributes:
      states: the predicted ``(ML, SC, ET, ST)``.
      rep: s_a, float32 ``[Q, rep_dim]``.
      frames: the clip, float32 ``[T, 8h, 8w, 3]`` in inference/vae_decode.py's ``FRAME_RANGE`` (or uint8 once converted).
      meters: ``{"social", "entertainment", "stamina"}`` after the turn.
    """

    states: tuple[int, int, int, int]
    rep: np.ndarray
    frames: np.ndarray
    meters: dict[str, int]


def print_turn(k: int, text: str, tr: TurnResult, timing: dict) -> None:
    """Prints turn ``k``'s instruction, states, meters, stage wall times and the time to first frame /
    turn time from the turn's start, compiles included (two lines, stdout)."""
    ml, sc, et, st = tr.states
    m = tr.meters
    print(f"turn {k + 1}: {text}\n  states ML={ml} SC={sc:+d} ET={et:+d} ST={st:+d} | social {m['social']} "
          f"entertainment {m['entertainment']} stamina {m['stamina']} | mllm {timing['mllm_s']:.2f}s "
          f"sampling {timing['sampling_s']:.2f}s vae {timing['vae_s']:.2f}s"
          + (f" (preview {timing['preview_s']:.2f}s)" if "preview_s" in timing else "")
          + (f" | first frame {timing['ttff_s']:.2f}s turn {timing['turn_s']:.2f}s" if "ttff_s" in timing else ""),
          flush=True)
