"""The game server's saves, off the model's thread: :data:`WRITERS` writer threads running queued work
in order, and one lock per game folder held while that folder is written."""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable

from animegamer_jax.game.folder import layout, saves
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.turn_by_turn import TurnByTurnGame
from animegamer_jax.io import fileio

log = logging.getLogger(__name__)

#: writer threads (saves of different games run at once; a game has one turn in flight at a time)
WRITERS = 2


class Saver:
    """The writer threads and the game folders' locks of one game server.

    Args:
      engine: the server's engine (the saves' system identity and config).
      out_dir: parent folder of the game folders.
      cv: the server's one condition; it guards the queued work (and the locks table).
    """

    def __init__(self, engine: GameEngine, out_dir: str, cv: threading.Condition):
        self.engine, self.out_dir, self.cv = engine, out_dir, cv
        self._writes: list[Callable[[], None] | None] = []  # the writer threads' work, in order
        self._threads: list[threading.Thread] = []
        self._locks: dict[str, threading.Lock] = {}  # game id -> held while its folder is written

    def start(self) -> None:
        """Starts the writer threads (idempotent: not while one is alive)."""
        if not any(w.is_alive() for w in self._threads):
            self._threads = [threading.Thread(target=self._loop, name=f"game-writer-{i}", daemon=True)
                             for i in range(WRITERS)]
            for w in self._threads:
                w.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stops the writer threads once the work queued before is done (each joined for ``timeout`` s)."""
        for _ in self._threads:
            self.later(None)
        for w in self._threads:
            w.join(timeout)

    def later(self, work: Callable[[], None] | None) -> None:
        """Queues ``work`` for a writer thread (run in order; an exception is logged; None stops one thread)."""
        with self.cv:
            self._writes.append(work)
            self.cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self._writes:
                    self.cv.wait()
                work = self._writes.pop(0)
            if work is None:
                return
            try:
                work()
            except BaseException:  # never let the writer die
                log.error("a save failed:\n%s", traceback.format_exc())
            del work  # not kept (with its turn's job and events) while waiting for the next

    def disk_lock(self, game_id: str) -> threading.Lock:
        """The lock held while game ``game_id``'s folder is written."""
        with self.cv:
            return self._locks.setdefault(game_id, threading.Lock())

    def save_turn(self, game: TurnByTurnGame) -> None:
        """Saves ``game``'s last turn (``saves.save_turn``: its first turn makes the folder, ids being
        unique per server; a later one adds its own files), holding the folder's lock and the signals."""
        with self.disk_lock(game.game_id), fileio.signals_held():
            saves.save_turn(self.engine.config, self.engine.model, game, self.out_dir, new_folder=len(game) == 1)

    def finish(self, folder: str, game_id: str) -> None:
        """Makes ``game.mp4`` and the contact sheet of game ``game_id`` in ``folder`` cover every saved
        turn (``saves.finish_session``; nothing to do when they do, or when ``folder`` holds no
        finished game), holding the folder's lock and the signals."""
        with self.disk_lock(game_id), fileio.signals_held():
            if layout.is_finished(folder):
                saves.finish_session(self.engine.config, folder)
