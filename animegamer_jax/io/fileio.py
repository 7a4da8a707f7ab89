"""File operations on user paths, local or URL, in one place: the package's only definitions of them.

What each does: :func:`exists` (a broken symlink exists), :func:`isdir`, :func:`isfile`, :func:`listdir`,
:func:`walk_files`, :func:`size`, :func:`stamp`, :func:`read_bytes`, :func:`makedirs`,
:func:`write_bytes_atomic` / :func:`write_text_atomic`, :func:`rename`, :func:`remove`, :func:`rmdir`,
:func:`rmtree`, the sha256 helpers of the integrity checks, and :func:`owner_stamp` / :func:`owner_gone`
(whose temp folder a killed run left), :func:`exclusive_lock` (one writer of a folder at a time: an advisory
``flock`` lock locally, a lease object on ``gs://``); :func:`signals_held` runs a save with Ctrl-C / SIGTERM held. Paths are strings or ``os.PathLike``
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
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import fsspec
from etils import epath

from animegamer_jax.io import paths
from animegamer_jax.io.paths import PathLike

__all__ = ["CHUNK", "LEASE_S", "LockHeldError", "exclusive_lock", "exists", "forget_listings", "isdir", "isfile", "listdir", "makedirs", "owner_gone", "owner_stamp",
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


def _fs(path: PathLike) -> Any:
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
        fs = _fs(p)
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
        info = _fs(path).info(os.fspath(_path(path)))
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
    fs = _fs(s)
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
    fs = _fs(path)
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


class LockHeldError(OSError):
    """:func:`exclusive_lock`'s lock is held by another process; ``holder`` is that process's
    :func:`owner_stamp` as it wrote it into the lock file or lease object (``""`` when not yet written)."""

    def __init__(self, path: str, holder: str):
        super().__init__(errno.EWOULDBLOCK, "held by another process", path)
        self.path, self.holder = path, holder

    def holder_words(self) -> str:
        """``"pid 1234 on host NAME"`` from the holder's stamp (``"pid unknown"`` when it has none yet)."""
        parts = self.holder.split()
        return f"pid {parts[1]} on host {parts[0]}" if len(parts) >= 2 else "pid unknown, its stamp not yet written"


#: this process's held locks: lock path (absolute local path, or URL) -> [file descriptor or _Lease, depth]
_locks: dict[str, list[Any]] = {}
_locks_guard = threading.Lock()


def _take_lock(path: str) -> int:
    """Opens (creating) lock file ``path`` and takes its ``flock`` without waiting; returns the fd.

    A holder removes the file before it lets go (:func:`exclusive_lock`), so a process that opened
    the old file, then got its lock, finds the path gone or another file there, and tries again on
    the file now at the path: one file at the path at a time, one holder of it.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            finally:
                os.close(fd)
            raise LockHeldError(path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        st = os.fstat(fd)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            os.ftruncate(fd, 0)
            os.pwrite(fd, owner_stamp(), 0)
            return fd
        os.close(fd)  # the holder before us removed it as it let go: again, on the file at the path now


#: seconds a lease object lasts unless its holder renews it (:class:`_Lease`; renewed every third of it)
LEASE_S = 60.0
#: URL schemes whose store has conditional writes (generation preconditions), so :func:`exclusive_lock` holds a lease there
LEASE_SCHEMES = ("gs", "gcs")


def _gcs(fs: Any, url: str, method: str, *, data: bytes | None = None, generation: int | str | None = None) -> Any:
    """One request of the GCS JSON API (through gcsfs's authenticated session) on object ``url``:
    ``"read"`` -> ``(content, generation)`` (one media download; GCS names the generation in its
    ``x-goog-generation`` header); ``"write"`` -> the new generation of an upload of ``data`` made
    only if the object's generation is still ``generation`` (``0``: only if there is no object);
    ``"delete"`` made only if its generation is still ``generation``. Generations are strings.

    Raises:
      FileExistsError: the precondition failed (HTTP 412: another writer changed the object).
      FileNotFoundError: no object (``"read"``, ``"delete"``).
      OSError: any other failure of the request.
    """
    bucket, key, _ = fs.split_path(url)
    try:
        if method == "read":
            headers, content = fs.call("GET", "b/{}/o/{}", bucket, key, alt="media")
            return content, str(headers["x-goog-generation"])
        if method == "write":
            out = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{{}}/o", bucket, uploadType="media", name=key,
                          ifGenerationMatch=str(generation), data=data, json_out=True,
                          headers={"Content-Type": "application/octet-stream"})
            return str(out["generation"])
        fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(generation))
        return None
    except OSError:
        raise
    except Exception as e:  # gcsfs's HttpError, aiohttp's errors, ...: one kind for callers
        raise OSError(f"{method} of {url} failed: {e}") from e
    finally:
        fs.invalidate_cache(url)  # its folder's cached listing, and the parents'


class _Lease:
    """The lease of lock path ``url`` on a store with generation preconditions (GCS): a small object
    ``{"holder": owner_stamp, "expires": unix time, "token": hex}`` that one holder at a time owns.

    :meth:`take` creates it only if absent (``ifGenerationMatch=0``); an object whose ``expires`` has
    passed (its holder died: nobody renewed it) is replaced only if its generation is still the one
    read, so of two takers of one stale lease exactly one wins. :meth:`renew` rewrites it with a new
    expiry only if its generation is still this holder's own; :meth:`release` deletes it on the same
    condition (a lease another process took over is left to it). ``clock`` gives the time (unix
    seconds; ``time.time``): expiries compare the clocks of different hosts, so they should agree to
    well within ``duration``.
    """

    def __init__(self, url: str, clock: Callable[[], float] = time.time, duration: float = LEASE_S):
        self.url, self.clock, self.duration = url, clock, duration
        self.fs = _fs(url)
        self.token = uuid.uuid4().hex
        self.generation: str | None = None  # this holder's object's generation while it holds it
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _content(self) -> bytes:
        return json.dumps({"holder": owner_stamp().decode("utf-8").strip(), "expires": self.clock() + self.duration,
                           "token": self.token}).encode("utf-8")

    def read(self) -> tuple[dict, str] | None:
        """``(lease fields, generation)`` of the object now at the path; ``None`` when there is none.
        An object that is not a lease (unreadable) reads as expired with no holder."""
        try:
            content, generation = _gcs(self.fs, self.url, "read")
        except FileNotFoundError:
            return None
        try:
            fields = json.loads(content)
            fields = {"holder": str(fields["holder"]), "expires": float(fields["expires"]),
                      "token": str(fields["token"])}
        except (ValueError, KeyError, TypeError):
            fields = {"holder": "", "expires": 0.0, "token": ""}
        return fields, generation

    def claim(self, seen: tuple[dict, str] | None) -> bool:
        """Takes the lease given ``seen``, a :meth:`read` of it: none -> created only if still absent;
        an expired one -> replaced only if still that generation; this holder's own (an upload that
        was retried after it succeeded) -> kept. False when another writer changed the object since
        ``seen`` (read it again).

        Raises:
          LockHeldError: ``seen`` is another holder's lease that has not expired.
        """
        if seen is not None:
            fields, generation = seen
            if fields["token"] == self.token:
                self.generation = generation
                return True
            if fields["expires"] > self.clock():
                raise LockHeldError(self.url, fields["holder"])
        try:
            self.generation = _gcs(self.fs, self.url, "write", data=self._content(),
                                   generation=0 if seen is None else seen[1])
        except FileExistsError:
            return False
        return True

    def take(self, attempts: int = 5) -> None:
        """Takes the lease (:meth:`claim` of a fresh :meth:`read`, again while other writers change it).

        Raises:
          LockHeldError: another holder's lease has not expired (or others kept changing it).
        """
        seen = None  # first try the create: one request when the lock is free
        for _ in range(attempts):
            if self.claim(seen):
                return
            seen = self.read()
        raise LockHeldError(self.url, seen[0]["holder"] if seen else "")

    def renew(self) -> bool:
        """Pushes the expiry to ``clock() + duration`` (an upload only if the object is still this
        holder's generation); False when the lease was lost (another process took it over)."""
        try:
            self.generation = _gcs(self.fs, self.url, "write", data=self._content(), generation=self.generation)
            return True
        except FileExistsError:
            seen = self.read()  # this renewal retried after it succeeded, or the lease lost
            if seen is not None and seen[0]["token"] == self.token:
                self.generation = seen[1]
                return True
            self.lost = True
            return False

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.duration / 3):
            try:
                if not self.renew():
                    print(f"warning: lost the lock {self.url}: another process took it over after it was not "
                          f"renewed for {self.duration:.0f} s", file=sys.stderr, flush=True)
                    return
            except OSError:  # the store unreachable for now: the next tick tries again
                continue

    def start(self) -> None:
        """Starts renewing the lease every ``duration / 3`` seconds, in a daemon thread."""
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease {self.url}", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stops renewing, then deletes the object if its generation is still this holder's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lost or self.generation is None:
            return
        try:
            _gcs(self.fs, self.url, "delete", generation=self.generation)
        except (FileExistsError, FileNotFoundError):
            pass
        self.generation = None


@contextlib.contextmanager
def exclusive_lock(path: PathLike) -> Iterator[int]:
    """Holds the lock of lock path ``path`` inside the body, so that one process at a time does what
    it guards (game/folder/layout.py ``game_lock``: writing one game folder). Nothing waits: another
    process's hold is refused at once with :class:`LockHeldError` naming it (its :func:`owner_stamp`).
    The lock is re-entrant within this process (nested holds, any thread, share the first one's;
    threads of one process are not kept apart).

    A local path: an advisory ``fcntl.flock(LOCK_EX | LOCK_NB)`` of the lock file, the holder's stamp
    written into it. The kernel lets go of a ``flock`` when the process that holds it ends, killed
    too, so the lock of a dead process never blocks: the next taker gets it at once and writes its
    own stamp over the stale one. The file is removed when the hold ends (a killed holder leaves
    it, stale and harmless). File systems without working ``flock`` (some network mounts) give no
    protection.

    A ``gs://`` URL (:data:`LEASE_SCHEMES`): a lease object at ``path`` (:class:`_Lease`), created only
    if absent, holding the holder's stamp and an expiry :data:`LEASE_S` seconds on, renewed by a
    daemon thread every third of that while the body runs, and deleted at the end if still this
    holder's. A killed holder's lease blocks until its expiry passes (up to :data:`LEASE_S` s), then
    is taken over (a precondition on its generation: of two takers one wins). A holder that cannot
    renew for :data:`LEASE_S` s (store unreachable, process stopped) may lose it: a warning line on
    stderr, and its release leaves the new holder's object. Other URL schemes (``s3://``,
    ``memory://``, ...) hold no lock at all (the body runs unguarded, depth 0): their fsspec
    filesystems offer no create-if-absent this code uses (``memory://`` is one process's own store).

    Yields:
      this hold's depth: 1 for the hold that took the lock, 2, 3, ... for nested ones, 0 for a URL of
      another scheme.

    Raises:
      LockHeldError: another process holds it. OSError: the lock file or object cannot be created.
    """
    url = _url(path)
    if url and os.fspath(path).split("://", 1)[0] not in LEASE_SCHEMES:
        yield 0
        return
    key = os.fspath(path) if url else os.path.abspath(_local(path))
    with _locks_guard:
        held = _locks.get(key)
        if held is not None:
            held[1] += 1
        elif url:
            lease = _Lease(key)
            lease.take()
            lease.start()
            held = _locks[key] = [lease, 1]
        else:
            held = _locks[key] = [_take_lock(key), 1]
        depth = held[1]
    try:
        yield depth
    finally:
        with _locks_guard:
            held = _locks[key]
            held[1] -= 1
            if held[1] == 0:
                del _locks[key]
                if url:
                    held[0].release()
                else:
                    try:
                        os.unlink(key)  # while still held: see _take_lock
                    except OSError:
                        pass
                    os.close(held[0])


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
