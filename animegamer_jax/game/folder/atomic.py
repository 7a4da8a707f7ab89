"""Writing a game folder (layout.py) atomically, one writer at a time: a new game through a temp folder
renamed into place, a turn appended or dropped in place, a branch copied, the derived files remade.

A user's files are never replaced: a target folder is written only when it is missing, empty or
holds the marker (then only with ``overwrite``, layout.py ``check_target``). Everything of a new game
goes to a hidden temp folder ``.tmp-<game_id>-<hex>`` (holding ``.animegamer-tmp``) next to the target
and is renamed into place only when complete; a replaced game is moved aside first and restored if
the rename fails; temp folders a killed run left are removed by the next write of that game
(:func:`clean_stale_temp`). A game played on turn by turn grows in place (:func:`append_turn`: the new
turn's files, then ``game.json``, the commit point, then ``index.html``); its ``game.mp4`` and contact
sheet are remade from the turn videos when a play session ends (:func:`write_derived`). Every function
here that writes a folder holds its ``game_lock`` while it writes, and the commands hold it for a
whole session. On object stores (``gs://``, no rename) the final move is a copy then a delete, and a
game counts as finished only when ``verify_game`` finds every recorded file with its size and sha256.
Identical inputs give byte-identical files (hud.py's videos; game.json with sorted keys, timings apart).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image

from animegamer_jax.io import fileio
from animegamer_jax.io import media
from animegamer_jax.io import paths
from animegamer_jax.game.folder.gallery import write_index
from animegamer_jax.game.folder.hud import clip_from_hud, draw_hud, write_gif, write_mp4
from animegamer_jax.game.folder.layout import (ASIDE_MARKER, DERIVED_FILES, GAME_JSON, MARKER, TIMINGS_JSON,
                                               TMP_MARKER, GameLockedError, SavedGameError, check_branch_target,
                                               check_game_id, check_target, check_writable, game_lock, read_json,
                                               read_video, state_name, verify_game)
from animegamer_jax.inference.vae_decode import FRAME_RANGE

def part_path(path: str) -> str:
    """The temp name a video is written under before it is renamed to ``path``: unique to this
    process and write (``<path>.<pid>-<hex>.part``), so no two writers ever share one."""
    return f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.part"


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


def _temp_name(out_dir: str, game_id: str) -> str:
    """A new temp folder name of ``game_id`` in ``out_dir``: ``.tmp-<game_id>-<8 hex>``."""
    return paths.join(out_dir, f".tmp-{game_id}-{uuid.uuid4().hex[:8]}")


def _move_in(tmp: str, final: str) -> None:
    """Renames the complete temp folder ``tmp`` to ``final`` (missing or an empty folder, removed
    first) and drops its temp marker."""
    if fileio.exists(final):
        fileio.rmdir(final)  # an empty folder
    fileio.rename(tmp, final)
    fileio.remove(paths.join(final, TMP_MARKER))


def _write_record(game_dir: str, rec: Mapping[str, Any]) -> None:
    """Writes ``game_dir``'s game.json (sorted keys: identical records, identical bytes)."""
    fileio.write_text_atomic(paths.join(game_dir, GAME_JSON), json.dumps(rec, indent=2, sort_keys=True) + "\n")


def _write_timings(game_dir: str, timings: Mapping[str, Any], t0: float | None = None) -> None:
    """Writes ``game_dir``'s timings.json when ``timings`` holds any, with the writing time since
    ``t0`` (``time.perf_counter``) as ``run.writing`` unless None."""
    if timings:
        if t0 is not None:
            timings.setdefault("run", {})["writing"] = time.perf_counter() - t0
        fileio.write_text_atomic(paths.join(game_dir, TIMINGS_JSON), json.dumps(timings, indent=2) + "\n")


def _split_timings(record: Mapping[str, Any]) -> tuple[dict, dict]:
    """A copy of ``record`` without any ``timings_s`` (top level and per turn), and those timings:
    wall times differ run to run, so they live in ``timings.json`` and ``game.json`` stays
    byte-identical for identical inputs."""
    rec = json.loads(json.dumps(record))
    out = {}
    if "timings_s" in rec:
        out.update(rec.pop("timings_s"))
    per_turn = [t.pop("timings_s") for t in rec.get("turns", []) if "timings_s" in t]
    if per_turn:
        out["turns"] = per_turn
    return rec, out


def _carry_over(old: Mapping[str, Any], rec: dict, n: int) -> None:
    """Sets in ``rec`` the file names ``old`` (the game.json saved) gave the game's videos and its
    first ``n`` turns' files."""
    for key in ("video", "contact_sheet"):
        if key in old:
            rec[key] = old[key]
    for j, t in enumerate(rec["turns"][:n]):  # earlier turns: their file names as saved
        for key in ("video", "gif", "state"):
            if key in old["turns"][j]:
                t[key] = old["turns"][j][key]


def _stale_derived(old: Mapping[str, Any]) -> tuple[dict, dict]:
    """``old``'s (a saved game.json) ``files`` without the :data:`DERIVED_FILES`, and its
    ``save.derived`` with them added under ``files``: they no longer cover every turn."""
    files = dict(old.get("files", {}))
    derived = dict(old.get("save", {}).get("derived", {}))
    for name in DERIVED_FILES:
        if name in files:
            derived.setdefault("files", {})[name] = files.pop(name)
    return files, derived


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
        tmp = _temp_name(out_dir, game_id)
        fileio.makedirs(tmp)
        old = None
        try:
            fileio.write_bytes_atomic(paths.join(tmp, TMP_MARKER), fileio.owner_stamp())
            rec, timings = _split_timings(record)
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
            media.save_image(paths.join(tmp, "contact_sheet.png"),
                             Image.fromarray(media.contact_sheet(turn_frames, sheet_columns, FRAME_RANGE)), format="PNG")
            rec["video"] = "game.mp4"
            rec["contact_sheet"] = "contact_sheet.png"
            write_index(tmp, game_id, rec)
            rec["fingerprint"] = dict(fingerprint) if fingerprint is not None else None
            rec["files"] = {name: {"size": fileio.size(paths.join(tmp, name)),
                                   "sha256": fileio.sha256_file(paths.join(tmp, name))}
                            for name in [*fileio.listdir(tmp), *(extra_files or {})]
                            if name not in (TMP_MARKER, TIMINGS_JSON) and fileio.isfile(paths.join(tmp, name))}
            _write_record(tmp, rec)
            _write_timings(tmp, timings, t0)
            _write_marker(tmp, game_id)
            if fileio.exists(final) and fileio.isdir(final) and fileio.listdir(final):
                # an earlier finished game of ours (check_target allowed it): move it aside, then drop it
                old = _temp_name(out_dir, game_id)
                fileio.write_bytes_atomic(paths.join(final, ASIDE_MARKER), b"")
                fileio.write_bytes_atomic(paths.join(final, TMP_MARKER), fileio.owner_stamp())
                fileio.rename(final, old)
            _move_in(tmp, final)
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


def _write_marker(game_dir: str, game_id: str) -> None:
    fileio.write_text_atomic(paths.join(game_dir, MARKER), json.dumps({"format": 1, "game_id": game_id}) + "\n")


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
      record: the whole game's game.json content (saves.py ``game_record``; ``timings_s`` goes to timings.json).
      frames: the new turn's clip ``[T, H, W, 3]`` (float [0, 1] or uint8, no HUD).
      state: its :func:`encode_turn_state` bytes.

    Raises:
      SavedGameError: ``game_dir`` does not hold the turns before this one.
    """
    with game_lock(game_dir):
        t0 = time.perf_counter()
        old = read_json(paths.join(game_dir, GAME_JSON))
        rec, timings = _split_timings(record)
        k = len(rec["turns"]) - 1
        if len(old.get("turns", [])) != k:
            raise SavedGameError(f"{game_dir} holds {len(old.get('turns', []))} turn(s), not the {k} before the "
                                 f"turn being saved. Fix: continue it with play --continue {game_dir}")
        _carry_over(old, rec, k)
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
        files, derived = _stale_derived(old)
        derived.setdefault("turns", len(old.get("turns", [])))
        for name in new_files:
            files[name] = _file_entry(paths.join(game_dir, name))
        rec["files"] = files
        rec["fingerprint"] = dict(fingerprint) if fingerprint is not None else None
        rec.setdefault("save", {})["derived"] = derived
        _write_record(game_dir, rec)
        write_index(game_dir, _folder_name(game_dir), rec)
        _write_timings(game_dir, timings, t0)


def drop_last_turn(game_dir: str, record: Mapping[str, Any], *,
                   fingerprint: Mapping[str, Any] | None = None) -> None:
    """Removes the last turn of a saved game grown turn by turn (the web server's undo).

    ``record`` is the game.json content of the turns kept (one fewer than saved; saves.py ``game_record``,
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
        rec, timings = _split_timings(record)
        n = len(rec["turns"])
        if n < 1 or len(old.get("turns", [])) != n + 1:
            raise SavedGameError(f"{game_dir} holds {len(old.get('turns', []))} turn(s), not the {n + 1} whose last "
                                 f"is being dropped. Fix: continue it with play --continue {game_dir}")
        _carry_over(old, rec, n)
        last = old["turns"][n]
        gone = [last[key] for key in ("video", "gif", "state") if key in last]
        files, derived = _stale_derived(old)
        derived["turns"] = -1  # stale: cover no turn count the game can have
        for name in gone:
            files.pop(name, None)
        rec["files"] = files
        rec["fingerprint"] = dict(fingerprint) if fingerprint is not None else None
        rec["save"] = dict(old.get("save", {}), **rec.get("save", {}), derived=derived)
        _write_record(game_dir, rec)
        for name in gone:
            if fileio.exists(paths.join(game_dir, name)):
                fileio.remove(paths.join(game_dir, name))
        write_index(game_dir, _folder_name(game_dir), rec)
        _write_timings(game_dir, timings)


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
        rec, timings = _split_timings(record)
        final = paths.join(out_dir, game_id)
        tmp = _temp_name(out_dir, game_id)
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
            _write_record(tmp, rec)
            write_index(tmp, game_id, rec)
            _write_timings(tmp, timings)
            _write_marker(tmp, game_id)
            _move_in(tmp, final)
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
        media.save_image(paths.join(game_dir, "contact_sheet.png"),
                         Image.fromarray(media.contact_sheet(clips, sheet_columns, FRAME_RANGE)), format="PNG")
        write_index(game_dir, _folder_name(game_dir), rec)
        rec["video"], rec["contact_sheet"] = "game.mp4", "contact_sheet.png"
        rec["save"]["derived"] = {"turns": n, "files": {name: _file_entry(paths.join(game_dir, name))
                                                         for name in DERIVED_FILES}}
        _write_record(game_dir, rec)

