"""Builds the :class:`~animegamer_jax.game.engine.GameSystem` a command plays with.

``--checkpoint DIR``: every component from one system checkpoint directory
(``train/system_checkpoint.py`` layout, design.md "One checkpoint directory for a whole system").
``--standin``: the clearly-labelled random stand-in (game/standin.py), for when no checkpoint exists.
"""

from __future__ import annotations

import os

from animegamer_jax.game.engine import GameSystem
from animegamer_jax.game.standin import build_standin

#: components a game needs from the checkpoint (clip/t5 only build E_a's uncond embedding)
REQUIRED_COMPONENTS = ("mllm", "dit", "vae", "shot_encoder")


class CheckpointError(ValueError):
    """A system checkpoint that is missing, incomplete or does not match the config."""


def load_game_system(checkpoint: str, config, mesh=None) -> GameSystem:
    """Loads every component from ``checkpoint`` and wraps them as per-turn functions.

    Raises:
      CheckpointError: missing directory, a missing component (named), or no loader in this build.
    """
    if not os.path.isdir(checkpoint):
        raise CheckpointError(f"checkpoint directory {checkpoint!r} not found. Fix: pass the folder "
                              f"written by save_system (or use --standin for a random stand-in)")
    try:
        # The one-directory loader lives with the trainer that writes it (issue8).
        from animegamer_jax.train.system_checkpoint import load_system
    except ImportError as e:
        raise CheckpointError(f"this build has no system-checkpoint loader ({e}); use --standin") from None
    try:
        components = load_system(checkpoint, config, mesh=mesh)
    except (FileNotFoundError, KeyError) as e:
        raise CheckpointError(f"checkpoint {checkpoint!r} cannot be loaded: {e}") from None
    missing = [c for c in REQUIRED_COMPONENTS if c not in components or components[c] is None]
    if missing:
        raise CheckpointError(f"checkpoint {checkpoint!r} lacks component(s) {missing}; a game needs "
                              f"{list(REQUIRED_COMPONENTS)}. Fix: save all of them with save_system")
    from animegamer_jax.game.real import build_real_system

    return build_real_system(components, config, label=f"checkpoint {checkpoint}")


def resolve_system(config, checkpoint: str = "", standin: bool = False, mesh=None) -> GameSystem:
    """``--standin`` -> random stand-in; else the checkpoint (argument or ``config.game.checkpoint``).

    Raises:
      CheckpointError: no checkpoint given and no ``--standin``, or a bad checkpoint.
    """
    if standin:
        return build_standin(config, seed=int(config.seed))
    ckpt = checkpoint or config.game.checkpoint
    if not ckpt:
        raise CheckpointError("no checkpoint: pass --checkpoint DIR (or --config.game.checkpoint=DIR), "
                              "or --standin to play a random, untrained stand-in")
    return load_game_system(ckpt, config, mesh=mesh)
