"""The ``game.mode`` rule: which model settings a turn runs with (``default`` or the release's ``reference``)."""

from __future__ import annotations

import copy


def apply_mode(config):
    """A copy of ``config`` with ``game.mode`` applied to the model sections.

    ``reference`` (the release, docs/release_quirks.md): ``mllm.history_window = 1``,
    ``mllm.readout = "last"``, ``mllm.history_attention = "window_recompute"``,
    ``diffusion.cfg_schedule = "release"``, ``mllm.quantize = "none"`` (the release's bf16 weights).

    Raises:
      ValueError: unknown ``game.mode``.
    """
    config = copy.deepcopy(config)
    if config.game.mode == "reference":
        config.mllm.history_window = 1
        config.mllm.readout = "last"
        config.mllm.history_attention = "window_recompute"
        config.diffusion.cfg_schedule = "release"
        if "quantize" in config.mllm:
            config.mllm.quantize = "none"
    elif config.game.mode != "default":
        raise ValueError(f"game.mode must be 'default' or 'reference', got {config.game.mode!r}")
    return config
