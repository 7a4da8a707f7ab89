"""The training phases, one module each holding its record (``Phase``), and the table ``PHASES`` (docs/training.md)."""

from __future__ import annotations

from animegamer_jax.train.phases import a1, a2, b, c, d, preview, r, vae
from animegamer_jax.train.phases.base import Phase

#: phase name -> its record, in ``config.TRAIN_PHASES`` order
PHASES: dict[str, Phase] = {m.PHASE.name: m.PHASE for m in (vae, a1, a2, b, c, d, r, preview)}


def phase(name: str) -> Phase:
    """The record of the phase ``name``.

    Raises:
      ValueError: (one line) an unknown name, naming the phases.
    """
    if name not in PHASES:
        raise ValueError(f"unknown training phase {name!r}; use one of {', '.join(PHASES)}")
    return PHASES[name]


__all__ = ["PHASES", "Phase", "phase"]
