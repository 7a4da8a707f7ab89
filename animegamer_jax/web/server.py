"""The game server behind ``python -m animegamer_jax.commands.web``: sessions, a turn queue, one engine.

* **One model instance**: one :class:`~animegamer_jax.game.engine.GameEngine`, driven by one
  worker thread (:func:`build_server` builds both). Each turn is ``engine.step`` (the same three
  jitted stages as ``play``).
* **Saves off the model's thread**: a played turn goes to a writer thread (:data:`WRITERS` of them:
  saves of different games run at once), which saves it with
  ``saving.save_turn`` (the game/writers.py layout, ``<out>/<game_id>/``: the first turn makes the
  folder, every later one writes only its own clip, GIF and state record, then ``game.json`` and
  ``index.html``: the cost does not grow with the game) and then tells the player ``done``; the
  model meanwhile runs the next batch. A saved turn's frames are dropped from memory. ``game.mp4``
  and the contact sheet (whose cost grows with the game) are made on demand: when the page asks
  for them or the game's zip (:meth:`GameServer.finish_game`), and when a session leaves a game
  (restart, expiry).
* **Queue**: turns wait in FIFO order; the worker takes up to ``engine.batch_size`` of them (one
  per game: ``--max_batch`` games per data-parallel slice) into one batched step. The step always
  has that one shape (a short batch is padded with filler rows, whose outputs are dropped), so a
  game's clips do not depend on who else was in its batch: played beside others they equal, byte
  for byte, the same game played alone on the server. Every
  waiting turn is told its position whenever it changes. The queue holds at most ``max_queue``
  turns; past that a turn is refused with :class:`QueueFull` (HTTP 503 + ``Retry-After``). Every
  turn gets a ``ticket`` (the order it was queued in) and, when it starts, ``served`` (the order
  turns started in): first in, first out means the two are equal.
* **Sessions**: each browser session (a cookie) has its own game; a session can have one turn
  queued or running at a time; game files are served only to the session that played them.
  Session ids are 24 random URL-safe characters (:func:`secrets.token_urlsafe`, 144 bits). Only
  :meth:`GameServer.new_session` makes one (the page load, ``GET /``, in app.py).
* **Memory**: bounded by the sessions kept plus the queue. A session that holds turns (its game
  can be continued) is never dropped to make room: at most ``max_sessions`` of them, and past that
  a new player is refused (:class:`ServerFull`, HTTP 503) rather than an old game dropped. Sessions
  without turns (a page loaded, nothing played) are small: at most ``max_empty_sessions``, the
  least recently seen dropped first. Any session unseen for ``idle_s`` seconds is dropped from
  memory, unless a turn of it is queued or running; its games stay saved on disk and, when it
  played any, it is known again when its cookie comes back (**Restarts**). A finished turn's event log
  (its streamed frames) is dropped once its stream ends.
* **Input**: instruction text is one line of printable text (inference/instructions.py :func:`check_text`, the
  text policy of every front end): control characters (which would reach the server's log and
  terminal), lone surrogates (which cannot be written as UTF-8), bidirectional overrides and
  invisible format characters are refused.
* **Streaming**: a turn's events (``queued``, ``started``, ``frames`` once per decoded VAE chunk,
  ``done`` or ``error``) go to the player as they happen (:class:`Job`).
* **Restarts**: which games each session played, and its current one, is kept in
  ``<out>/.web-sessions.json`` (:data:`SESSIONS_FILE`, written atomically whenever a session's saved
  games change; keyed by the sha256 of the session id, so the file does not hold the cookies). A
  server started on the same output folder knows those sessions again: a player whose cookie it
  issued before the restart gets their game back (read with ``saving.load_game``) and the next turn
  continues it; the same access rules hold (the cookie named by the port, ``--token``).
* **Failures**: a turn that raises (in the model or while saving) leaves the game as it was
  before the turn and the server running; the player gets the error.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import json
import io
import logging
import math
import os
import re
import secrets
import shutil
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from animegamer_jax import parallel

from animegamer_jax.io import fileio

from animegamer_jax.tokenizers import mllm_tokenizer

from animegamer_jax.io import paths

from animegamer_jax.io import media
from animegamer_jax.game import characters as characters_lib
from animegamer_jax.game import saving, writers
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.loading import resolve_system
from animegamer_jax.game.run import METER_NAMES, TurnResult
from animegamer_jax.game.turn_by_turn import TurnByTurnGame, instruction_from_fields
from animegamer_jax.inference.instructions import FIELDS, GameScriptError, Turn, check_text, is_plain_name
from animegamer_jax.inference.layout import setup_jax
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import InstructionTooLongError
from animegamer_jax.inference.vae_decode import FRAME_RANGE

log = logging.getLogger(__name__)

TERMINAL = ("done", "error")
#: the session ids this server issues (``secrets.token_urlsafe(18)``); anything else is tampered with
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{24}$")
#: seed range accepted by restart (what a signed 64-bit integer holds; ``turn_key`` uses the low 64 bits)
SEED_RANGE = (-2**63, 2**63 - 1)
#: default turns waiting in the queue before new ones are refused ("busy, try again")
MAX_QUEUE = 32
#: seconds a batch is assumed to take before one has been timed (for ``Retry-After``)
DEFAULT_BATCH_S = 5.0
#: default sessions holding turns (games in play) kept; past that new players get 503
MAX_SESSIONS = 64
#: default sessions without turns kept (page loads that have not played); past that the oldest go
MAX_EMPTY_SESSIONS = 256
#: writer threads (saves of different games run at once; a game has one turn in flight at a time)
WRITERS = 2
#: in the output folder: which saved games each session played (:meth:`GameServer.persist`)
SESSIONS_FILE = ".web-sessions.json"
#: default turns of different players run in one batched step, per data-parallel slice (``--max_batch``)
MAX_BATCH = 4
#: default seconds a session may go unseen before it is dropped (its games stay saved on disk)
SESSION_IDLE_S = 12 * 3600
#: the largest uploaded reference image, decoded bytes (``POST /api/character``)
MAX_CHARACTER_BYTES = 8 * 1024 * 1024


class BadInput(ValueError):
    """A turn request the server refuses (HTTP 400); ``fields`` names the form fields at fault."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.fields = fields


class Busy(RuntimeError):
    """The session already has a turn queued or running (HTTP 409)."""


class ServerFull(RuntimeError):
    """``max_sessions`` sessions hold games in play (HTTP 503): a new player is refused, no game dropped."""


class QueueFull(RuntimeError):
    """The turn queue holds ``max_queue`` turns (HTTP 503); ``retry_after_s`` estimates when to retry."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def session_id_ok(sid: str) -> bool:
    """True when ``sid`` has the form of the session ids this server issues (:data:`SESSION_ID`)."""
    return bool(SESSION_ID.match(sid))


def _fields_named(message: str) -> tuple[str, ...]:
    # the parser's message before its "Fix:" (which names every field)
    head = message.split(" Fix:")[0]
    return tuple(f for f in FIELDS if re.search(rf"\b{f}\b", head, re.IGNORECASE))


def frame_data_urls(frames: np.ndarray, quality: int = 85) -> list[str]:
    """float ``[f, H, W, 3]`` in [0, 1] (or uint8) -> one ``data:image/jpeg;base64`` URL a frame."""
    out = []
    for f in media.to_uint8(frames, FRAME_RANGE):
        buf = io.BytesIO()
        Image.fromarray(f).save(buf, format="JPEG", quality=quality)
        out.append("data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


class Job:
    """One queued turn and its event log.

    ``events`` only grows; ``notify`` (set by the HTTP layer) is called after every append, from
    the worker thread, so a streaming response can wake up.
    """

    def __init__(self, session: "Session", turn: Turn, ids: tuple[int, ...], ticket: int = 0):
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


class Session:
    """One browser session: its current game, the games it played, its pending turn."""

    def __init__(self, sid: str):
        self.id = sid
        self.game: TurnByTurnGame | None = None
        self.games: set[str] = set()
        self.job: Job | None = None
        self.version = 0  # bumped on every save: cache-busting for the clip URLs
        self.last_seen = time.time()
        self.resume: str | None = None  # a saved game to read back before the next turn (restart)

    @property
    def holds_turns(self) -> bool:
        """True while its game has turns (it can be continued) or a turn of it is queued or running."""
        return self.job is not None or (self.game is not None and len(self.game) > 0)


class GameServer:
    """Sessions, the turn queue and the worker thread around one engine.

    Args:
      engine: the engine (built once; every session plays with it).
      out_dir: parent folder of the game folders (the web command's ``--out``).
      seed: default game seed (None: ``config.game.seed``).
      max_sessions: sessions holding turns kept in memory (each holds its game's states and s_a, not its frames, which are on disk); past that
        a new session, or the first turn of a session without turns, is refused with
        :class:`ServerFull` (no player's game is dropped to make room).
      max_queue: turns that may wait in the queue (running ones not counted); a turn past that is
        refused with :class:`QueueFull`.
      max_empty_sessions: sessions without turns kept; past that the least recently seen are dropped.
      idle_s: seconds a session may go unseen before it is dropped (not while a turn of it is
        queued or running); its games stay saved on disk.
      on_turn: called after each turn is saved with ``(k, instruction text, TurnResult, timing
        dict)`` on the writer thread (the command prints the turn's lines, ``saving.print_turn``);
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
        writers.check_writable(out_dir)
        # temp folders of web games whose server was killed mid-save (a finished one is put back)
        for name in writers.clean_orphaned_temp(out_dir, "web-"):
            log.info("removed %s (left by a killed server)", name)
        self.max_sessions = int(max_sessions)
        self.max_empty_sessions = int(max_empty_sessions)
        self.idle_s = float(idle_s)
        self.max_queue = int(max_queue)
        self.engine = engine
        self.out_dir = out_dir
        self.seed = int(engine.config.game.seed) if seed is None else int(seed)
        self.on_turn = on_turn
        self.sessions: dict[str, Session] = {}
        self._cv = threading.Condition()
        self._queue: list[Job] = []
        self._running: list[Job] = []
        self._stop = False
        self._worker: threading.Thread | None = None
        self.turns_played = 0
        self._tickets = 0  # turns queued so far
        self._served = 0  # turns started so far
        self._batch_s: float | None = None  # moving average of a batch's seconds (Retry-After)
        self._writes: list[Callable[[], None]] = []  # the writer thread's work, in order
        self._writers: list[threading.Thread] = []
        self._disk_locks: dict[str, threading.Lock] = {}  # game id -> held while its folder is written
        self._saved = self._read_sessions()  # sha256 of session id -> {"games": [...], "current": id}

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the worker and writer threads (idempotent)."""
        if self._worker is None or not self._worker.is_alive():
            self._stop = False
            self._worker = threading.Thread(target=self._work, name="game-worker", daemon=True)
            self._worker.start()
        if not any(w.is_alive() for w in self._writers):
            self._writers = [threading.Thread(target=self._write_loop, name=f"game-writer-{i}", daemon=True)
                             for i in range(WRITERS)]
            for w in self._writers:
                w.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stops the worker after the batch it is running, and the writer once the saves queued
        before are done."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)
        for _ in self._writers:
            self._write_later(None)  # after every save the worker queued
        for w in self._writers:
            w.join(timeout)

    def _write_later(self, work: Callable[[], None] | None) -> None:
        """Queues ``work`` for the writer thread (runs in order; an exception is logged; None stops it)."""
        with self._cv:
            self._writes.append(work)
            self._cv.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while not self._writes:
                    self._cv.wait()
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
        with self._cv:
            return self._disk_locks.setdefault(game_id, threading.Lock())

    def finish_game(self, s: Session, game_id: str) -> str | None:
        """Makes ``game.mp4`` and the contact sheet of session ``s``'s game ``game_id`` cover every
        saved turn (``saving.finish_session``; nothing to do when they do). Returns the folder, or
        None when ``s`` did not play it or it is not on disk."""
        folder = self.game_dir(s, game_id)
        if folder is None:
            return None
        with self.disk_lock(game_id), fileio.signals_held():
            if writers.is_finished(folder):
                saving.finish_session(self.engine, folder)
        return folder

    def _finish_later(self, s: Session, game: TurnByTurnGame | None) -> None:
        """Queues :meth:`finish_game` of ``game`` (a game ``s`` leaves) for the writer thread."""
        if game is not None and len(game):
            self._write_later(lambda: self.finish_game(s, game.game_id))

    @property
    def alive(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

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

    # -- sessions --------------------------------------------------------------------------------

    # -- persistence ---------------------------------------------------------------------------

    @staticmethod
    def _key(sid: str) -> str:
        return hashlib.sha256(sid.encode()).hexdigest()

    def _read_sessions(self) -> dict[str, dict]:
        """:data:`SESSIONS_FILE`'s sessions (empty when there is none; a damaged one is logged and ignored)."""
        path = paths.join(self.out_dir, SESSIONS_FILE)
        if not fileio.isfile(path):
            return {}
        try:
            data = json.loads(fileio.read_bytes(path).decode("utf-8"))
            saved = {str(k): {"games": [str(g) for g in v["games"]], "current": v.get("current")}
                     for k, v in data["sessions"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("ignoring %s (%s): players of the last server start new games", path, e)
            return {}
        log.info("%d session(s) of an earlier server known again", len(saved))
        return saved

    def persist(self, s: Session) -> None:
        """Records ``s``'s games on disk and its current one in :data:`SESSIONS_FILE` (atomically;
        call with the lock held)."""
        games = sorted(g for g in s.games if self.game_dir(s, g) is not None)
        current = s.game.game_id if s.game is not None else s.resume
        entry = {"games": games, "current": current if current in games else None}
        key = self._key(s.id)
        if self._saved.get(key) == entry or (not games and key not in self._saved):
            return
        self._saved[key] = entry
        fileio.write_text_atomic(paths.join(self.out_dir, SESSIONS_FILE),
                                 json.dumps({"format": 1, "sessions": self._saved}, indent=1, sort_keys=True) + "\n")

    def _known_again(self, sid: str) -> Session | None:
        """A session of an earlier server on this output folder, rebuilt (call with the lock held)."""
        entry = self._saved.get(self._key(sid))
        if entry is None:
            return None
        s = Session(sid)
        s.games = {g for g in entry["games"] if is_plain_name(g) and os.path.isdir(os.path.join(self.out_dir, g))}
        s.resume = entry["current"] if entry["current"] in s.games else None
        self.sessions[sid] = s
        return s

    def _resume(self, s: Session) -> None:
        """Reads back ``s``'s current saved game when it has none in memory (call with the lock held)."""
        if s.game is None and s.resume is not None:
            game_id, s.resume = s.resume, None
            try:
                self._continue(s, game_id)
            except (BadInput, writers.OutputError) as e:
                log.warning("session's game %s cannot be continued: %s", game_id, e)

    def find_session(self, sid: str | None) -> Session | None:
        """The live session of cookie value ``sid`` (now seen), or None (no new session is made).
        A session of an earlier server on this output folder is known again (:data:`SESSIONS_FILE`)."""
        with self._cv:
            self._expire()
            s = self.sessions.get(sid) if sid else None
            if s is None and sid and session_id_ok(sid):
                s = self._known_again(sid)
            if s is not None:
                s.last_seen = time.time()
            return s

    def new_session(self) -> Session:
        """A new session (only the page load makes one); drops sessions as :class:`GameServer` says.

        Raises:
          ServerFull: ``max_sessions`` sessions hold turns.
        """
        with self._cv:
            self._expire()
            self._check_room(None)
            s = Session(secrets.token_urlsafe(18))
            self.sessions[s.id] = s
            empty = sorted((x for x in self.sessions.values() if not x.holds_turns), key=lambda x: x.last_seen)
            for old in empty[: max(0, len(empty) - self.max_empty_sessions)]:
                del self.sessions[old.id]
            return s

    def _expire(self) -> None:
        """Drops the sessions unseen for ``idle_s`` seconds but those with a turn queued or running
        (call with the lock held)."""
        now = time.time()
        for s in [x for x in self.sessions.values() if x.job is None and now - x.last_seen > self.idle_s]:
            del self.sessions[s.id]
            self._finish_later(s, s.game)

    def _check_room(self, s: Session | None) -> None:
        """Raises :class:`ServerFull` when ``s`` (None: a new session) holds no turns and
        ``max_sessions`` sessions do (call with the lock held)."""
        if s is not None and s.holds_turns:
            return
        playing = sum(x.holds_turns for x in self.sessions.values())
        if playing >= self.max_sessions:
            raise ServerFull(f"the server holds the games of {playing} players, its limit (--max_sessions "
                             f"{self.max_sessions}); a game unseen for {self.idle_s / 3600:g} h is let go. "
                             f"Fix: try again later")

    def _new_game(self, s: Session, seed: int | None, characters: tuple = ()) -> TurnByTurnGame:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        game_id = f"web-{stamp}-{secrets.token_hex(3)}"
        s.game = TurnByTurnGame(self.engine, game_id, self.seed if seed is None else int(seed),
                                characters=tuple(characters))
        s.games.add(game_id)
        return s.game

    def _continue(self, s: Session, game_id: str) -> TurnByTurnGame:
        """Makes ``s``'s current game its saved game ``game_id``, read back with ``saving.load_game``
        (checked; frames stay on disk).

        Raises:
          BadInput: ``s`` did not play ``game_id`` or it is not on disk.
          writers.SavedGameError: the save cannot be continued (message names why and the fix).
        """
        folder = self.game_dir(s, game_id)
        if folder is None:
            raise BadInput(f"no saved game {game_id!r} in this session. Fix: pick one of the page's saved games (state's saved_games)")
        with self.disk_lock(game_id):
            game, _ = saving.load_game(self.engine, folder, game_id=game_id)
        s.game = game
        return game

    def game_dir(self, s: Session, game_id: str) -> str | None:
        """The folder of ``game_id`` when session ``s`` played it and it exists, else None."""
        if game_id not in s.games:
            return None
        path = os.path.join(self.out_dir, game_id)
        return path if os.path.isdir(path) else None

    # -- requests --------------------------------------------------------------------------------

    def parse_turn(self, s: Session, body: Any) -> tuple[Turn, tuple[int, ...]]:
        """A turn request body -> (turn, ids).

        ``body``: ``{"character", "motion", "background"}`` strings, or ``{"line": "Character:
        ...; Motion: ...; Background: ..."}``.

        Raises:
          BadInput: not a JSON object, a non-string field, text :func:`check_text` refuses, the
            game-script parser's error, or an instruction over ``game.max_instruction_tokens``.
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
        with self._cv:
            if s.job is not None:
                raise Busy("a turn of this game is already queued or running. Fix: wait for it to finish")
            self._expire()
            self._check_room(s)
            if len(self._queue) >= self.max_queue:
                wait = self.retry_after_s()
                raise QueueFull(f"the server is busy: the turn queue is full ({len(self._queue)} turns waiting). "
                                f"Fix: try again in {wait} s", wait)
            self._resume(s)
            if s.game is None:
                self._new_game(s, None)
            self._tickets += 1
            job = Job(s, turn, ids, self._tickets)
            s.job = job
            self._queue.append(job)
            self._announce()
            self._cv.notify_all()
            return job

    def undo(self, s: Session) -> dict:
        """Drops the last turn of ``s``'s game and saves the game without it.

        With no turn left the game folder (written by this server for this game) is removed.

        Raises:
          Busy: a turn is queued or running. IndexError: nothing to undo. BadInput: the game's folder
          is no longer on disk (removed outside the server): nothing is changed.
        """
        with self._cv:
            if s.job is not None:
                raise Busy("a turn is being generated. Fix: wait for it, then undo")
            self._resume(s)
            if s.game is None or not len(s.game):
                raise IndexError("there is no turn to undo")
            game = s.game
            folder = os.path.join(self.out_dir, game.game_id)
            if not writers.is_finished(folder):
                raise BadInput(f"game {game.game_id}'s folder is no longer in {self.out_dir} (removed outside "
                               f"the server), so its turns cannot be undone there. Fix: restart for a new game")
            with self.disk_lock(game.game_id), fileio.signals_held():
                game.undo()
                # under the lock: no turn of this session can start while the folder is rewritten
                try:
                    if len(game):
                        saving.drop_turn(self.engine, game, self.out_dir)
                    elif game.game_id in s.games and writers.is_finished(folder):
                        shutil.rmtree(folder)
                        self.persist(s)
                except Exception:
                    log.error("undo of %s failed on disk:\n%s", game.game_id, traceback.format_exc())
                    s.game = None
                    self._continue(s, game.game_id)  # the game as it is on disk
                    raise
            s.version += 1
            return self.state(s)

    def restart(self, s: Session, seed: int | None = None) -> dict:
        """Starts a new game for ``s`` (the previous game's folder stays on disk).

        Raises:
          Busy: a turn is queued or running. BadInput: ``seed`` is not an integer in :data:`SEED_RANGE`.
        """
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                                 or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
            raise BadInput("restart takes {\"seed\": <integer>} (a signed 64-bit integer) or nothing")
        with self._cv:
            if s.job is not None:
                raise Busy("a turn is being generated. Fix: wait for it, then restart")
            self._finish_later(s, s.game)
            self._new_game(s, seed)
            self.persist(s)
        return self.state(s)

    def add_character(self, s: Session, name: Any, image_b64: Any) -> dict:
        """Starts a new game for ``s`` whose turns naming ``name`` are decoded with the uploaded image
        as their reference (game/characters.py, as play's ``--character``); it keeps the current
        game's other characters and seed, and records them in its game.json. A game's characters
        are fixed when it starts, so its output depends only on its own inputs and seed; the
        previous game stays saved. Returns the new state.

        Raises:
          BadInput: ``name`` / ``image_b64`` not strings, not base64, over
            :data:`MAX_CHARACTER_BYTES` decoded, an image ``characters.character_from_bytes``
            refuses (one line), or a system without a reference adapter. Busy: a turn is queued or running.
        """
        if not isinstance(name, str) or not isinstance(image_b64, str):
            raise BadInput("character takes {\"name\": \"<character name>\", \"image_b64\": \"<the image, base64>\"}")
        if not self.engine.supports_references:
            raise BadInput(f"this server's system ({self.engine.model.label}) has no reference adapter. Fix: serve "
                           f"a checkpoint trained with phase r (docs/training.md#phase-r-reference)")
        if len(image_b64) > 4 * (MAX_CHARACTER_BYTES // 3 + 1):
            raise BadInput(f"the image is over {MAX_CHARACTER_BYTES >> 20} MB. Fix: upload a smaller picture")
        try:
            data = base64.b64decode(image_b64, validate=True)
        except ValueError:
            raise BadInput("image_b64 is not base64. Fix: send the file's bytes base64-encoded") from None
        if len(data) > MAX_CHARACTER_BYTES:
            raise BadInput(f"the image is over {MAX_CHARACTER_BYTES >> 20} MB. Fix: upload a smaller picture")
        try:
            char = characters_lib.character_from_bytes(name.strip(), data, f"character {name.strip()!r}")
        except characters_lib.CharacterError as e:
            raise BadInput(str(e)) from None
        with self._cv:
            if s.job is not None:
                raise Busy("a turn is being generated. Fix: wait for it, then add the character")
            self._resume(s)
            old = s.game
            kept = () if old is None else tuple(c for c in old.characters
                                               if c.name.casefold() != char.name.casefold())
            self._finish_later(s, old)
            self._new_game(s, None if old is None else old.seed, (*kept, char))
            s.version += 1
            self.persist(s)
        return self.state(s)

    def continue_game(self, s: Session, game_id: Any) -> dict:
        """Makes ``s``'s saved game ``game_id`` its current game again (read back from its save);
        the game it leaves gets its game video and contact sheet. Returns the new state.

        Raises:
          Busy: a turn is queued or running. BadInput: not one of ``s``'s saved games, or a save
          that cannot be continued (the message says why).
        """
        with self._cv:
            if s.job is not None:
                raise Busy("a turn is being generated. Fix: wait for it, then switch games")
            if not isinstance(game_id, str) or self.game_dir(s, game_id) is None:
                raise BadInput("no such saved game in this session. Fix: pick one of the page's saved games")
            old = s.game
            try:
                self._continue(s, game_id)
            except writers.OutputError as e:
                raise BadInput(str(e)) from None
            if old is not None and old.game_id != game_id:
                self._finish_later(s, old)
            s.version += 1
            self.persist(s)
        return self.state(s)

    def branch(self, s: Session, turns: Any = None) -> dict:
        """A new game holding the first ``turns`` turns of ``s``'s current game (default: all of
        them), in its own folder (``saving.branch_game``: the turns' files copied, the source only
        read); it becomes ``s``'s current game, the source stays saved. Returns the new state.

        Raises:
          Busy: a turn is queued or running. BadInput: ``turns`` not an integer in 1..(turns played),
          the current game has no saved turn, or its save cannot be branched from (a damaged turn
          file: the message says which and the fix).
        """
        with self._cv:
            if s.job is not None:
                raise Busy("a turn is being generated. Fix: wait for it, then branch")
            self._resume(s)
            src = s.game
            n = len(src) if src is not None else 0
            folder = None if src is None else self.game_dir(s, src.game_id)
            if folder is None or n == 0:
                raise BadInput("this game has no saved turn to branch from. Fix: play a turn first")
            k = n if turns is None else turns
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n:
                raise BadInput(f"branch takes {{\"turns\": <1..{n}>}} (the turns to keep) or nothing (all {n})")
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            game_id = f"web-{stamp}-{secrets.token_hex(3)}"
            with self.disk_lock(src.game_id), fileio.signals_held():
                try:
                    game, _ = saving.load_game(self.engine, folder, upto=k, game_id=game_id)
                except writers.SavedGameError as e:  # a turn file damaged on disk, say: one line, the fix
                    raise BadInput(str(e)) from None
                saving.branch_game(folder, game, self.engine, self.out_dir)
            s.games.add(game_id)
            s.game = game
            self._finish_later(s, src)
            s.version += 1
            self.persist(s)
        return self.state(s)

    def saved_games(self, s: Session) -> list[dict]:
        """``s``'s games on disk, newest first: ``{"game_id", "turns", "current"}``."""
        out = []
        for g in sorted(s.games, reverse=True):
            folder = self.game_dir(s, g)
            if folder is None:
                continue
            if s.game is not None and s.game.game_id == g:
                n = len(s.game)
            else:
                try:
                    n = len(writers.read_json(os.path.join(folder, writers.GAME_JSON))["turns"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
            out.append({"game_id": g, "turns": n, "current": s.game is not None and s.game.game_id == g})
        return out

    # -- state -----------------------------------------------------------------------------------

    def state(self, s: Session) -> dict:
        """The JSON the page renders: the game's turns (clip URLs, states, meters, deltas)."""
        with self._cv:
            self._resume(s)
            if s.game is None:
                self._new_game(s, None)
            game = s.game
            start = game.start_meters()
            turns, prev = [], start
            saved = self.game_dir(s, game.game_id) is not None
            base = f"/games/{game.game_id}"
            for k, (turn, tr) in enumerate(zip(game.turns, game.results)):
                turns.append({
                    "turn": k, "instruction": turn.text, "character": turn.character,
                    "motion": turn.motion, "background": turn.background,
                    "states": dict(zip(mllm_tokenizer.STATE_FIELDS, tr.states)), "meters": tr.meters,
                    "deltas": {m: tr.meters[m] - prev[m] for m in METER_NAMES},
                    "video": f"{base}/turn_{k:03d}.mp4?v={s.version}" if saved else None,
                    "timings_s": game.timings[k],
                })
                prev = tr.meters
            cfg = self.engine.config
            return {
                "game_id": game.game_id, "seed": game.seed, "system": self.engine.model.label,
                "system_description": self.engine.model.description,
                "config": cfg.name, "mode": cfg.game.mode, "fps": float(cfg.game.fps),
                "meters": prev, "start_meters": start, "turns": turns,
                "busy": s.job is not None, "version": s.version, "saved_games": self.saved_games(s),
                "characters": [c.name for c in game.characters],
                "references": self.engine.supports_references,
                "folder": os.path.join(self.out_dir, game.game_id) if saved and turns else None,
                "download": f"{base}.zip" if saved and turns else None,
                "gallery": f"{base}/index.html?v={s.version}" if saved and turns else None,
            }

    # -- worker ----------------------------------------------------------------------------------

    def retry_after_s(self) -> int:
        """Seconds until the queue has room, estimated from recent batch times: whole seconds in 1..3600."""
        with self._cv:
            batches = math.ceil((len(self._queue) + len(self._running)) / self.engine.batch_size)
            per = DEFAULT_BATCH_S if self._batch_s is None else self._batch_s
            return int(min(3600, max(1, math.ceil(per * max(1, batches)))))

    def _announce(self) -> None:
        """Tells every waiting job its place (call with the lock held)."""
        running = len(self._running)
        for i, job in enumerate(self._queue):
            job.emit("queued", position=i + 1, ahead=i + running, ticket=job.ticket)

    def _take(self) -> list[Job] | None:
        with self._cv:
            while not self._queue and not self._stop:
                self._cv.wait()
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
                with self._cv:
                    self._batch_s = dt if self._batch_s is None else 0.7 * self._batch_s + 0.3 * dt
            except BaseException:  # never let the worker die: report and go on
                log.error("turn batch failed:\n%s", traceback.format_exc())
                for job in batch:
                    if not job.finished and not job.saving:
                        self._finish(job, "error", message="internal error; the game is unchanged")
            finally:
                with self._cv:
                    self._running = []
                    self._announce()
            del batch  # not kept (with its event logs and frames) while waiting for the next turn

    def _finish(self, job: Job, event: str, **data: Any) -> None:
        with self._cv:
            job.session.job = None
        job.emit(event, **data)

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
                self._finish(job, "error", message=f"the turn failed ({type(e).__name__}: {e}); "
                                                   f"the game is unchanged. Fix: try again")
            return
        timing["batch"] = len(batch)
        for b, job in enumerate(batch):
            with self._cv:
                job.game.commit(job.turn, job.ids, states[b], rep[b], media.to_uint8(frames[b], FRAME_RANGE),
                                timing)
            job.saving = True
            self._write_later(lambda job=job: self._save_turn(job, timing, t0))

    def _save_turn(self, job: Job, timing: dict, t0: float) -> None:
        """The writer thread's part of a turn: saves it (rolled back when that fails), drops its
        frames from memory, then tells the player ``done``."""
        game = job.game
        k = len(game) - 1
        try:
            with self.disk_lock(game.game_id), fileio.signals_held():
                # the first turn makes the folder (ids are unique per server: web-<time>-<random>);
                # later ones add their own files
                saving.save_turn(self.engine, game, self.out_dir, new_folder=k == 0)
        except Exception as e:  # noqa: BLE001 - the turn is rolled back, the server goes on
            log.error("saving %s failed:\n%s", game.game_id, traceback.format_exc())
            with self._cv:
                game.undo()
            self._finish(job, "error", message=f"the turn could not be saved ({type(e).__name__}: {e}); "
                                               f"the game is unchanged. Fix: check the output folder "
                                               f"{self.out_dir!r}, then try again")
            return
        with self._cv:
            game.results[k] = dataclasses.replace(game.results[k], frames=None)  # on disk now
            job.session.version += 1
            self.turns_played += 1
            if k == 0:
                self.persist(job.session)
        if self.on_turn is not None:
            self.on_turn(k, job.turn.text, game.results[k], timing)
        with self._cv:
            job.session.job = None
        job.emit("done", state=self.state(job.session), turn_s=time.perf_counter() - t0)


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
