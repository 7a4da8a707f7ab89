"""The game server's turn queue: jobs (a queued turn and its event log) in first-in first-out order,
played by one worker thread in batches of the engine's one batch shape; a full queue refuses a turn
with :class:`QueueFull` and a ``Retry-After`` estimate."""

from __future__ import annotations

import base64
import io
import logging
import math
import secrets
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from PIL import Image

from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.turn_by_turn import TurnByTurnGame
from animegamer_jax.inference.instructions import Turn
from animegamer_jax.inference.vae_decode import FRAME_RANGE
from animegamer_jax.io import media

log = logging.getLogger(__name__)

TERMINAL = ("done", "error")
#: default turns waiting in the queue before new ones are refused ("busy, try again")
MAX_QUEUE = 32
#: seconds a batch is assumed to take before one has been timed (for ``Retry-After``)
DEFAULT_BATCH_S = 5.0
#: default turns of different players run in one batched step, per data-parallel slice (``--max_batch``)
MAX_BATCH = 4


class QueueFull(RuntimeError):
    """The turn queue holds ``max_queue`` turns (HTTP 503); ``retry_after_s`` estimates when to retry."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Player(Protocol):
    """What a job needs of its session (sessions.py ``Session``): its current game, its pending job."""

    game: TurnByTurnGame | None
    job: "Job | None"


def frame_data_urls(frames: np.ndarray, quality: int = 85) -> list[str]:
    """float ``[f, H, W, 3]`` in [0, 1] (or uint8) -> one ``data:image/jpeg;base64`` URL a frame."""
    out = []
    for f in media.to_uint8(frames, FRAME_RANGE):
        buf = io.BytesIO()
        Image.fromarray(f).save(buf, format="JPEG", quality=quality)
        out.append("data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


class Job:
    """One queued turn and its event log (``queued``, ``started``, ``frames`` once per decoded VAE
    chunk, then ``done`` or ``error``).

    ``events`` only grows; ``notify`` (set by the HTTP layer) is called after every append, from
    the worker or a writer thread, so a streaming response can wake up. ``ticket``: the order it was
    queued in; ``served``: the order it started in (first in, first out: the two are equal).
    """

    def __init__(self, session: Player, turn: Turn, ids: tuple[int, ...], ticket: int = 0):
        self.id = secrets.token_hex(6)
        self.ticket = ticket
        self.session = session
        self.game = session.game
        self.turn = turn
        self.ids = ids
        self.events: list[dict] = []
        self.notify: Callable[[], None] | None = None
        self.submitted = time.perf_counter()
        self.served = 0  # the order it started in (set by the worker)
        self.saving = False  # handed to the writer thread (which finishes it)

    def emit(self, event: str, **data: Any) -> None:
        self.events.append({"event": event, **data})
        if self.notify is not None:
            try:
                self.notify()
            except RuntimeError:  # the HTTP loop is gone (server shutting down): nobody listens
                self.notify = None

    @property
    def finished(self) -> bool:
        return bool(self.events) and self.events[-1]["event"] in TERMINAL


class TurnQueue:
    """Turns waiting and running, and the worker thread that plays them on ``engine``.

    The worker takes up to ``engine.batch_size`` waiting turns (one per game) into one batched step;
    the step always has that one shape (a short batch is padded with filler rows, whose outputs are
    dropped), so a game's clips do not depend on who else was in its batch. Every waiting turn is
    told its position whenever it changes.

    Args:
      engine: the server's engine.
      cv: the server's one condition; it guards the queue and the sessions' ``job``.
      max_queue: turns that may wait (running ones not counted).
      on_played: called on the worker thread with ``(job, timing dict, t0)`` for each turn played and
        committed to its game (``job.saving`` set): the caller saves it and ends the job.
    """

    def __init__(self, engine: GameEngine, cv: threading.Condition, max_queue: int,
                 on_played: Callable[[Job, dict, float], None]):
        self.engine, self.cv, self.max_queue, self.on_played = engine, cv, int(max_queue), on_played
        self._queue: list[Job] = []
        self._running: list[Job] = []
        self._stop = False
        self._worker: threading.Thread | None = None
        self._tickets = 0  # turns queued so far
        self._served = 0  # turns started so far
        self._batch_s: float | None = None  # moving average of a batch's seconds (Retry-After)

    def start(self) -> None:
        """Starts the worker thread (idempotent: not while it is alive)."""
        if self._worker is None or not self._worker.is_alive():
            self._stop = False
            self._worker = threading.Thread(target=self._work, name="game-worker", daemon=True)
            self._worker.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stops the worker after the batch it is running (joined for ``timeout`` s)."""
        with self.cv:
            self._stop = True
            self.cv.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)

    @property
    def alive(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def retry_after_s(self) -> int:
        """Seconds until the queue has room, estimated from recent batch times: whole seconds in 1..3600."""
        with self.cv:
            batches = math.ceil((len(self._queue) + len(self._running)) / self.engine.batch_size)
            per = DEFAULT_BATCH_S if self._batch_s is None else self._batch_s
            return int(min(3600, max(1, math.ceil(per * max(1, batches)))))

    def check_room(self) -> None:
        """Raises :class:`QueueFull` (with :meth:`retry_after_s`) when ``max_queue`` turns wait
        (call with the lock held)."""
        if len(self._queue) >= self.max_queue:
            wait = self.retry_after_s()
            raise QueueFull(f"the server is busy: the turn queue is full ({len(self._queue)} turns waiting). "
                            f"Fix: try again in {wait} s", wait)

    def put(self, session: Player, turn: Turn, ids: tuple[int, ...]) -> Job:
        """Queues a turn of ``session``'s current game as its ``job`` (call with the lock held, after
        :meth:`check_room`)."""
        self._tickets += 1
        job = Job(session, turn, ids, self._tickets)
        session.job = job
        self._queue.append(job)
        self._announce()
        self.cv.notify_all()
        return job

    def finish(self, job: Job, event: str, **data: Any) -> None:
        """Ends ``job`` with ``event`` (``done`` or ``error``): its session may queue again."""
        with self.cv:
            job.session.job = None
        job.emit(event, **data)

    def _announce(self) -> None:
        """Tells every waiting job its place (call with the lock held)."""
        running = len(self._running)
        for i, job in enumerate(self._queue):
            job.emit("queued", position=i + 1, ahead=i + running, ticket=job.ticket)

    def _take(self) -> list[Job] | None:
        with self.cv:
            while not self._queue and not self._stop:
                self.cv.wait()
            if self._stop:
                return None
            batch: list[Job] = []
            for job in list(self._queue):
                if len(batch) == self.engine.batch_size:
                    break
                if all(j.game is not job.game for j in batch):
                    batch.append(job)
                    self._queue.remove(job)
            self._running = batch
            for job in batch:
                self._served += 1
                job.served = self._served
            self._announce()
            return batch

    def _work(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            t0 = time.perf_counter()
            try:
                self._run(batch)
                dt = time.perf_counter() - t0  # the model and the saves: what the next in line waits for
                with self.cv:
                    self._batch_s = dt if self._batch_s is None else 0.7 * self._batch_s + 0.3 * dt
            except BaseException:  # never let the worker die: report and go on
                log.error("turn batch failed:\n%s", traceback.format_exc())
                for job in batch:
                    if not job.finished and not job.saving:
                        self.finish(job, "error", message="internal error; the game is unchanged")
            finally:
                with self.cv:
                    self._running = []
                    self._announce()
            del batch  # not kept (with its event logs and frames) while waiting for the next turn

    def _run(self, batch: list[Job]) -> None:
        for job in batch:
            job.emit("started", wait_s=time.perf_counter() - job.submitted, ticket=job.ticket, served=job.served)
        rows = [job.game.row(job.ids) for job in batch]
        rows += [rows[0]] * (self.engine.batch_size - len(rows))
        runs, seeds, ids, ks = (list(x) for x in zip(*rows))

        def on_frames(start: int, frames: np.ndarray) -> None:
            for b, job in enumerate(batch):
                job.emit("frames", start=int(start), frames=frame_data_urls(frames[b]),
                         since_submit_s=time.perf_counter() - job.submitted)

        t0 = time.perf_counter()
        try:
            refs = [job.game.reference(job.turn) for job in batch]  # each game's own characters, or None
            refs += [None] * (self.engine.batch_size - len(refs))
            chars = [self.engine.character_index(job.turn.character) for job in batch]  # stored character LoRAs
            chars += [None] * (self.engine.batch_size - len(chars))
            states, rep, frames, timing = self.engine.step(
                runs, seeds, ids, ks, on_frames=on_frames,
                references=refs if any(r is not None for r in refs) else None, characters=chars)
        except Exception as e:  # noqa: BLE001 - any model failure: the turn fails, the server goes on
            log.error("turn failed:\n%s", traceback.format_exc())
            for job in batch:
                self.finish(job, "error", message=f"the turn failed ({type(e).__name__}: {e}); "
                                                  f"the game is unchanged. Fix: try again")
            return
        timing["batch"] = len(batch)
        for b, job in enumerate(batch):
            with self.cv:
                job.game.commit(job.turn, job.ids, states[b], rep[b], media.to_uint8(frames[b], FRAME_RANGE),
                                timing)
            job.saving = True
            self.on_played(job, timing, t0)
