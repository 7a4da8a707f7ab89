"""The layout of one game folder ``<out>/<game_id>/``: its file names and markers, the turns' state records,
the lock of its one writer, the checks of a target folder, reading it and verifying it::

    turn_000.mp4  turn_000.gif  ...   one clip per turn, HUD drawn on every frame (hud.py)
    turn_000.state.npz  ...           the game's state after each turn (:func:`encode_turn_state`):
                                      what the next turn needs, so the game can be continued
    game.mp4                          all turns concatenated
    contact_sheet.png                 rows = turns, columns = evenly spaced frames (no HUD)
    game.json                         instructions, states, meters, seeds, config name, the
                                      fingerprint of what made the game (fingerprint.py) and every
                                      file's size/sha256
    timings.json                      wall times per stage (differ run to run, so kept apart)
    index.html                        gallery playing the turns in order (gallery.py)
    characters/<NAME>.png             a game's reference images, if any (game/characters.py)
    .animegamer-game                  marker: this folder is a finished game of this project

Writing it (atomic, one writer at a time, :func:`game_lock`) is atomic.py's. ``out`` may be a URL
(``gs://``): every file goes through io/fileio.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import uuid
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from animegamer_jax.io import fileio, locks
from animegamer_jax.io import media
from animegamer_jax.io import paths
from animegamer_jax.game.folder.fingerprint import same_making
from animegamer_jax.inference.instructions import is_plain_name

GAME_JSON = "game.json"
TIMINGS_JSON = "timings.json"
#: present in every finished game folder this project wrote; only such folders are ever replaced
MARKER = ".animegamer-game"
#: present in every temp folder this project creates; stale ones (killed runs) are removed
TMP_MARKER = ".animegamer-tmp"
#: in a temp folder that holds an earlier finished game moved aside by a rewrite (not the new one)
ASIDE_MARKER = ".animegamer-aside"


class OutputError(OSError):
    """The output folder cannot be created or written."""


class GameLockedError(OutputError):
    """Another process is writing the game folder (it holds its :func:`game_lock`); the message names
    the folder, the holder's pid and host, and the fix."""


class SavedGameError(OutputError):
    """A saved game cannot be continued (not a game, damaged, another system or config, a newer
    save format); the message names the folder and the fix."""


#: version of the save format (game.json ``save.format``); a game with a higher one is refused
SAVE_FORMAT = 1
#: files remade from the turn videos (:func:`write_derived`); a game grown turn by turn lists them in
#: ``save.derived`` (informational) instead of ``files``, since they may lag behind the last turn
DERIVED_FILES = ("game.mp4", "contact_sheet.png", "index.html")


def state_name(turn: int) -> str:
    """File name of turn ``turn``'s state record."""
    return f"turn_{turn:03d}.state.npz"


def encode_turn_state(arrays: Mapping[str, np.ndarray]) -> bytes:
    """A turn's state record as bytes: an uncompressed ``.npz`` (``np.load`` reads it) whose zip
    entries carry a fixed date, so equal arrays give equal bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            arr = io.BytesIO()
            np.lib.format.write_array(arr, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, arr.getvalue())
    return buf.getvalue()


def decode_turn_state(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of :func:`encode_turn_state` bytes.

    Raises:
      ValueError: not such a record (damaged).
    """

    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"not a turn state record ({e})") from None


def missing_folders(folder: str) -> list[str]:
    """``folder`` and those of its parents that do not exist, deepest first (what ``makedirs`` creates)."""
    created = []
    p = folder.rstrip("/") or folder
    while p and not fileio.exists(p):
        created.append(p)
        parent = p.rsplit("/", 1)[0] if "/" in p else ""
        if parent == p or parent.endswith(":/") or parent.endswith(":"):
            break
        p = parent
    return created


def remove_empty(folders: Sequence[str]) -> None:
    """Removes ``folders`` (deepest first) while they are empty; one something else wrote into stays."""
    for p in folders:
        try:
            if fileio.isdir(p) and not fileio.listdir(p):
                fileio.rmdir(p)
        except OSError:
            break


#: prefix of the lock file beside each game folder (``<out>/.lock-<game_id>``; a game id never starts with ``.``)
LOCK_PREFIX = ".lock-"


def lock_path(game_dir: str) -> str:
    """The lock file of game folder ``game_dir``: ``.lock-<game_id>`` beside it (not inside: the
    folder is renamed into place whole, and may not exist yet)."""
    folder = game_dir.rstrip("/") or game_dir
    parent, _, name = folder.rpartition("/")
    return paths.join(parent, LOCK_PREFIX + name) if parent else LOCK_PREFIX + name


@contextlib.contextmanager
def game_lock(game_dir: str) -> Iterator[None]:
    """Holds the writer's lock of game folder ``game_dir`` inside the body: one process at a time
    writes a game folder (``locks.exclusive_lock`` on :func:`lock_path`).

    Re-entrant in a process (a command holds it for a session, the writers here take it again per
    write). Another process holding it is refused at once, nothing waits. A process that dies
    holding it, killed too, lets go with its end (the kernel releases a ``flock``), so a stale lock
    never blocks the next run. On entry with the lock newly taken, the ``*.part`` files that a killed
    writer left in the folder are removed (no other writer can be running). The parent folder is
    created when missing, and removed again at the end when nothing was written into it.
    A ``gs://`` game folder's lock is a lease object (``locks.exclusive_lock``): a killed holder's
    lease blocks until it expires (up to ``locks.LEASE_S``, 60 s), then the next writer takes it
    over. Other URL schemes are written unguarded, and a network file system without working
    ``flock`` gives no protection.

    Raises:
      GameLockedError: another process holds the lock (the message names its pid and host).
      OutputError: the lock file cannot be created (the folder is not writable).
    """
    lock = lock_path(game_dir)
    parent = lock.rpartition("/")[0]
    created = [] if paths.is_url(game_dir) or not parent else missing_folders(parent)
    with contextlib.ExitStack() as stack:
        stack.callback(remove_empty, created)  # last: after the lock is let go
        try:
            if created:
                fileio.makedirs(parent)
            depth = stack.enter_context(locks.exclusive_lock(lock))
        except locks.LockHeldError as e:
            raise GameLockedError(f"{game_dir} is being written by another process ({e.holder_words()}); a "
                                  f"game folder has one writer at a time. Fix: wait for that process to end (or "
                                  f"stop it), or write to another --out or --game-id") from None
        except OSError as e:
            raise OutputError(f"cannot create the lock file {lock} of game folder {game_dir} "
                              f"({e.strerror or e}). Fix: pass --out with a folder you can write to") from None
        if depth == 1:
            _remove_parts(game_dir)
        yield


def _remove_parts(game_dir: str) -> None:
    """Removes the ``.part`` files a killed writer left in ``game_dir`` (call it holding its lock)."""
    if not fileio.isdir(game_dir):
        return
    for name in fileio.listdir(game_dir):
        if name.endswith(".part") and fileio.isfile(paths.join(game_dir, name)):
            fileio.remove(paths.join(game_dir, name))


def folder_files(game_dir: str) -> list[str]:
    """Every file of the game folder ``game_dir`` (a local path), as sorted ``/``-separated names
    relative to it: the marker, game.json, the turns' files, ``characters/<NAME>.png``, ... (what a
    copy of the game needs to open anywhere; the web app's zip). A killed writer's ``*.part`` files
    are left out."""
    out = []
    for root, dirs, names in os.walk(game_dir):
        dirs.sort()
        rel = os.path.relpath(root, game_dir)
        out += [n if rel == "." else f"{rel.replace(os.sep, '/')}/{n}" for n in names if not n.endswith(".part")]
    return sorted(out)



def check_writable(out_dir: str, keep: bool = True) -> None:
    """Creates ``out_dir`` (a local path or a URL) if needed and checks a file can be written in it.

    Args:
      keep: False: the folders this call had to create are removed again once the check passed, so a
        command that checks before its work and fails later leaves no empty folder behind (the
        writer, :func:`write_game`, creates them when it writes).

    Raises:
      OutputError: the folder cannot be created or is not writable (message names it and the fix).
    """
    created = [] if keep else missing_folders(out_dir)
    try:
        fileio.makedirs(out_dir)
        probe = paths.join(out_dir, f".write-probe-{uuid.uuid4().hex[:8]}")
        fileio.write_bytes_atomic(probe, b"")
        fileio.remove(probe)
    except OSError as e:
        raise OutputError(f"output folder {out_dir!r} is not writable ({e.strerror or e}). "
                          f"Fix: pass --out with a folder you can write to") from None
    finally:
        remove_empty(created)  # deepest first; a folder something else wrote into meanwhile stays


def check_game_id(game_id: str, where: str = "--game-id") -> str:
    """Returns ``game_id`` if it is usable as one folder name under ``--out``.

    Refused: empty, ``.`` / ``..`` or any leading ``.`` (hidden; temp folders use it), a path
    separator (``/`` or ``\\``), an absolute path, NUL, or longer than 200 characters.

    Raises:
      OutputError: the id is not a plain folder name (message names ``where`` and the fix).
    """
    if not is_plain_name(game_id):
        raise OutputError(f"{where}: game id {game_id!r} is not a plain folder name (no '/', '\\\\', "
                          f"leading '.', '..', absolute path or surrounding spaces). Fix: use letters, "
                          f"digits, '-' and '_', e.g. 'bunny-1'")
    return game_id


def is_game_folder(game_dir: str) -> bool:
    """True when ``game_dir`` is a finished game written by this project (holds the marker file)."""
    return fileio.isfile(paths.join(game_dir, MARKER))


def is_finished(game_dir: str) -> bool:
    """True when ``game_dir`` is a finished game of this project (marker and ``game.json`` present).

    Use :func:`verify_game` to also check what made it and that its files are intact.
    """
    return is_game_folder(game_dir) and fileio.isfile(paths.join(game_dir, GAME_JSON))


def check_target(out_dir: str, game_id: str, overwrite: bool = False) -> bool:
    """Checks ``<out_dir>/<game_id>`` may be written; returns True when a finished game is there.

    A missing or empty folder may be written; a finished game of this project only with
    ``overwrite``; anything else (a folder or file of the user's) never.

    Raises:
      OutputError: the target holds something this program did not write, or an earlier game
        and ``overwrite`` is False (the message names the folder and the fix).
    """
    check_game_id(game_id)
    final = paths.join(out_dir, game_id)
    if not fileio.exists(final):
        return False
    if fileio.isdir(final) and not fileio.listdir(final):
        return False
    if not (fileio.isdir(final) and is_game_folder(final)):
        raise OutputError(f"{final} exists and was not written by animegamer_jax (no {MARKER} marker); it is "
                          f"left untouched. Fix: pass another --game-id or --out, or move that folder away")
    if not overwrite:
        raise OutputError(f"{final} holds a game from an earlier run; it is kept. Fix: pass --overwrite "
                          f"to replace it, or another --game-id")
    return True


def check_branch_target(out_dir: str, game_id: str) -> None:
    """Checks a branch (a new game from another's first turns, :func:`copy_turns`) may be written to
    ``<out_dir>/<game_id>``: a missing or empty folder only. A branch never replaces a game, with
    ``--overwrite`` neither (it would drop a game's turns to make another).

    Raises:
      OutputError: the target holds a game, or something this program did not write (:func:`check_target`).
    """
    if check_target(out_dir, game_id, overwrite=True):
        raise OutputError(f"{paths.join(out_dir, game_id)} holds a game; a branch starts a new game folder and never "
                          f"replaces one (--overwrite does not apply). Fix: pass another --game-id or --out")



def verify_game(game_dir: str, expected: Mapping[str, Any] | None = None) -> str | None:
    """Why the finished game in ``game_dir`` cannot be kept as is, or None when it can.

    Checks the marker, that ``game.json`` parses, that its fingerprint matches ``expected``
    (a :func:`game_fingerprint`, by :func:`same_making`; skipped when None) and that every listed
    file exists with its size and sha256.
    """
    if not is_game_folder(game_dir):
        return "not a finished game"
    try:
        rec = json.loads(fileio.read_bytes(paths.join(game_dir, GAME_JSON)).decode("utf-8"))
        files = rec["files"]
        fp = rec["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{GAME_JSON} is missing or damaged"
    changes = None if expected is None else same_making(fp, expected)
    if changes:
        more = f"; {len(changes) - 3} more" if len(changes) > 3 else ""
        return "made differently (" + "; ".join(changes[:3]) + more + ")"
    for name, want in sorted(files.items()):
        path = paths.join(game_dir, name)
        if not fileio.isfile(path):
            return f"file {name} is missing"
        if fileio.size(path) != want["size"]:
            return f"file {name} has {fileio.size(path)} bytes, {want['size']} expected"
        if fileio.sha256_file(path) != want["sha256"]:
            return f"file {name} is damaged (sha256 differs)"
    return None


def read_json(path: str) -> dict:
    """A JSON file of a game folder (game.json, timings.json)."""
    return json.loads(fileio.read_bytes(path).decode("utf-8"))


def read_video(path: str) -> np.ndarray:
    """Decodes a video file to uint8 ``[T, H, W, 3]`` (local path or URL; for tests and tools;
    ``media.read_video``)."""
    return media.read_video(path)[0]
