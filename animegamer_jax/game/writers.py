"""Game outputs: per-turn MP4 (+GIF) with a HUD, the whole-game video, game.json, index.html, contact sheet.

Layout of one finished game folder ``<out>/<game_id>/``::

    turn_000.mp4  turn_000.gif  ...   one clip per turn, HUD drawn on every frame
    turn_000.state.npz  ...           the game's state after each turn (:func:`encode_turn_state`):
                                      what the next turn needs, so the game can be continued
    game.mp4                          all turns concatenated
    contact_sheet.png                 rows = turns, columns = evenly spaced frames (no HUD)
    game.json                         instructions, states, meters, seeds, config name, the
                                      fingerprint of what made the game and every file's size/sha256
    timings.json                      wall times per stage (differ run to run, so kept apart)
    index.html                        gallery playing the turns in order (video controls, meter bars):
                                      the template gallery.html, styled by gallery.css (shared
                                      with the web app)
    .animegamer-game                  marker: this folder is a finished game of this project

A user's files are never replaced: a target folder is written only when it is missing, empty or
holds the marker (then only with ``overwrite``), :func:`check_target`. Writes are atomic per game:
everything goes to a hidden temp folder ``.tmp-<game_id>-<hex>`` (holding ``.animegamer-tmp``) next to
the target and is renamed into place only when complete; a replaced game is moved aside first and
restored if the rename fails. Temp folders a killed run left are removed by the next write of that
game (:func:`clean_stale_temp`). A game played on turn by turn grows in place (:func:`append_turn`:
the new turn's files, then ``game.json``, the commit point, then ``index.html``); its ``game.mp4`` and
contact sheet are remade from the turn videos when a play session ends (:func:`write_derived`).
One writer per game folder: every function here that writes one holds its :func:`game_lock` while
it writes (an advisory ``flock`` of ``<out>/.lock-<game_id>``, beside the folder; re-entrant in a
process), and the commands hold it for a whole session (play, ``--continue``: from before the
system loads to the session's end; generate: each batch's games), so a second process is refused
with :class:`GameLockedError` (one line naming the holder's pid and host) before it plays anything.
Temp files of a write carry the writer's pid (:func:`part_path`). ``out`` may be a URL (``gs://bucket/games``; every file goes
through animegamer_jax/io/fileio.py): object stores have no rename, so the final move is a copy then a
delete, and a game counts as finished only when :func:`verify_game` finds every recorded file with
its size and sha256. Identical inputs give byte-identical files: MP4 is H.264 (yuv420p,
crf 18) through PyAV's bundled libx264 with one encoder thread and fixed settings (:func:`write_mp4`);
the frame size is padded to even numbers because yuv420p needs it.
HUD: the three meters (social, entertainment, stamina, app.py semantics,
docs/token_layout.md#state-fields) as bars with values, and the instruction text, drawn with PIL
under the frame. Frames come in the engine's range (``api.FRAME_RANGE``, [0, 1]) or as uint8 and
are converted by the one pixel helper, ``media.to_uint8``.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import io
import json
import os
import string
import textwrap
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from animegamer_jax.io import fileio

from animegamer_jax.io import paths

from animegamer_jax.io import media
from animegamer_jax.game.run import METER_NAMES
from animegamer_jax.inference.instructions import is_plain_name
from animegamer_jax.inference.vae_decode import FRAME_RANGE

GAME_JSON = "game.json"
TIMINGS_JSON = "timings.json"
#: present in every finished game folder this project wrote; only such folders are ever replaced
MARKER = ".animegamer-game"
#: present in every temp folder this project creates; stale ones (killed runs) are removed
TMP_MARKER = ".animegamer-tmp"
#: in a temp folder that holds an earlier finished game moved aside by a rewrite (not the new one)
ASIDE_MARKER = ".animegamer-aside"
_METER_COLORS = {"social": (80, 160, 255), "entertainment": (255, 180, 60), "stamina": (90, 220, 120)}


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


def _missing_folders(folder: str) -> list[str]:
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


def _remove_empty(folders: Sequence[str]) -> None:
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
    writes a game folder (``fileio.exclusive_lock`` on :func:`lock_path`).

    Re-entrant in a process (a command holds it for a session, the writers here take it again per
    write). Another process holding it is refused at once, nothing waits. A process that dies
    holding it, killed too, lets go with its end (the kernel releases a ``flock``), so a stale lock
    never blocks the next run. On entry with the lock newly taken, the ``*.part`` files that a killed
    writer left in the folder are removed (no other writer can be running). The parent folder is
    created when missing, and removed again at the end when nothing was written into it.
    Limits: local paths only; a URL (``gs://``) game folder is written unguarded (object stores have
    no ``flock``; a lease object is not implemented), so two writers of one game there must be kept
    apart by their users; a network file system without working ``flock`` gives no protection.

    Raises:
      GameLockedError: another process holds the lock (the message names its pid and host).
      OutputError: the lock file cannot be created (the folder is not writable).
    """
    lock = lock_path(game_dir)
    parent = lock.rpartition("/")[0]
    created = [] if paths.is_url(game_dir) or not parent else _missing_folders(parent)
    with contextlib.ExitStack() as stack:
        stack.callback(_remove_empty, created)  # last: after the lock is let go
        try:
            if created:
                fileio.makedirs(parent)
            depth = stack.enter_context(fileio.exclusive_lock(lock))
        except fileio.LockHeldError as e:
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


def part_path(path: str) -> str:
    """The temp name a video is written under before it is renamed to ``path``: unique to this
    process and write (``<path>.<pid>-<hex>.part``), so no two writers ever share one."""
    return f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.part"


def check_writable(out_dir: str, keep: bool = True) -> None:
    """Creates ``out_dir`` (a local path or a URL) if needed and checks a file can be written in it.

    Args:
      keep: False: the folders this call had to create are removed again once the check passed, so a
        command that checks before its work and fails later leaves no empty folder behind (the
        writer, :func:`write_game`, creates them when it writes).

    Raises:
      OutputError: the folder cannot be created or is not writable (message names it and the fix).
    """
    created = [] if keep else _missing_folders(out_dir)
    try:
        fileio.makedirs(out_dir)
        probe = paths.join(out_dir, f".write-probe-{uuid.uuid4().hex[:8]}")
        fileio.write_bytes_atomic(probe, b"")
        fileio.remove(probe)
    except OSError as e:
        raise OutputError(f"output folder {out_dir!r} is not writable ({e.strerror or e}). "
                          f"Fix: pass --out with a folder you can write to") from None
    finally:
        _remove_empty(created)  # deepest first; a folder something else wrote into meanwhile stays


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # pillow without FreeType: bitmap font of fixed size
        return ImageFont.load_default()


def draw_hud(frames: np.ndarray, meters: Mapping[str, int], instruction: str, turn: int) -> np.ndarray:
    """Adds a HUD panel under every frame: three meter bars with values and the instruction.

    Args:
      frames: uint8 ``[T, H, W, 3]``.
      meters: ``{"social": v, "entertainment": v, "stamina": v}``, values in 0..100.
      instruction: the turn's instruction text (wrapped).
      turn: 0-based turn index (shown 1-based).

    Returns:
      uint8 ``[T, H' + panel, W', 3]`` with even height and width; the panel height depends only
      on the frame width, so all turns of a game have one size. Frames narrower than 240 px
      are first enlarged by an integer factor (nearest neighbour).
    """
    if frames.shape[2] < 240:
        # tiny configs: enlarge (nearest) so the frame is not a speck beside the HUD text
        f = -(-240 // frames.shape[2])
        frames = np.repeat(np.repeat(frames, f, axis=1), f, axis=2)
    t, h, w, _ = frames.shape
    pw = w
    fs = max(9, min(14, pw // 30))
    font = _font(fs)
    chars = max(10, int(pw / (fs * 0.55)))
    max_lines = 4
    lines = textwrap.wrap(f"Turn {turn + 1}: {instruction}", chars)[:max_lines]
    # room for max_lines whatever the instruction: every turn of a game gets the same frame size
    # (game.mp4 concatenates them)
    panel_h = 6 + 3 * (fs + 4) + 4 + max_lines * (fs + 3) + 4
    total_h = h + panel_h + ((h + panel_h) % 2)
    total_w = pw + pw % 2
    panel = Image.new("RGB", (total_w, total_h - h), (16, 16, 24))
    d = ImageDraw.Draw(panel)
    y = 6
    label_w = int(fs * 0.6 * len("entertainment ")) + 4
    bar_w = max(20, total_w - label_w - 8 - int(fs * 2.2))
    for name in METER_NAMES:
        v = int(meters[name])
        d.text((4, y), name, fill=(230, 230, 230), font=font)
        x0 = label_w
        d.rectangle([x0, y + 2, x0 + bar_w, y + fs], outline=(120, 120, 120))
        d.rectangle([x0, y + 2, x0 + int(bar_w * max(0, min(100, v)) / 100), y + fs], fill=_METER_COLORS[name])
        d.text((x0 + bar_w + 4, y), str(v), fill=(230, 230, 230), font=font)
        y += fs + 4
    y += 4
    for line in lines:
        d.text((4, y), line, fill=(255, 255, 255), font=font)
        y += fs + 3
    panel_np = np.asarray(panel)
    out = np.zeros((t, total_h, total_w, 3), np.uint8)
    out[:, :h, :w] = frames
    out[:, h:] = panel_np[None]
    return out


def _even(frames: np.ndarray) -> np.ndarray:
    t, h, w, c = frames.shape
    if h % 2 or w % 2:
        out = np.zeros((t, h + h % 2, w + w % 2, c), np.uint8)
        out[:, :h, :w] = frames
        return out
    return frames


def write_mp4(path: str, frames: np.ndarray, fps: float) -> None:
    """H.264 MP4 (yuv420p, crf 18, preset veryfast) of ``[T, H, W, 3]`` frames (uint8 or [0, 1]) at
    ``fps``, padded to even sizes, written by the one video writer (``media.write_mp4``) in its
    deterministic mode, so identical frames give byte-identical files."""
    media.write_mp4(path, _even(media.to_uint8(frames, FRAME_RANGE)), fps, crf=18, preset="veryfast",
                       container_format="mp4", deterministic=True)


def write_gif(path: str, frames: np.ndarray, fps: float) -> None:
    """Looping GIF of ``[T, H, W, 3]`` frames (uint8 or [0, 1]) at ``fps`` (``media.write_gif``)."""
    media.write_gif(path, media.to_uint8(frames, FRAME_RANGE), fps)


#: the stylesheet of the gallery and the web app (animegamer_jax/web): one look for both
GALLERY_CSS = open(os.path.join(os.path.dirname(__file__), "gallery.css"), encoding="utf-8").read()
#: the gallery page (index.html), gallery.html beside this module. The project's one template engine is
#: the standard library's ``string.Template``: the page is written by the game core, which has no
#: optional dependency (Jinja2 is not a dependency), and the web app's page is a static file. Fields:
#: ``title`` ``css`` ``config`` ``seed`` ``n_turns`` ``about`` ``characters`` ``turns`` (HTML, escaped
#: by the caller); a literal ``$`` in the file is written ``$$``.
GALLERY_PAGE = string.Template(open(os.path.join(os.path.dirname(__file__), "gallery.html"), encoding="utf-8").read())


def meters_html(meters: Mapping[str, int], deltas: Mapping[str, int] | None = None) -> str:
    """The meters as bars (``gallery.css`` classes; the web app's app.js draws the same markup).

    Args:
      meters: ``{"social", "entertainment", "stamina"}`` values in 0..100.
      deltas: optional change of each meter this turn (meter units), shown as ``+5`` / ``-10``.
    """
    cells = []
    for name in METER_NAMES:
        v = int(meters[name])
        d = "" if deltas is None else f"{int(deltas[name]):+d}"
        cls = "" if deltas is None else ("up" if deltas[name] > 0 else "down" if deltas[name] < 0 else "")
        cells.append(f'<span class="name">{name}</span><span class="bar" role="meter" aria-valuemin="0" '
                     f'aria-valuemax="100" aria-valuenow="{v}" aria-label="{name}"><span class="fill {name}" '
                     f'style="width:{max(0, min(100, v))}%"></span></span><span class="value">{v}</span>'
                     f'<span class="delta {cls}">{d}</span>')
    return f'<div class="meters">{"".join(cells)}</div>'


def _index_html(game_id: str, record: Mapping[str, Any]) -> str:
    """The gallery page (index.html) of a game: :data:`GALLERY_PAGE` filled from ``record`` (game.json's
    dict): one ``<figure>`` per turn (clip, instruction, states, :func:`meters_html`), played in order."""
    items = []
    start = record.get("meter_start")
    prev = None if start is None else dict.fromkeys(METER_NAMES, int(start))
    for t in record["turns"]:
        m, st = t["meters"], t["states"]
        deltas = None if prev is None else {k: int(m[k]) - int(prev[k]) for k in METER_NAMES}
        prev = m
        items.append(
            f'<figure class="turn"><video src="{html.escape(t["video"])}" controls muted playsinline '
            f'preload="auto" class="pixelated"></video>'
            f"<figcaption><b>Turn {t['turn'] + 1}</b>: {html.escape(t['instruction'])}"
            f'<div class="states">ML {st["ML"]} SC {st["SC"]:+d} ET {st["ET"]:+d} ST {st["ST"]:+d}</div>'
            f"{meters_html(m, deltas)}</figcaption></figure>")
    return GALLERY_PAGE.substitute(
        title=html.escape(game_id), css=GALLERY_CSS, config=html.escape(str(record["config"])), seed=record["seed"],
        n_turns=len(record["turns"]), about=about_html(record), characters=characters_html(record),
        turns="".join(items))


def characters_html(record: Mapping[str, Any]) -> str:
    """The gallery's line of a game's reference images (game.json ``characters``); "" without any."""
    items = "".join(f'<figure class="character"><img src="{html.escape(c["image"])}" alt="{html.escape(c["name"])}" '
                    f'height="64"><figcaption>{html.escape(c["name"])}</figcaption></figure>'
                    for c in record.get("characters", []))
    return f'<div class="characters">characters: {items}</div>\n' if items else ""


def about_html(record: dict) -> str:
    """The gallery's line on the system that played the game: its label and, when its checkpoint
    has one, its description (game.json ``system``, ``system_description``); "" when neither."""
    parts = [html.escape(str(record.get(k) or "")) for k in ("system", "system_description")]
    if not any(parts):
        return ""
    return f'<p class="muted" id="about">system: {". ".join(p for p in parts if p)}</p>'


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


def clean_stale_temp(out_dir: str, game_id: str) -> list[str]:
    """Removes temp folders of ``game_id`` left in ``out_dir`` by a killed run; returns their names.

    Only folders named ``.tmp-<game_id>-*`` that hold this program's temp marker are touched. When
    ``<out_dir>/<game_id>`` is missing and one of them is a finished game (a run killed between
    moving the earlier game aside and renaming the new one in), the new one (not marked
    :data:`ASIDE_MARKER`; else the earlier one) is put back as the game's folder first (not listed),
    so no saved game is lost.
    """
    if not fileio.isdir(out_dir):
        return []
    with game_lock(paths.join(out_dir, game_id)):  # another process's write of this game is never touched
        return _clean_temp(out_dir, [name for name in fileio.listdir(out_dir) if name.startswith(f".tmp-{game_id}-")],
                           lambda name: game_id)


def clean_orphaned_temp(out_dir: str, prefix: str) -> list[str]:
    """:func:`clean_stale_temp` for every game whose id starts with ``prefix`` (the web app's
    ``web-``), limited to temp folders whose writer is gone (``fileio.owner_gone``: this host, a
    process that no longer runs), so that another live process's writes are left alone; a game whose
    :func:`game_lock` another process holds is left alone too."""
    if not fileio.isdir(out_dir):
        return []
    names = [n for n in fileio.listdir(out_dir) if n.startswith(f".tmp-{prefix}")
             and fileio.owner_gone(paths.join(out_dir, n, TMP_MARKER))]
    # .tmp-<game_id>-<8 hex>: the game id is what lies between
    return _clean_temp(out_dir, names, lambda name: name[len(".tmp-"):-9])


def _clean_temp(out_dir: str, names: Sequence[str], game_of: Callable[[str], str]) -> list[str]:
    names = [n for n in names if fileio.isfile(paths.join(out_dir, n, TMP_MARKER))]
    by_game: dict[str, list[str]] = {}
    for n in names:
        by_game.setdefault(game_of(n), []).append(n)
    removed = []
    for gid, temps in by_game.items():
        try:
            with game_lock(paths.join(out_dir, gid)):
                removed += _clean_game_temp(out_dir, gid, temps)
        except GameLockedError:
            continue  # being written by another process: its temp folders are its own
    return removed


def _clean_game_temp(out_dir: str, gid: str, temps: list[str]) -> list[str]:
    """:func:`_clean_temp` of one game (holding its lock): puts a finished temp game back when the game's
    folder is missing, removes the rest; returns the names removed."""
    removed = []
    final = paths.join(out_dir, gid)
    if not fileio.exists(final):
        finished = [n for n in temps if verify_game(paths.join(out_dir, n)) is None]
        new = [n for n in finished if not fileio.isfile(paths.join(out_dir, n, ASIDE_MARKER))]
        if finished:
            best = (new or finished)[0]
            fileio.rename(paths.join(out_dir, best), final)
            fileio.remove(paths.join(final, TMP_MARKER))
            if fileio.isfile(paths.join(final, ASIDE_MARKER)):
                fileio.remove(paths.join(final, ASIDE_MARKER))
            temps.remove(best)
    for n in temps:
        fileio.rmtree(paths.join(out_dir, n))
        removed.append(n)
    return removed


#: config fields left out of a game's fingerprint: where things are (out_dir, checkpoint path: the
#: system identity names the weights), or recorded on their own (the game's effective seed and mode)
_NOT_FINGERPRINTED = ("game.out_dir", "game.checkpoint", "game.seed", "game.mode")
#: config fields added after games were fingerprinted, left out while they have no effect on a game, so
#: those games' fingerprints (and game.json) stay as they were: (key, value without effect) and, for
#: ``preview``, the whole section unless ``game.decoder`` uses it
_ADDED_AT_DEFAULT = (("game.decoder", "full"), ("train.preview_real_weight", 0.0),
                     ("dit.reference_drops_image", False), ("train.reference_image_dropout", -1.0))

#: config fields that say where a game's turns are computed, not what they are: the device mesh, the
#: sharding rules, play's layout (inference/layout.py ``apply_layout``: ``latency`` for play, the config's
#: mesh for generate and the web app). Left out of a game's fingerprint, so a game folder is one save
#: file wherever it was made (:func:`same_making`); games fingerprinted with them still match.
PLACEMENT_FIELDS = ("mesh", "sharding_rules", "game.play_layout", "game.latency_weights")

#: config fields removed from the configs (config.py ``REMOVED_KEYS``) after games were fingerprinted
#: with them: (key, the value each named config had, the value of any other config). A config without
#: the key gets it back in the fingerprint, so those games' fingerprints (and game.json) stay as they
#: were; ``game.out_dir`` is not fingerprinted at all.
_REMOVED_FINGERPRINTED = (("eval.out_dir", {"tiny": "outputs/eval_tiny", "toy_world": "outputs/eval_toy_world"},
                           "outputs/eval"),)


def game_fingerprint(config, instructions: Sequence[str], seed: int, system_identity: str,
                     characters: Mapping[str, str] | None = None) -> dict:
    """The :func:`fingerprint` of one game: its instructions, seed, mode, the effective config (every
    override included; :data:`_NOT_FINGERPRINTED` left out, :data:`_REMOVED_FINGERPRINTED` put back), the system identity (a checkpoint's
    content digest, or the stand-in's label) and, for a game with reference images, ``characters``
    (name -> image sha256; absent otherwise, so such games' fingerprints are as before)."""
    cfg = json.loads(config.to_json_best_effort())
    for key, by_name, other in _REMOVED_FINGERPRINTED:
        sec, _, name = key.partition(".")
        if isinstance(cfg.get(sec), dict) and name not in cfg[sec]:
            cfg[sec][name] = by_name.get(str(cfg.get("name")), other)
    _drop_fields(cfg, _NOT_FINGERPRINTED + PLACEMENT_FIELDS)
    if str(config.game.get("decoder", "full")) == "full":
        cfg.pop("preview", None)
    for key, value in _ADDED_AT_DEFAULT:
        sec, _, name = key.partition(".")
        if cfg.get(sec, {}).get(name, value) == value:
            cfg.get(sec, {}).pop(name, None)
    parts = {"instructions": list(instructions), "seed": int(seed), "mode": config.game.mode,
             "system": system_identity, "config": cfg}
    if characters:
        parts["characters"] = dict(characters)
    return fingerprint(parts)


def _drop_fields(cfg: dict, keys: Sequence[str]) -> None:
    """Removes ``keys`` (``"section"`` or ``"section.name"``) from the config dict ``cfg`` in place."""
    for key in keys:
        sec, _, name = key.partition(".")
        if not name:
            cfg.pop(sec, None)
        elif isinstance(cfg.get(sec), dict):
            cfg[sec].pop(name, None)


def same_making(stored: Any, expected: Mapping[str, Any]) -> list[str] | None:
    """The one rule that says whether a saved game was made as ``expected`` (a :func:`game_fingerprint`)
    says: None when it was, else what differs (:func:`fingerprint_changes`; ``["fingerprint differs"]``
    when nothing readable does). Used wherever a saved game is matched: ``play --continue``
    (game/saving.py ``load_game``), generate's resume (:func:`verify_game`), the web app's saved games.

    ``stored`` is game.json's ``fingerprint``; its :data:`PLACEMENT_FIELDS` are dropped first (games
    saved before they were left out hold them), so a game made by play, generate or the web app, on
    any device layout, matches the same game and settings in any of them.
    """
    if isinstance(stored, dict) and stored.get("sha256") == expected["sha256"]:
        return None
    parts = stored.get("parts") if isinstance(stored, dict) else None
    if not isinstance(parts, dict):
        return ["fingerprint differs"]
    parts = json.loads(json.dumps(parts))
    if isinstance(parts.get("config"), dict):
        _drop_fields(parts["config"], PLACEMENT_FIELDS)
    if fingerprint(parts)["sha256"] == expected["sha256"]:
        return None
    return fingerprint_changes(parts, expected["parts"]) or ["fingerprint differs"]


def fingerprint(parts: Mapping[str, Any]) -> dict:
    """``{"sha256": hex, "parts": parts}``: what made a game (stored in game.json, compared on resume).

    ``parts`` is any JSON-able mapping (:func:`game_fingerprint`: instructions, seed, mode, effective
    config, system identity); the digest is over its canonical JSON (sorted keys).
    """
    parts = json.loads(json.dumps(parts, sort_keys=True))
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return {"sha256": digest, "parts": parts}


def _short(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."


def fingerprint_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between two :func:`fingerprint` part mappings (nested keys dotted)."""
    out = []

    def walk(a: Any, b: Any, key: str) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{key}.{k}" if key else k)
        elif a != b:
            out.append(f"{key} changed" if key == "instructions" else f"{key} {_short(a)} -> {_short(b)}")

    walk(old, new, "")
    return sorted(out, key=lambda c: c.startswith("config."))  # seed, mode, instructions, system first


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


def _split_timings(rec: dict) -> dict:
    """Moves every ``timings_s`` (top level and per turn) out of ``rec``: wall times differ run to run,
    so they live in ``timings.json`` and ``game.json`` stays byte-identical for identical inputs."""
    out = {}
    if "timings_s" in rec:
        out.update(rec.pop("timings_s"))
    per_turn = [t.pop("timings_s") for t in rec.get("turns", []) if "timings_s" in t]
    if per_turn:
        out["turns"] = per_turn
    return out


def write_game(out_dir: str, game_id: str, record: Mapping[str, Any], turn_frames: Sequence[np.ndarray],
               fps: float, write_gif_files: bool = True, sheet_columns: int = 6, *,
               overwrite: bool = False, fingerprint: Mapping[str, Any] | None = None,
               turn_states: Sequence[bytes] | None = None, extra_files: Mapping[str, bytes] | None = None) -> str:
    """Writes one finished game atomically; returns the game folder.

    Args:
      out_dir: parent folder (created if needed).
      game_id: folder name (checked with :func:`check_game_id`).
      record: the game.json content: must hold ``turns``, a list (one per turn) of dicts with
        ``turn``, ``instruction``, ``states`` ({"ML","SC","ET","ST"}) and ``meters``; ``seed`` and
        ``config``. This function adds the file names (``video``, ``gif``), ``fingerprint`` and
        ``files`` (name -> size, sha256); any ``timings_s`` goes to ``timings.json`` with the
        writing time added as ``run.writing`` (seconds).
      turn_frames: per turn, ``[T, H, W, 3]`` float in [0, 1] or uint8 (no HUD; it is drawn here).
      fps: frames per second of every video.
      overwrite: replace a finished game of this project already at the target.
      fingerprint: :func:`fingerprint` of what made the game (stored; compared on resume).
      turn_states: per turn, its :func:`encode_turn_state` bytes, written as :func:`state_name`
        files (the record's ``save`` section says what they hold); None: none.
      extra_files: more files of the game, relative name (one subfolder level, e.g.
        ``characters/Bunny.png``) -> bytes, written and listed in ``files`` too.

    Raises:
      OutputError: ``out_dir`` not writable, a bad ``game_id``, or a target folder that is not
        ours or (without ``overwrite``) holds an earlier game; the target is left untouched.
      ValueError: ``record["turns"]`` and ``turn_frames`` differ in length.
    """
    if len(record["turns"]) != len(turn_frames) or (turn_states is not None and len(turn_states) != len(turn_frames)):
        raise ValueError(f"{len(record['turns'])} turn records but {len(turn_frames)} frame arrays")
    t0 = time.perf_counter()
    check_game_id(game_id)
    check_writable(out_dir)
    with game_lock(paths.join(out_dir, game_id)):
        clean_stale_temp(out_dir, game_id)  # first: it may put a killed rewrite's earlier game back
        check_target(out_dir, game_id, overwrite)
        final = paths.join(out_dir, game_id)
        tmp = paths.join(out_dir, f".tmp-{game_id}-{uuid.uuid4().hex[:8]}")
        fileio.makedirs(tmp)
        old = None
        try:
            fileio.write_bytes_atomic(paths.join(tmp, TMP_MARKER), fileio.owner_stamp())
            rec = json.loads(json.dumps(record))
            timings = _split_timings(rec)
            hud_all = []
            for k, (t, frames) in enumerate(zip(rec["turns"], turn_frames)):
                hud = draw_hud(media.to_uint8(frames, FRAME_RANGE), t["meters"], t["instruction"], k)
                hud_all.append(hud)
                t["video"] = f"turn_{k:03d}.mp4"
                write_mp4(paths.join(tmp, t["video"]), hud, fps)
                if write_gif_files:
                    t["gif"] = f"turn_{k:03d}.gif"
                    write_gif(paths.join(tmp, t["gif"]), hud, fps)
                if turn_states is not None:
                    t["state"] = state_name(k)
                    fileio.write_bytes_atomic(paths.join(tmp, t["state"]), turn_states[k])
            for name, data in (extra_files or {}).items():
                if "/" in name:
                    fileio.makedirs(paths.join(tmp, name.rsplit("/", 1)[0]))
                fileio.write_bytes_atomic(paths.join(tmp, name), data)
            write_mp4(paths.join(tmp, "game.mp4"), np.concatenate(hud_all, axis=0), fps)
            media.save_image(paths.join(tmp, "contact_sheet.png"), Image.fromarray(media.contact_sheet(turn_frames, sheet_columns, FRAME_RANGE)),
                        format="PNG")
            rec["video"] = "game.mp4"
            rec["contact_sheet"] = "contact_sheet.png"
            fileio.write_text_atomic(paths.join(tmp, "index.html"), _index_html(game_id, rec))
            rec["fingerprint"] = dict(fingerprint) if fingerprint is not None else None
            rec["files"] = {name: {"size": fileio.size(paths.join(tmp, name)),
                                   "sha256": fileio.sha256_file(paths.join(tmp, name))}
                            for name in [*fileio.listdir(tmp), *(extra_files or {})]
                            if name not in (TMP_MARKER, TIMINGS_JSON) and fileio.isfile(paths.join(tmp, name))}
            fileio.write_text_atomic(paths.join(tmp, GAME_JSON), json.dumps(rec, indent=2, sort_keys=True) + "\n")
            if timings:
                timings.setdefault("run", {})["writing"] = time.perf_counter() - t0
                fileio.write_text_atomic(paths.join(tmp, TIMINGS_JSON), json.dumps(timings, indent=2) + "\n")
            fileio.write_text_atomic(paths.join(tmp, MARKER), json.dumps({"format": 1, "game_id": game_id}) + "\n")
            if fileio.exists(final) and fileio.isdir(final) and fileio.listdir(final):
                # an earlier finished game of ours (check_target allowed it): move it aside, then drop it
                old = paths.join(out_dir, f".tmp-{game_id}-{uuid.uuid4().hex[:8]}")
                fileio.write_bytes_atomic(paths.join(final, ASIDE_MARKER), b"")
                fileio.write_bytes_atomic(paths.join(final, TMP_MARKER), fileio.owner_stamp())
                fileio.rename(final, old)
            elif fileio.exists(final):
                fileio.rmdir(final)  # an empty folder
            fileio.rename(tmp, final)
            fileio.remove(paths.join(final, TMP_MARKER))
        except BaseException:
            fileio.rmtree(tmp)
            if old is not None and not fileio.exists(final):
                fileio.rename(old, final)  # put the earlier game back
                fileio.remove(paths.join(final, TMP_MARKER))
                fileio.remove(paths.join(final, ASIDE_MARKER))
                old = None
            raise
        if old is not None:
            fileio.rmtree(old)
        return final


def _folder_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _write_atomic(write: Callable[..., None], path: str, frames: np.ndarray, fps: float) -> None:
    """``write(path, frames, fps)`` (:func:`write_mp4` / :func:`write_gif`) through a ``.part`` file of this
    process (:func:`part_path`) renamed into place, so a kill never leaves a half-written file at ``path``."""
    part = part_path(path)
    write(part, frames, fps)
    fileio.rename(part, path)


def _file_entry(path: str) -> dict:
    return {"size": fileio.size(path), "sha256": fileio.sha256_file(path)}


def _write_index(game_dir: str, game_id: str, rec: Mapping[str, Any]) -> None:
    rec = dict(rec, video="game.mp4", contact_sheet="contact_sheet.png")
    fileio.write_text_atomic(paths.join(game_dir, "index.html"), _index_html(game_id, rec))


def append_turn(game_dir: str, record: Mapping[str, Any], frames: np.ndarray, state: bytes, fps: float,
                write_gif_files: bool = True, *, fingerprint: Mapping[str, Any] | None = None) -> None:
    """Adds the record's last turn to the saved game in ``game_dir`` (which holds the turns before it).

    Writes the turn's MP4 (+GIF) and state record (:func:`state_name`), each atomically, then
    ``game.json`` (the commit point: a kill before it leaves the game as it was, the new turn's files
    unlisted and rewritten by the next save), then ``index.html`` and ``timings.json``. The cost does
    not grow with the game: earlier turns' files are neither read nor rewritten (their entries in
    ``files`` are carried over); ``game.mp4`` and the contact sheet are moved from ``files`` to
    ``save.derived`` (remade by :func:`write_derived`).

    Args:
      game_dir: a game folder of this project (``game.json`` with ``len(record["turns"]) - 1`` turns).
      record: the whole game's game.json content (saving.game_record; ``timings_s`` goes to timings.json).
      frames: the new turn's clip ``[T, H, W, 3]`` (float [0, 1] or uint8, no HUD).
      state: its :func:`encode_turn_state` bytes.

    Raises:
      SavedGameError: ``game_dir`` does not hold the turns before this one.
    """
    with game_lock(game_dir):
        t0 = time.perf_counter()
        old = read_json(paths.join(game_dir, GAME_JSON))
        rec = json.loads(json.dumps(record))
        timings = _split_timings(rec)
        k = len(rec["turns"]) - 1
        if len(old.get("turns", [])) != k:
            raise SavedGameError(f"{game_dir} holds {len(old.get('turns', []))} turn(s), not the {k} before the "
                                 f"turn being saved. Fix: continue it with play --continue {game_dir}")
        for key in ("video", "contact_sheet"):
            if key in old:
                rec[key] = old[key]
        for j, t in enumerate(rec["turns"][:k]):  # earlier turns: their file names as saved
            for key in ("video", "gif", "state"):
                if key in old["turns"][j]:
                    t[key] = old["turns"][j][key]
        t = rec["turns"][k]
        hud = draw_hud(media.to_uint8(frames, FRAME_RANGE), t["meters"], t["instruction"], k)
        t["video"] = f"turn_{k:03d}.mp4"
        _write_atomic(write_mp4, paths.join(game_dir, t["video"]), hud, fps)
        new_files = [t["video"]]
        if write_gif_files:
            t["gif"] = f"turn_{k:03d}.gif"
            _write_atomic(write_gif, paths.join(game_dir, t["gif"]), hud, fps)
            new_files.append(t["gif"])
        t["state"] = state_name(k)
        fileio.write_bytes_atomic(paths.join(game_dir, t["state"]), state)
        new_files.append(t["state"])
        files = dict(old.get("files", {}))
        derived = dict(old.get("save", {}).get("derived", {}))
        for name in DERIVED_FILES:
            if name in files:
                derived.setdefault("files", {})[name] = files.pop(name)
        derived.setdefault("turns", len(old.get("turns", [])))
        for name in new_files:
            files[name] = _file_entry(paths.join(game_dir, name))
        rec["files"] = files
        rec["fingerprint"] = dict(fingerprint) if fingerprint is not None else None
        rec.setdefault("save", {})["derived"] = derived
        fileio.write_text_atomic(paths.join(game_dir, GAME_JSON), json.dumps(rec, indent=2, sort_keys=True) + "\n")
        _write_index(game_dir, _folder_name(game_dir), rec)
        if timings:
            timings.setdefault("run", {})["writing"] = time.perf_counter() - t0
            fileio.write_text_atomic(paths.join(game_dir, TIMINGS_JSON), json.dumps(timings, indent=2) + "\n")


def drop_last_turn(game_dir: str, record: Mapping[str, Any], *,
                   fingerprint: Mapping[str, Any] | None = None) -> None:
    """Removes the last turn of a saved game grown turn by turn (the web server's undo).

    ``record`` is the game.json content of the turns kept (one fewer than saved; saving.game_record,
    ``timings_s`` goes to timings.json). Writes ``game.json`` (the commit point: the dropped turn's
    files are then unlisted; kept turns' file entries carried over), then removes the dropped turn's
    video, GIF and state files and rewrites ``index.html`` and ``timings.json``; ``game.mp4`` and the
    contact sheet are marked stale in ``save.derived`` (remade by :func:`write_derived`). The cost
    does not grow with the game (no earlier turn's file is read or written).

    Raises:
      SavedGameError: ``game_dir`` does not hold ``len(record["turns"]) + 1`` turns, or the record has none
        (a one-turn game is removed whole by its owner).
    """
    with game_lock(game_dir):
        old = read_json(paths.join(game_dir, GAME_JSON))
        rec = json.loads(json.dumps(record))
        timings = _split_timings(rec)
        n = len(rec["turns"])
        if n < 1 or len(old.get("turns", [])) != n + 1:
            raise SavedGameError(f"{game_dir} holds {len(old.get('turns', []))} turn(s), not the {n + 1} whose last "
                                 f"is being dropped. Fix: continue it with play --continue {game_dir}")
        for key in ("video", "contact_sheet"):
            if key in old:
                rec[key] = old[key]
        for j, t in enumerate(rec["turns"]):
            for key in ("video", "gif", "state"):
                if key in old["turns"][j]:
                    t[key] = old["turns"][j][key]
        last = old["turns"][n]
        gone = [last[key] for key in ("video", "gif", "state") if key in last]
        files = dict(old.get("files", {}))
        derived = dict(old.get("save", {}).get("derived", {}))
        for name in DERIVED_FILES:
            if name in files:
                derived.setdefault("files", {})[name] = files.pop(name)
        derived["turns"] = -1  # stale: cover no turn count the game can have
        for name in gone:
            files.pop(name, None)
        rec["files"] = files
        rec["fingerprint"] = dict(fingerprint) if fingerprint is not None else None
        rec["save"] = dict(old.get("save", {}), **rec.get("save", {}), derived=derived)
        fileio.write_text_atomic(paths.join(game_dir, GAME_JSON), json.dumps(rec, indent=2, sort_keys=True) + "\n")
        for name in gone:
            if fileio.exists(paths.join(game_dir, name)):
                fileio.remove(paths.join(game_dir, name))
        _write_index(game_dir, _folder_name(game_dir), rec)
        if timings:
            fileio.write_text_atomic(paths.join(game_dir, TIMINGS_JSON), json.dumps(timings, indent=2) + "\n")


def copy_turns(src_dir: str, out_dir: str, game_id: str, record: Mapping[str, Any],
               fingerprint: Mapping[str, Any] | None = None) -> str:
    """A new game folder ``<out_dir>/<game_id>`` holding the first ``len(record["turns"])`` turns of
    the game in ``src_dir`` (their video, GIF and state files copied; ``src_dir`` is only read) and
    ``record`` as its game.json (the turns' file names added; ``game.mp4`` and the contact sheet are
    made later, :func:`write_derived`). Atomic like :func:`write_game`; returns the folder.

    Raises:
      OutputError: the target exists and is not empty (never replaced), or ``out_dir`` is not writable.
    """
    check_game_id(game_id)
    check_writable(out_dir)
    with game_lock(paths.join(out_dir, game_id)):
        clean_stale_temp(out_dir, game_id)
        check_branch_target(out_dir, game_id)
        src = read_json(paths.join(src_dir, GAME_JSON))
        rec = json.loads(json.dumps(record))
        timings = _split_timings(rec)
        final = paths.join(out_dir, game_id)
        tmp = paths.join(out_dir, f".tmp-{game_id}-{uuid.uuid4().hex[:8]}")
        fileio.makedirs(tmp)
        try:
            fileio.write_bytes_atomic(paths.join(tmp, TMP_MARKER), fileio.owner_stamp())
            files = {}
            for t, s in zip(rec["turns"], src["turns"]):
                for key in ("video", "gif", "state"):
                    if key in s:
                        t[key] = s[key]
                        fileio.write_bytes_atomic(paths.join(tmp, s[key]), fileio.read_bytes(paths.join(src_dir, s[key])))
                        files[s[key]] = src["files"][s[key]]
            for c in rec.get("characters", []):  # the game's reference images (game/characters.py)
                fileio.makedirs(paths.join(tmp, c["image"].rsplit("/", 1)[0]))
                fileio.write_bytes_atomic(paths.join(tmp, c["image"]), fileio.read_bytes(paths.join(src_dir, c["image"])))
                files[c["image"]] = src["files"][c["image"]]
            rec["files"] = files
            rec["fingerprint"] = dict(fingerprint) if fingerprint is not None else None
            fileio.write_text_atomic(paths.join(tmp, GAME_JSON), json.dumps(rec, indent=2, sort_keys=True) + "\n")
            _write_index(tmp, game_id, rec)
            if timings:
                fileio.write_text_atomic(paths.join(tmp, TIMINGS_JSON), json.dumps(timings, indent=2) + "\n")
            fileio.write_text_atomic(paths.join(tmp, MARKER), json.dumps({"format": 1, "game_id": game_id}) + "\n")
            if fileio.exists(final):
                fileio.rmdir(final)  # an empty folder
            fileio.rename(tmp, final)
            fileio.remove(paths.join(final, TMP_MARKER))
        except BaseException:
            fileio.rmtree(tmp)
            raise
        return final


def write_derived(game_dir: str, fps: float, sheet_columns: int = 6) -> None:
    """Remakes ``game.mp4``, the contact sheet and ``index.html`` of a game grown turn by turn from its
    saved turn videos (decoded; the contact sheet's cells are the clips' frames cut from under the HUD
    at ``save.frame_size``), then records them in ``game.json`` ``save.derived`` (each file and the
    turns it covers). Nothing to do when they already cover every turn. Cost grows with the game:
    run once when a play session ends."""
    with game_lock(game_dir):
        rec = read_json(paths.join(game_dir, GAME_JSON))
        derived = rec.get("save", {}).get("derived")
        n = len(rec["turns"])
        if derived is None or (derived.get("turns") == n and fileio.isfile(paths.join(game_dir, "game.mp4"))):
            return
        h, w = rec["save"]["frame_size"]
        huds, clips = [], []
        for t in rec["turns"]:
            hud = read_video(paths.join(game_dir, t["video"]))
            huds.append(hud)
            clips.append(clip_from_hud(hud, (h, w)))
        _write_atomic(write_mp4, paths.join(game_dir, "game.mp4"), np.concatenate(huds, axis=0), fps)
        media.save_image(paths.join(game_dir, "contact_sheet.png"), Image.fromarray(media.contact_sheet(clips, sheet_columns, FRAME_RANGE)),
                   format="PNG")
        _write_index(game_dir, _folder_name(game_dir), rec)
        rec["video"], rec["contact_sheet"] = "game.mp4", "contact_sheet.png"
        rec["save"]["derived"] = {"turns": n, "files": {name: _file_entry(paths.join(game_dir, name))
                                                         for name in DERIVED_FILES}}
        fileio.write_text_atomic(paths.join(game_dir, GAME_JSON), json.dumps(rec, indent=2, sort_keys=True) + "\n")


def clip_from_hud(hud: np.ndarray, frame_size: Sequence[int]) -> np.ndarray:
    """A turn's clip cut from under its HUD: a decoded turn video uint8 ``[T, H', W', 3]`` (:func:`draw_hud`'s
    output) -> uint8 ``[T, h, w, 3]`` with ``frame_size`` = (h, w), game.json's ``save.frame_size`` (every
    f-th pixel where draw_hud enlarged a narrow frame f times)."""
    h, w = int(frame_size[0]), int(frame_size[1])
    f = -(-240 // w) if w < 240 else 1  # draw_hud's enlargement of narrow frames
    return hud[:, :h * f:f, :w * f:f]


def read_json(path: str) -> dict:
    """A JSON file of a game folder (game.json, timings.json)."""
    return json.loads(fileio.read_bytes(path).decode("utf-8"))


def read_video(path: str) -> np.ndarray:
    """Decodes a video file to uint8 ``[T, H, W, 3]`` (local path or URL; for tests and tools;
    ``media.read_video``)."""
    return media.read_video(path)[0]
