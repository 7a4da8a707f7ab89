"""File operations on user paths, local or URL, in one place: the package's only definitions of them.

What each does: :func:`exists` (a broken symlink exists), :func:`isdir`, :func:`isfile`, :func:`listdir`,
:func:`walk_files`, :func:`size`, :func:`stamp`, :func:`read_bytes`, :func:`makedirs`,
:func:`write_bytes_atomic` / :func:`write_text_atomic`, :func:`rename`, :func:`remove`, :func:`rmdir`,
:func:`rmtree`, the sha256 helpers of the integrity checks, and :func:`owner_stamp` / :func:`owner_gone`
(whose temp folder a killed run left; the lock holders of io/locks.py stamp their locks with it),
:func:`filesystem` (a URL's fsspec filesystem); :func:`signals_held` runs a save with Ctrl-C / SIGTERM held. Paths are strings or ``os.PathLike``
(an ``etils.epath.Path`` included), built with :func:`animegamer_jax.io.paths.join`; naming (URL or not,
absolute ``epath.Path``, repository resources) is :mod:`animegamer_jax.io.paths`' own, the one module
this one imports.

Every operation goes through ``etils.epath.Path`` (:func:`_path`: ``~`` expanded, a relative local
path kept relative, so messages name the path as given), one code path for local folders and URLs
(``gs://``, ``s3://`` ..., :func:`animegamer_jax.io.paths.is_url`); epath runs a local path through
``os`` / ``shutil`` and a URL through fsspec. What epath does not do stays here, per kind of path:
the atomic writes (locally a temp file and ``os.replace``; on object stores a single object upload,
atomic by itself), :func:`rename` (locally ``os.replace``; on object stores a copy then a delete, so
callers that need a folder to appear whole write a marker or a manifest last and verify it, as
game/folder/ and the checkpoint package do), :func:`walk_files`' one listing request on object
stores, :func:`stamp`'s version (local mtime in ns, an object's generation), the best-effort local
:func:`rmtree`, and the owner stamps of temp folders. A missing path raises ``FileNotFoundError``
unless the function says otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import signal
import socket
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec
from etils import epath

from animegamer_jax.io import paths
from animegamer_jax.io.paths import PathLike

__all__ = ["CHUNK", "exists", "filesystem", "forget_listings", "isdir", "isfile", "listdir", "makedirs", "owner_gone", "owner_stamp",
           "read_bytes", "remove", "rename", "rmdir", "rmtree", "sha256_file", "sha256_sampled", "signals_held", "size", "stamp", "walk_files",
           "write_bytes_atomic", "write_text_atomic"]

#: read size of the hashing helpers (bytes)
CHUNK = 1 << 20


def _url(path: PathLike) -> bool:
    return paths.is_url(path)


def _path(path: PathLike) -> epath.Path:
    """``epath.Path`` of a user path: a URL as it is, a local path with ``~`` expanded (relative kept).

    Raises:
      FileNotFoundError: an empty path (which epath would read as ``.``, the working directory).
    """
    if isinstance(path, epath.Path) and _url(path):
        return path
    s = os.path.expanduser(os.fspath(path))
    if not s:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), s)
    return epath.Path(s)


def _local(path: PathLike) -> str:
    return os.path.expanduser(os.fspath(path))


def filesystem(path: PathLike) -> Any:
    """The fsspec filesystem of URL ``path``."""
    fs, _ = fsspec.core.url_to_fs(os.fspath(path))
    return fs


def exists(path: PathLike) -> bool:
    """Whether anything is at ``path``: locally ``os.path.lexists`` (a broken symlink exists, so a writer
    never replaces it), on object stores an object or a folder prefix."""
    if not os.fspath(path):
        return False
    p = _path(path)
    return p.exists() or (not _url(p) and os.path.islink(p))


def isdir(path: PathLike) -> bool:
    """Whether ``path`` is a folder (locally following symlinks; on object stores a prefix with objects)."""
    return bool(os.fspath(path)) and _path(path).is_dir()


def isfile(path: PathLike) -> bool:
    """Whether ``path`` is a file (locally following symlinks; on object stores an object)."""
    return bool(os.fspath(path)) and _path(path).is_file()


def listdir(path: PathLike) -> list[str]:
    """Names of the entries of folder ``path``, sorted (epath's listing: names ending in ``~``, editor
    backups, are left out; ``NotADirectoryError`` for a local file)."""
    return sorted(p.name for p in _path(path).iterdir())


def walk_files(root: PathLike) -> Iterator[str]:
    """Paths of every file under ``root``, relative to it, '/'-separated, sorted (on object stores one
    listing request, not a walk). Nothing for a missing local ``root``."""
    if _url(root):
        p = _path(root)
        fs = filesystem(p)
        base = fs._strip_protocol(os.fspath(p)).rstrip("/") + "/"
        yield from sorted(f[len(base):] for f in fs.find(os.fspath(p)) if f.startswith(base))
        return
    root = _local(root)
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            out.append(os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/"))
    yield from sorted(out)


def size(path: PathLike) -> int:
    """Size of file ``path`` in bytes."""
    with _path(path).open("rb") as f:  # an object store answers from the object's metadata
        return f.seek(0, os.SEEK_END)


def stamp(path: PathLike) -> tuple[int, int | str]:
    """``(size in bytes, version)`` of a file: locally the mtime in ns; on object stores the object's
    generation / update time (a string). ``(-1, -1)`` when it is missing."""
    try:
        if not _url(path):
            st = os.stat(_local(path))
            return st.st_size, st.st_mtime_ns
        info = filesystem(path).info(os.fspath(_path(path)))
        return int(info.get("size", -1)), str(info.get("generation") or info.get("updated") or info.get("mtime", ""))
    except (OSError, FileNotFoundError):
        return -1, -1


def read_bytes(path: PathLike) -> bytes:
    """The whole content of file ``path``."""
    return _path(path).read_bytes()


def makedirs(path: PathLike) -> None:
    """Creates folder ``path`` and its parents (nothing when it exists)."""
    _path(path).mkdir(parents=True, exist_ok=True)


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path``: a local path through a temp file in the same folder and
    ``os.replace`` (the temp file is removed if writing fails); on object stores one object upload,
    which is atomic by itself (readers see the old or the new object)."""
    if _url(path):
        _path(path).write_bytes(data)
        return
    path = _local(path)
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: PathLike, text: str) -> None:
    """:func:`write_bytes_atomic` of ``text`` encoded as UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"))


def rename(src: PathLike, dst: PathLike) -> None:
    """Renames file or folder ``src`` to ``dst`` (``dst`` must not exist, or be an empty folder).

    Local: one ``os.replace`` (atomic). Object stores have no rename: the object ``src``, or every
    object of folder ``src``, is copied, then ``src`` removed (not atomic), so callers that need
    atomicity there write a completion marker last. Afterwards this process's cached listings of the store are dropped
    (:func:`forget_listings`).
    """
    if not _url(src):
        os.replace(_local(src), _local(dst))
        return
    s, d = os.fspath(_path(src)), os.fspath(_path(dst))
    fs = filesystem(s)
    fs.invalidate_cache(s)  # whether src is a file: asked of the store, not of a listing cached before it was written
    # copy + delete, not fs.mv: gcsfs's mv first tries the objects.moveTo API, which flat buckets
    # (and emulators) refuse with a logged traceback per object before it falls back to this
    if fs.isfile(s):
        fs.copy(s, d)
    else:
        fs.copy(s.rstrip("/") + "/", d.rstrip("/") + "/", recursive=True)
    fs.rm(s, recursive=True)
    forget_listings(s)


def forget_listings(path: PathLike) -> None:
    """Drops this process's cached listings of the object store of URL ``path`` (fsspec caches them per
    filesystem instance, and epath, so orbax, keeps an instance of its own), so that a change made by
    another process or with another instance is seen; nothing for a local path."""
    if not _url(path):
        return
    fs = filesystem(path)
    for inst in {id(fs): fs, **{id(i): i for i in getattr(type(fs), "_cache", {}).values()}}.values():
        inst.invalidate_cache()


def remove(path: PathLike) -> None:
    """Deletes file ``path``.

    Raises:
      IsADirectoryError: ``path`` is a local folder (a folder goes through :func:`rmdir` or ``rmtree``).
    """
    if not _url(path) and os.path.isdir(_local(path)):
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    _path(path).unlink()


def rmdir(path: PathLike) -> None:
    """Removes an empty folder (object stores have no folders: nothing to do there)."""
    if not _url(path):
        os.rmdir(_local(path))


def _pid_namespace() -> str:
    try:  # containers sharing a host name have pid namespaces of their own
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"


def owner_stamp() -> bytes:
    """``b"<host name> <process id> <pid namespace>\\n"``: written into a temp folder's marker file so
    that a later run can tell a folder left by a killed process (:func:`owner_gone`) from one being
    written now."""
    return f"{socket.gethostname()} {os.getpid()} {_pid_namespace()}\n".encode()


def owner_gone(marker: PathLike) -> bool:
    """True when the :func:`owner_stamp` in file ``marker`` names this host and a process that no
    longer runs (its temp folder is an orphan of a killed run). False for a live process, another
    host or pid namespace, a missing, empty or unreadable marker (an older run's: left alone)."""
    try:
        host, pid, ns = read_bytes(marker).decode("utf-8").split()
        if host != socket.gethostname() or ns != _pid_namespace():
            return False
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):  # PermissionError: the process runs as another user
        return False
    return False


def rmtree(path: PathLike) -> None:
    """Removes folder tree ``path``; nothing when it is absent. Locally best effort (what cannot be
    removed stays, for a later ``exists`` or ``rename`` to report); on object stores errors raise."""
    if _url(path):
        _path(path).rmtree(missing_ok=True)
    else:
        shutil.rmtree(_local(path), ignore_errors=True)


def _open_read(path: PathLike):
    return _path(path).open("rb")


def sha256_file(path: PathLike) -> str:
    """Hex sha256 of a whole file."""
    h = hashlib.sha256()
    with _open_read(path) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_sampled(path: PathLike, file_size: int, block: int, blocks: int) -> str:
    """Hex sha256 of ``blocks`` evenly spaced ``block``-byte reads of a file of ``file_size`` bytes
    (first and last included).

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


@contextlib.contextmanager
def signals_held(signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Runs the body with ``signums`` held (a save that must land whole, e.g. a game's files): the first
    one that arrives inside is delivered, to the handler that was in place, when the body ends (a save
    that has begun finishes, then Ctrl-C raises KeyboardInterrupt as usual); a second signal inside is delivered at once (a save that
    hangs can still be stopped). Sections nest (an inner section hands a held signal to the outer
    one). Python runs signal handlers in the main thread only, so off it (the web app's worker)
    nothing needs holding and nothing is changed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {}

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)

    def hold(signum, frame):
        if got:  # a second one (a save that hangs): stop holding, deliver it now
            restore()
            signal.raise_signal(signum)
        got.append(signum)

    try:
        for s in signums:
            handler = signal.getsignal(s)
            if handler is not None:  # None: installed outside Python, left alone
                previous[s] = handler
                signal.signal(s, hold)
        yield
    finally:
        restore()
        if got:
            signal.raise_signal(got[0])
