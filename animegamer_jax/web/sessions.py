"""The game server's browser sessions: each one's current game and saved games, kept across restarts
in :data:`SESSIONS_FILE`, dropped when unseen for ``idle_s``, and what a session does to its games
(state, undo, restart, continue, branch, a character)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
import traceback
from typing import Any

from animegamer_jax.game import characters as characters_lib
from animegamer_jax.game.folder import layout, saves
from animegamer_jax.game.folder.load import load_game
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.run import METER_NAMES
from animegamer_jax.game.turn_by_turn import TurnByTurnGame
from animegamer_jax.inference.instructions import is_plain_name
from animegamer_jax.io import fileio, paths
from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.web.queue import Job
from animegamer_jax.web.saver import Saver

log = logging.getLogger(__name__)

#: the session ids this server issues (``secrets.token_urlsafe(18)``); anything else is tampered with
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{24}$")
#: seed range accepted by restart (what a signed 64-bit integer holds; ``turn_key`` uses the low 64 bits)
SEED_RANGE = (-2**63, 2**63 - 1)
#: default sessions holding turns (games in play) kept; past that new players get 503
MAX_SESSIONS = 64
#: default sessions without turns kept (page loads that have not played); past that the oldest go
MAX_EMPTY_SESSIONS = 256
#: default seconds a session may go unseen before it is dropped (its games stay saved on disk)
SESSION_IDLE_S = 12 * 3600
#: in the output folder: which saved games each session played (:meth:`Sessions.persist`)
SESSIONS_FILE = ".web-sessions.json"
#: the largest uploaded reference image, decoded bytes (``POST /api/character``)
MAX_CHARACTER_BYTES = 8 * 1024 * 1024


class BadInput(ValueError):
    """A request the server refuses (HTTP 400); ``fields`` names the form fields at fault."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.fields = fields


class Busy(RuntimeError):
    """The session already has a turn queued or running (HTTP 409)."""


class ServerFull(RuntimeError):
    """``max_sessions`` sessions hold games in play (HTTP 503): a new player is refused, no game dropped."""


def session_id_ok(sid: str) -> bool:
    """True when ``sid`` has the form of the session ids this server issues (:data:`SESSION_ID`)."""
    return bool(SESSION_ID.match(sid))


def new_game_id() -> str:
    """``web-<local time>-<6 hex digits>``: unique per server."""
    return f"web-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


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


class Sessions:
    """The live sessions of one game server (``live``: session id -> :class:`Session`).

    Memory is bounded: a session that holds turns is never dropped to make room; at most
    ``max_sessions`` of them, and past that a new player is refused (:class:`ServerFull`). Sessions
    without turns: at most ``max_empty_sessions``, the least recently seen dropped first. Any session
    unseen for ``idle_s`` seconds is dropped, unless a turn of it is queued or running; its games stay
    on disk, and :data:`SESSIONS_FILE` (keyed by the sha256 of the session id, not the cookie) makes it
    known again when its cookie comes back, here or on a server restarted on the same folder.

    Args:
      engine: the server's engine; out_dir: parent folder of the game folders; seed: new games' seed.
      cv: the server's one condition (guards every session); saver: the server's writer threads.
      max_sessions, max_empty_sessions, idle_s: the limits above.
    """

    def __init__(self, engine: GameEngine, out_dir: str, seed: int, cv: threading.Condition, saver: Saver,
                 max_sessions: int = MAX_SESSIONS, max_empty_sessions: int = MAX_EMPTY_SESSIONS,
                 idle_s: float = SESSION_IDLE_S):
        self.engine, self.out_dir, self.seed, self.cv, self.saver = engine, out_dir, seed, cv, saver
        self.max_sessions = int(max_sessions)
        self.max_empty_sessions = int(max_empty_sessions)
        self.idle_s = float(idle_s)
        self.live: dict[str, Session] = {}
        self._saved = self._read()  # sha256 of session id -> {"games": [...], "current": id}

    # -- persistence -------------------------------------------------------------------------------

    @staticmethod
    def _key(sid: str) -> str:
        return hashlib.sha256(sid.encode()).hexdigest()

    def _read(self) -> dict[str, dict]:
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
        self.live[sid] = s
        return s

    def resume(self, s: Session) -> None:
        """Reads back ``s``'s current saved game when it has none in memory (call with the lock held)."""
        if s.game is None and s.resume is not None:
            game_id, s.resume = s.resume, None
            try:
                self.load(s, game_id)
            except (BadInput, layout.OutputError) as e:
                log.warning("session's game %s cannot be continued: %s", game_id, e)

    # -- live sessions ------------------------------------------------------------------------------

    def find(self, sid: str | None) -> Session | None:
        """The live session of cookie value ``sid`` (now seen), or None (no new session is made).
        A session of an earlier server on this output folder is known again (:data:`SESSIONS_FILE`)."""
        with self.cv:
            self.expire()
            s = self.live.get(sid) if sid else None
            if s is None and sid and session_id_ok(sid):
                s = self._known_again(sid)
            if s is not None:
                s.last_seen = time.time()
            return s

    def new(self) -> Session:
        """A new session (only the page load makes one; its id: 24 random URL-safe characters, 144
        bits); drops sessions without turns past ``max_empty_sessions``, least recently seen first.

        Raises:
          ServerFull: ``max_sessions`` sessions hold turns.
        """
        with self.cv:
            self.expire()
            self.check_room(None)
            s = Session(secrets.token_urlsafe(18))
            self.live[s.id] = s
            empty = sorted((x for x in self.live.values() if not x.holds_turns), key=lambda x: x.last_seen)
            for old in empty[: max(0, len(empty) - self.max_empty_sessions)]:
                del self.live[old.id]
            return s

    def expire(self) -> None:
        """Drops the sessions unseen for ``idle_s`` seconds but those with a turn queued or running
        (call with the lock held)."""
        now = time.time()
        for s in [x for x in self.live.values() if x.job is None and now - x.last_seen > self.idle_s]:
            del self.live[s.id]
            self.finish_later(s, s.game)

    def check_room(self, s: Session | None) -> None:
        """Raises :class:`ServerFull` when ``s`` (None: a new session) holds no turns and
        ``max_sessions`` sessions do (call with the lock held)."""
        if s is not None and s.holds_turns:
            return
        playing = sum(x.holds_turns for x in self.live.values())
        if playing >= self.max_sessions:
            raise ServerFull(f"the server holds the games of {playing} players, its limit (--max_sessions "
                             f"{self.max_sessions}); a game unseen for {self.idle_s / 3600:g} h is let go. "
                             f"Fix: try again later")

    # -- games ----------------------------------------------------------------------------------------

    def new_game(self, s: Session, seed: int | None, characters: tuple = ()) -> TurnByTurnGame:
        """A new current game of ``s`` (seed None: the server's)."""
        game_id = new_game_id()
        s.game = TurnByTurnGame(self.engine, game_id, self.seed if seed is None else int(seed),
                                characters=tuple(characters))
        s.games.add(game_id)
        return s.game

    def load(self, s: Session, game_id: str) -> TurnByTurnGame:
        """Makes ``s``'s current game its saved game ``game_id``, read back with ``load_game``
        (checked; frames stay on disk).

        Raises:
          BadInput: ``s`` did not play ``game_id`` or it is not on disk.
          layout.SavedGameError: the save cannot be continued (message names why and the fix).
        """
        folder = self.game_dir(s, game_id)
        if folder is None:
            raise BadInput(f"no saved game {game_id!r} in this session. Fix: pick one of the page's saved games "
                           f"(state's saved_games)")
        with self.saver.disk_lock(game_id):
            game, _ = load_game(self.engine, folder, game_id=game_id)
        s.game = game
        return game

    def game_dir(self, s: Session, game_id: str) -> str | None:
        """The folder of ``game_id`` when session ``s`` played it and it exists, else None."""
        if game_id not in s.games:
            return None
        path = os.path.join(self.out_dir, game_id)
        return path if os.path.isdir(path) else None

    def finish_game(self, s: Session, game_id: str) -> str | None:
        """Makes ``game.mp4`` and the contact sheet of ``s``'s game ``game_id`` cover every saved turn
        (:meth:`Saver.finish`). Returns the folder, or None when ``s`` did not play it or it is not on disk."""
        folder = self.game_dir(s, game_id)
        if folder is not None:
            self.saver.finish(folder, game_id)
        return folder

    def finish_later(self, s: Session, game: TurnByTurnGame | None) -> None:
        """Queues :meth:`finish_game` of ``game`` (a game ``s`` leaves) for the writer threads."""
        if game is not None and len(game):
            self.saver.later(lambda: self.finish_game(s, game.game_id))

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
                    n = len(layout.read_json(os.path.join(folder, layout.GAME_JSON))["turns"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
            out.append({"game_id": g, "turns": n, "current": s.game is not None and s.game.game_id == g})
        return out

    def state(self, s: Session) -> dict:
        """The JSON the page renders: the game's turns (clip URLs, states, meters, deltas)."""
        with self.cv:
            self.resume(s)
            if s.game is None:
                self.new_game(s, None)
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

    # -- what a session does to its games ---------------------------------------------------------------

    @staticmethod
    def _idle(s: Session, then: str) -> None:
        """Raises :class:`Busy` while a turn of ``s`` is queued or running (``then``: what to do after)."""
        if s.job is not None:
            raise Busy(f"a turn is being generated. Fix: wait for it, then {then}")

    def undo(self, s: Session) -> dict:
        """Drops the last turn of ``s``'s game and saves the game without it (with no turn left the
        game folder, written by this server for this game, is removed). Returns the new state.

        Raises:
          Busy: a turn is queued or running. IndexError: nothing to undo. BadInput: the game's folder
          is no longer on disk (removed outside the server): nothing is changed.
        """
        with self.cv:
            self._idle(s, "undo")
            self.resume(s)
            if s.game is None or not len(s.game):
                raise IndexError("there is no turn to undo")
            game = s.game
            folder = os.path.join(self.out_dir, game.game_id)
            if not layout.is_finished(folder):
                raise BadInput(f"game {game.game_id}'s folder is no longer in {self.out_dir} (removed outside "
                               f"the server), so its turns cannot be undone there. Fix: restart for a new game")
            with self.saver.disk_lock(game.game_id), fileio.signals_held():
                game.undo()
                # under the lock: no turn of this session can start while the folder is rewritten
                try:
                    if len(game):
                        saves.drop_turn(self.engine.config, self.engine.model, game, self.out_dir)
                    elif game.game_id in s.games and layout.is_finished(folder):
                        shutil.rmtree(folder)
                        self.persist(s)
                except Exception:
                    log.error("undo of %s failed on disk:\n%s", game.game_id, traceback.format_exc())
                    s.game = None
                    self.load(s, game.game_id)  # the game as it is on disk
                    raise
            s.version += 1
            return self.state(s)

    def restart(self, s: Session, seed: int | None = None) -> dict:
        """Starts a new game for ``s`` (the previous game's folder stays on disk). Returns the new state.

        Raises:
          Busy: a turn is queued or running. BadInput: ``seed`` is not an integer in :data:`SEED_RANGE`.
        """
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                                 or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
            raise BadInput("restart takes {\"seed\": <integer>} (a signed 64-bit integer) or nothing")
        with self.cv:
            self._idle(s, "restart")
            self.finish_later(s, s.game)
            self.new_game(s, seed)
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
        with self.cv:
            self._idle(s, "add the character")
            self.resume(s)
            old = s.game
            kept = () if old is None else tuple(c for c in old.characters
                                               if c.name.casefold() != char.name.casefold())
            self.finish_later(s, old)
            self.new_game(s, None if old is None else old.seed, (*kept, char))
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
        with self.cv:
            self._idle(s, "switch games")
            if not isinstance(game_id, str) or self.game_dir(s, game_id) is None:
                raise BadInput("no such saved game in this session. Fix: pick one of the page's saved games")
            old = s.game
            try:
                self.load(s, game_id)
            except layout.OutputError as e:
                raise BadInput(str(e)) from None
            if old is not None and old.game_id != game_id:
                self.finish_later(s, old)
            s.version += 1
            self.persist(s)
        return self.state(s)

    def branch(self, s: Session, turns: Any = None) -> dict:
        """A new game holding the first ``turns`` turns of ``s``'s current game (default: all of
        them), in its own folder (``saves.branch_game``: the turns' files copied, the source only
        read); it becomes ``s``'s current game, the source stays saved. Returns the new state.

        Raises:
          Busy: a turn is queued or running. BadInput: ``turns`` not an integer in 1..(turns played),
          the current game has no saved turn, or its save cannot be branched from (a damaged turn
          file: the message says which and the fix).
        """
        with self.cv:
            self._idle(s, "branch")
            self.resume(s)
            src = s.game
            n = len(src) if src is not None else 0
            folder = None if src is None else self.game_dir(s, src.game_id)
            if folder is None or n == 0:
                raise BadInput("this game has no saved turn to branch from. Fix: play a turn first")
            k = n if turns is None else turns
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n:
                raise BadInput(f"branch takes {{\"turns\": <1..{n}>}} (the turns to keep) or nothing (all {n})")
            game_id = new_game_id()
            with self.saver.disk_lock(src.game_id), fileio.signals_held():
                try:
                    game, _ = load_game(self.engine, folder, upto=k, game_id=game_id)
                except layout.SavedGameError as e:  # a turn file damaged on disk, say: one line, the fix
                    raise BadInput(str(e)) from None
                saves.branch_game(self.engine.config, self.engine.model, folder, game, self.out_dir)
            s.games.add(game_id)
            s.game = game
            self.finish_later(s, src)
            s.version += 1
            self.persist(s)
        return self.state(s)
