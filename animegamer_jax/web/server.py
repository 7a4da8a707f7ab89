"""The game server behind ``python -m animegamer_jax.commands.web``: one engine, composed of the
browser sessions (sessions.py), the turn queue and its worker thread (queue.py) and the writer threads
that save turns off the model's thread (saver.py), around one lock."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from animegamer_jax import parallel
from animegamer_jax.game.folder import atomic, layout
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.loading import resolve_system
from animegamer_jax.game.run import TurnResult
from animegamer_jax.game.turn_by_turn import TurnByTurnGame, instruction_from_fields
from animegamer_jax.inference.instructions import FIELDS, GameScriptError, Turn, check_text
from animegamer_jax.inference.layout import setup_jax
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import InstructionTooLongError
from animegamer_jax.web.queue import MAX_BATCH, MAX_QUEUE, Job, TurnQueue
from animegamer_jax.web.saver import Saver
from animegamer_jax.web.sessions import (MAX_EMPTY_SESSIONS, MAX_SESSIONS, SESSION_IDLE_S, BadInput, Busy, Session,
                                         Sessions)

log = logging.getLogger(__name__)


def _fields_named(message: str) -> tuple[str, ...]:
    # the parser's message before its "Fix:" (which names every field)
    head = message.split(" Fix:")[0]
    return tuple(f for f in FIELDS if re.search(rf"\b{f}\b", head, re.IGNORECASE))


class GameServer:
    """One engine serving every browser session: ``sessions`` (:class:`Sessions`), ``queue``
    (:class:`TurnQueue`: its worker plays turns in batches) and ``saver`` (:class:`Saver`: a played
    turn is saved, its frames dropped from memory, then the player told ``done``), all guarded by ``cv``.

    Args:
      engine: the engine (built once; every session plays with it).
      out_dir: parent folder of the game folders (the web command's ``--out``).
      seed: default game seed (None: ``config.game.seed``).
      max_sessions, max_empty_sessions, idle_s: the sessions kept (:class:`Sessions`).
      max_queue: turns that may wait in the queue (running ones not counted); a turn past that is
        refused with queue.py's ``QueueFull``.
      on_turn: called after each turn is saved with ``(k, instruction text, TurnResult, timing
        dict)`` on a writer thread (the command prints the turn's lines, game/run.py ``print_turn``);
        None: nothing.

    Raises:
      ValueError: ``max_queue``, ``max_sessions``, ``max_empty_sessions`` or ``idle_s`` below 1.
      OutputError: ``out_dir`` is not writable.

    Temp folders that a killed server left in ``out_dir`` (``.tmp-web-*``) are removed on construction.
    """

    def __init__(self, engine: GameEngine, out_dir: str, seed: int | None = None, max_sessions: int = MAX_SESSIONS,
                 max_queue: int = MAX_QUEUE, max_empty_sessions: int = MAX_EMPTY_SESSIONS,
                 idle_s: float = SESSION_IDLE_S,
                 on_turn: Callable[[int, str, TurnResult, dict], None] | None = None):
        limits = {"max_queue": max_queue, "max_sessions": max_sessions, "max_empty_sessions": max_empty_sessions,
                  "idle_s": idle_s}
        if any(v < 1 for v in limits.values()):
            raise ValueError(f"{limits} must each be at least 1")
        layout.check_writable(out_dir)
        # temp folders of web games whose server was killed mid-save (a finished one is put back)
        for name in atomic.clean_orphaned_temp(out_dir, "web-"):
            log.info("removed %s (left by a killed server)", name)
        self.engine = engine
        self.out_dir = out_dir
        self.seed = int(engine.config.game.seed) if seed is None else int(seed)
        self.on_turn = on_turn
        self.turns_played = 0
        self.cv = threading.Condition()
        self.saver = Saver(engine, out_dir, self.cv)
        self.sessions = Sessions(engine, out_dir, self.seed, self.cv, self.saver, max_sessions=max_sessions,
                                 max_empty_sessions=max_empty_sessions, idle_s=idle_s)
        self.queue = TurnQueue(engine, self.cv, max_queue, self._played)

    @property
    def max_queue(self) -> int:
        return self.queue.max_queue

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the worker and writer threads (idempotent)."""
        self.queue.start()
        self.saver.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stops the worker after the batch it is running, and the writers once the saves queued
        before are done."""
        self.queue.stop(timeout)
        self.saver.stop(timeout)

    @property
    def alive(self) -> bool:
        return self.queue.alive

    def warmup(self) -> float:
        """Compiles the three stages (the chunked VAE decode included) with one throwaway turn.

        Returns the seconds it took. Nothing is saved.
        """
        t0 = time.perf_counter()
        game = TurnByTurnGame(self.engine, "warmup", self.seed)
        ids = game.encode(instruction_from_fields("Warmup", "stand still", "empty room"))
        rows = [game.row(ids)] * self.engine.batch_size
        self.engine.step(*map(list, zip(*rows)), on_frames=lambda start, frames: None)
        return time.perf_counter() - t0

    # -- turns -----------------------------------------------------------------------------------

    def parse_turn(self, s: Session, body: Any) -> tuple[Turn, tuple[int, ...]]:
        """A turn request body -> (turn, ids).

        ``body``: ``{"character", "motion", "background"}`` strings, or ``{"line": "Character:
        ...; Motion: ...; Background: ..."}``.

        Raises:
          BadInput: not a JSON object, a non-string field, text :func:`check_text` refuses (the text
            policy of every front end), the game-script parser's error, or an instruction over
            ``game.max_instruction_tokens``.
        """
        if not isinstance(body, dict):
            raise BadInput("the request body must be a JSON object with character, motion and background "
                           "(or line). Fix: send {\"character\": ..., \"motion\": ..., \"background\": ...}")
        keys = (*FIELDS, "line")
        unknown = sorted(set(body) - set(keys))
        if unknown:
            raise BadInput(f"unknown key(s) {unknown}; the keys are {list(keys)}. Fix: remove them")
        for k in keys:
            if not isinstance(body.get(k, ""), str):
                raise BadInput(f"{k!r} must be a string, got {type(body[k]).__name__}",
                               (k,) if k in FIELDS else ("line",))
            try:
                check_text(body.get(k, ""), repr(k))
            except GameScriptError as e:
                raise BadInput(str(e), (k,) if k in FIELDS else ("line",)) from None
        line = body.get("line", "")
        where = f"turn {len(s.game) + 1 if s.game else 1}"
        try:
            turn = instruction_from_fields(body.get("character", ""), body.get("motion", ""),
                                           body.get("background", ""), line, where)
        except GameScriptError as e:
            raise BadInput(str(e), ("line",) if line.strip() else _fields_named(str(e))) from None
        game = s.game or TurnByTurnGame(self.engine, "check", self.seed)
        try:
            ids = game.encode(turn)
        except InstructionTooLongError as e:
            raise BadInput(str(e), ("line",) if line.strip() else ("motion", "background")) from None
        return turn, ids

    def submit(self, s: Session, turn: Turn, ids: tuple[int, ...]) -> Job:
        """Queues a turn of ``s``'s game (a new game when it has none).

        Raises:
          Busy: ``s`` has a turn queued or running.
          ServerFull: ``s`` holds no turns and ``max_sessions`` sessions do.
          QueueFull: ``max_queue`` turns are waiting.
        """
        with self.cv:
            if s.job is not None:
                raise Busy("a turn of this game is already queued or running. Fix: wait for it to finish")
            self.sessions.expire()
            self.sessions.check_room(s)
            self.queue.check_room()
            self.sessions.resume(s)
            if s.game is None:
                self.sessions.new_game(s, None)
            return self.queue.put(s, turn, ids)

    def _played(self, job: Job, timing: dict, t0: float) -> None:
        """The worker's hand-off of a played turn: queued for the writer threads."""
        self.saver.later(lambda: self._save_turn(job, timing, t0))

    def _save_turn(self, job: Job, timing: dict, t0: float) -> None:
        """A writer thread's part of a turn: saves it (rolled back when that fails), drops its
        frames from memory, then tells the player ``done``."""
        game = job.game
        k = len(game) - 1
        try:
            self.saver.save_turn(game)
        except Exception as e:  # noqa: BLE001 - the turn is rolled back, the server goes on
            log.error("saving %s failed:\n%s", game.game_id, traceback.format_exc())
            with self.cv:
                game.undo()
            self.queue.finish(job, "error", message=f"the turn could not be saved ({type(e).__name__}: {e}); "
                                                    f"the game is unchanged. Fix: check the output folder "
                                                    f"{self.out_dir!r}, then try again")
            return
        with self.cv:
            game.results[k] = dataclasses.replace(game.results[k], frames=None)  # on disk now
            job.session.version += 1
            self.turns_played += 1
            if k == 0:
                self.sessions.persist(job.session)
        if self.on_turn is not None:
            self.on_turn(k, job.turn.text, game.results[k], timing)
        with self.cv:
            job.session.job = None
        job.emit("done", state=self.sessions.state(job.session), turn_s=time.perf_counter() - t0)


def build_server(config, checkpoint: str = "", standin: bool = False, *, out: str, verify: str = "fast",
                 random_fallback: bool = False,
                 max_queue: int = MAX_QUEUE, max_sessions: int = MAX_SESSIONS,
                 max_batch: int = MAX_BATCH,
                 on_turn: Callable[[int, str, TurnResult, dict], None] | None = None) -> GameServer:
    """The :class:`GameServer` of a config and a system (worker not started).

    Args:
      config: the run config (``game.mode`` applied here; ``game.seed``: the default game seed).
      checkpoint, standin, random_fallback, verify: which system to play, as ``loading.resolve_system``.
      out: parent folder of the game folders (the command's ``--out``).
      max_queue: turns that may wait before new ones are refused (:class:`GameServer`).
      max_sessions: sessions holding turns before new players are refused (:class:`GameServer`).
      max_batch: turns of different players in one batched step per data-parallel slice: the
        engine's one batch shape (``GameEngine`` ``rows``).
      on_turn: called after each saved turn (:class:`GameServer`).

    Raises:
      CheckpointError: a missing or bad checkpoint. OutputError: ``out`` not writable.
      ValueError: ``max_queue``, ``max_sessions`` or ``max_batch`` below 1.
    """
    setup_jax()
    mesh = parallel.mesh_from_config(config)
    system = resolve_system(apply_mode(config), checkpoint, standin, mesh=mesh, verify=verify,
                            random_fallback=random_fallback)
    engine = GameEngine(config, system, mesh=mesh, rows=max_batch)
    return GameServer(engine, out, max_sessions=max_sessions, max_queue=max_queue,
                      on_turn=on_turn)
