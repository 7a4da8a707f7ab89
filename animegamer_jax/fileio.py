"""The few file operations that touch users' output folders and checkpoints, in one place.

Every writer of user-visible files (game/writers.py, the checkpoint package) goes through these
helpers; ``isdir``, ``isfile`` and the atomic writes are :mod:`animegamer_jax.paths`' own. Local
paths use ``os`` directly (atomic temp file + rename); URLs (``gs://``, ``s3://`` ..., see
``animegamer_jax/paths.py``) go through ``etils.epath`` / fsspec, where a single object upload is
atomic by itself and a folder rename is a copy then a delete (callers that need a folder to appear
whole write a marker or a manifest last and verify it, as writers.py and the checkpoint package do).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator

from animegamer_jax import paths
from animegamer_jax.paths import isdir, isfile, write_bytes_atomic, write_text_atomic

__all__ = ["CHUNK", "exists", "isdir", "isfile", "join", "listdir", "makedirs", "read_bytes", "remove", "rename",
           "rmdir", "rmtree", "sha256_file", "sha256_sampled", "size", "stamp", "walk_files", "write_bytes_atomic",
           "write_text_atomic"]

#: read size of the hashing helpers (bytes)
CHUNK = 1 << 20


def _url(path: str) -> bool:
    return paths.is_url(path)


def join(*parts: str) -> str:
    return paths.join(parts[0], *parts[1:]) if _url(parts[0]) else os.path.join(*parts)


def exists(path: str) -> bool:
    return paths.as_path(path).exists() if _url(path) else os.path.lexists(path)


def listdir(path: str) -> list[str]:
    if _url(path):
        return sorted(p.name for p in paths.as_path(path).iterdir())
    return sorted(os.listdir(path))


def makedirs(path: str) -> None:
    if _url(path):
        paths.makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def size(path: str) -> int:
    return int(paths.as_path(path).stat().length) if _url(path) else os.path.getsize(path)


def stamp(path: str) -> tuple[int, int | str]:
    """``(size, version)`` of a file: local mtime in ns; on object stores the object's
    generation / update time. ``(-1, -1)`` when it is missing."""
    try:
        if not _url(path):
            st = os.stat(path)
            return st.st_size, st.st_mtime_ns
        info = paths.fs_info(path)
        return int(info.get("size", -1)), str(info.get("generation") or info.get("updated") or info.get("mtime", ""))
    except (OSError, FileNotFoundError):
        return -1, -1


def rename(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst`` (``dst`` must not exist, or be an empty folder); on object stores
    a copy of every object, then a delete (not atomic)."""
    if _url(src):
        paths.move_dir(src, dst)
    else:
        os.rename(src, dst)


def remove(path: str) -> None:
    if _url(path):
        paths.as_path(path).unlink()
    else:
        os.remove(path)


def rmdir(path: str) -> None:
    """Removes an empty folder (object stores have no folders: nothing to do there)."""
    if not _url(path):
        os.rmdir(path)


def rmtree(path: str) -> None:
    if _url(path):
        paths.rmtree(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def read_bytes(path: str) -> bytes:
    if _url(path):
        return paths.as_path(path).read_bytes()
    with open(path, "rb") as f:
        return f.read()


def walk_files(root: str) -> Iterator[str]:
    """Paths of every regular file under ``root``, relative to it, '/'-separated, sorted."""
    out = []
    if _url(root):
        yield from paths.list_files(root)
        return
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            out.append(os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/"))
    yield from sorted(out)


def _open_read(path: str):
    return paths.as_path(path).open("rb") if _url(path) else open(path, "rb")


def sha256_file(path: str) -> str:
    """Hex sha256 of a whole file."""
    h = hashlib.sha256()
    with _open_read(path) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_sampled(path: str, file_size: int, block: int, blocks: int) -> str:
    """Hex sha256 of ``blocks`` evenly spaced ``block``-byte reads of a file (first and last included).

    The fast integrity check of large files: a few seeks instead of reading the whole file, so it
    catches truncation, zeroed or replaced regions at the sampled offsets, not every flipped byte.
    """
    h = hashlib.sha256()
    if file_size <= block * blocks:
        offsets = [0]
        block = file_size
    else:
        step = (file_size - block) / (blocks - 1)
        offsets = [int(round(i * step)) for i in range(blocks)]
    with _open_read(path) as f:
        for off in offsets:
            f.seek(off)
            h.update(f.read(block))
    return h.hexdigest()
