"""One game played a turn at a time: the state an interactive front end (the web server) keeps.

A :class:`TurnByTurnGame` holds the game's instructions, their token ids and the engine's
per-turn results, and its :class:`~animegamer_jax.game.run.GameRun` (the MLLM's window and the
meters). The model runs elsewhere: a caller batches the pending turns of several games into one
:meth:`GameEngine.step` (rows from :meth:`row`) and records each row with :meth:`commit`.
:meth:`undo` drops the last turn and rebuilds the window and meters from the turns kept (no model
call: a turn's states and representation are stored), so undoing turn k and playing it again with
the same instruction gives the same output (turn k's PRNG key is ``turn_key(seed, k)``).
:meth:`result` is the dict ``GameEngine.play`` returns per game, which ``save_game``
(game/folder/saves.py) writes in the layout of game/folder/layout.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.run import GameRun, TurnResult
from animegamer_jax.inference.instructions import Game, Turn, parse_instruction
from animegamer_jax.inference.turn_inputs import encode_instruction


def instruction_from_fields(character: str = "", motion: str = "", background: str = "",
                            line: str = "", where: str = "<form>") -> Turn:
    """A :class:`Turn` from the three fields, or from a whole instruction ``line`` when given.

    Both go through the game-script parser, so a bad field gets its message (e.g. ``field
    'Motion' is empty``) and the fix.

    Raises:
      GameScriptError: the parser's message, prefixed with ``where``.
    """
    if line.strip():
        return parse_instruction(line, where)
    return parse_instruction(f"Character: {character.strip()}; Motion: {motion.strip()}; "
                             f"Background: {background.strip()}.", where)


@dataclasses.dataclass
class TurnByTurnGame:
    """A game advanced one turn at a time (see the module docstring).

    Attributes:
      engine: the engine whose config, window spec and tokenizer the game uses.
      game_id: output folder name.
      seed: the game seed (turn k samples with ``turn_key(seed, k)``).
      characters: its reference images (game/characters.py), for the turns that name them.
    """

    engine: GameEngine
    game_id: str
    seed: int
    turns: list[Turn] = dataclasses.field(default_factory=list)
    text_ids: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    results: list[TurnResult] = dataclasses.field(default_factory=list)
    timings: list[dict] = dataclasses.field(default_factory=list)
    characters: tuple = ()

    def __post_init__(self) -> None:
        self.run: GameRun = self.engine.new_run()
        self._latents: dict | None = None

    def reference(self, turn: Turn):
        """The reference latent ``[1, C, h, w]`` of the character ``turn`` names (``characters``,
        VAE-encoded once per game, on first use), or None."""
        if not self.characters:
            return None
        if self._latents is None:
            self._latents = self.engine.reference_latents(self.characters)
        return self._latents.get(turn.character.strip().casefold())

    def __len__(self) -> int:
        return len(self.turns)

    def encode(self, turn: Turn) -> tuple[int, ...]:
        """Token ids of ``turn``.

        Raises:
          InstructionTooLongError: over ``game.max_instruction_tokens`` (message names the fix).
        """
        return encode_instruction(turn.text, self.engine.spec, self.engine.tok)

    def row(self, ids: tuple[int, ...]) -> tuple[GameRun, int, tuple[int, ...], int]:
        """This game's row of a batched ``engine.step``: (run, seed, ids, turn index)."""
        return self.run, self.seed, ids, len(self.turns)

    def commit(self, turn: Turn, ids: tuple[int, ...], states: np.ndarray, rep: np.ndarray,
               frames: np.ndarray, timing: dict) -> TurnResult:
        """Records one played turn (this game's row of ``engine.step``'s outputs).

        Args:
          states: int ``[4]`` (ML, SC, ET, ST); rep: float32 ``[Q, D]``; frames: float32
          ``[T, 8h, 8w, 3]`` in [0, 1] (None for a turn read back from a saved game, whose clip is on
          disk); timing: the step's stage timings.
        """
        st = tuple(int(v) for v in states)
        meters = self.run.finish_turn(ids, st, rep, int(self.engine.config.game.meter_step))
        tr = TurnResult(st, np.asarray(rep), None if frames is None else np.asarray(frames), meters.as_dict())
        self.turns.append(turn)
        self.text_ids.append(tuple(ids))
        self.results.append(tr)
        self.timings.append(dict(timing))
        return tr

    def undo(self) -> None:
        """Drops the last turn and rebuilds the window and meters from the turns kept.

        Raises:
          IndexError: no turn to undo.
        """
        if not self.turns:
            raise IndexError("no turn to undo")
        for lst in (self.turns, self.text_ids, self.results, self.timings):
            lst.pop()
        self.run = self.engine.new_run()
        step = int(self.engine.config.game.meter_step)
        for ids, tr in zip(self.text_ids, self.results):
            self.run.finish_turn(ids, tr.states, tr.rep, step)

    def start_meters(self) -> dict[str, int]:
        """The meters before the first turn (``game.meter_start``)."""
        return self.engine.new_run().meters.as_dict()

    def result(self) -> dict:
        """The ``GameEngine.play``-style result of the turns so far (for game/folder/saves.py ``save_game``)."""
        return {"game": Game(self.game_id, tuple(self.turns), self.seed, self.characters), "seed": self.seed,
                "turns": list(self.results), "timings": list(self.timings), "text_ids": list(self.text_ids),
                "compile_s": dict(self.engine.compile_s)}
