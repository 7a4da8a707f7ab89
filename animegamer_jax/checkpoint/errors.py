"""The errors of system checkpoints, and the fix every integrity message ends with."""

from __future__ import annotations

#: the command that checks a checkpoint's files (shown in every integrity message)
CLI = "python -m animegamer_jax.commands.checkpoint"


class SystemCheckpointError(ValueError):
    """A system checkpoint that is missing, incomplete, or does not match the requested config."""


class CheckpointIntegrityError(SystemCheckpointError):
    """A file of a system checkpoint is missing, truncated or damaged (the message names it and the fix)."""


def fix_hint(directory: str) -> str:
    """The ``Fix: ...`` sentence of a damaged checkpoint at ``directory``."""
    return (f"Fix: copy the whole checkpoint folder again or re-save it with save_system; check it with "
            f"`{CLI} verify --full {directory}`")
