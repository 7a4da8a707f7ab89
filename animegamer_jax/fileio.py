"""The few file operations that touch users' output folders and checkpoints, in one place.

Every writer of user-visible files (game/writers.py, system_checkpoint.py) goes through these
helpers, so the path backend (local paths today; ``etils.epath`` URLs such as ``gs://`` later) is
swapped here and nowhere else. Writes are atomic: a temp file next to the target, then a rename.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator

#: read size of the hashing helpers (bytes)
CHUNK = 1 << 20


def join(*parts: str) -> str:
    return os.path.join(*parts)


def exists(path: str) -> bool:
    return os.path.lexists(path)


def isdir(path: str) -> bool:
    return os.path.isdir(path)


def isfile(path: str) -> bool:
    return os.path.isfile(path)


def listdir(path: str) -> list[str]:
    return sorted(os.listdir(path))


def makedirs(path: str) -> None:
    os.makedirs(path, exist_ok=True)


def size(path: str) -> int:
    return os.path.getsize(path)


def rename(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst`` (``dst`` must not exist, or be an empty folder)."""
    os.rename(src, dst)


def remove(path: str) -> None:
    os.remove(path)


def rmdir(path: str) -> None:
    """Removes an empty folder."""
    os.rmdir(path)


def rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temp file in the same folder and a rename."""
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: str, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def walk_files(root: str) -> Iterator[str]:
    """Paths of every regular file under ``root``, relative to it, '/'-separated, sorted."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            out.append(os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/"))
    yield from sorted(out)


def sha256_file(path: str) -> str:
    """Hex sha256 of a whole file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
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
    with open(path, "rb") as f:
        for off in offsets:
            f.seek(off)
            h.update(f.read(block))
    return h.hexdigest()
