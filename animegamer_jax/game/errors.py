"""The errors a game reports to its player as one line (a bad input, not a bug): the game commands
(animegamer_jax/commands/game_flags.py ``CLI_ERRORS``) and the game benchmark (``eval``) catch these."""

from __future__ import annotations

from animegamer_jax.config import ConfigError
from animegamer_jax.game.characters import CharacterError
from animegamer_jax.game.loading import CheckpointError
from animegamer_jax.game.folder.layout import OutputError
from animegamer_jax.inference.executables import ExecutablesError
from animegamer_jax.inference.instructions import GameScriptError
from animegamer_jax.inference.turn_inputs import InstructionTooLongError

#: config, game script, instruction, checkpoint, output folder, saved executables, character image
GAME_ERRORS = (ConfigError, GameScriptError, InstructionTooLongError, CheckpointError, OutputError, ExecutablesError,
               CharacterError)

__all__ = ["GAME_ERRORS"]
