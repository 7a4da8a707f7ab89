"""One writer of a folder at a time: :func:`exclusive_lock` holds an advisory ``flock`` of a lock file
on a local path and a lease object on ``gs://`` (:class:`_Lease`); a second holder gets
:class:`LockHeldError` naming the first (its :func:`animegamer_jax.io.fileio.owner_stamp`). Used by
game/folder/layout.py ``game_lock``."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from animegamer_jax.io import fileio, paths
from animegamer_jax.io.paths import PathLike

__all__ = ["LEASE_S", "LEASE_SCHEMES", "LockHeldError", "exclusive_lock"]


class LockHeldError(OSError):
    """:func:`exclusive_lock`'s lock is held by another process; ``holder`` is that process's
    :func:`animegamer_jax.io.fileio.owner_stamp` as it wrote it into the lock file or lease object (``""`` when not yet written)."""

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
            os.pwrite(fd, fileio.owner_stamp(), 0)
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
        self.fs = fileio.filesystem(url)
        self.token = uuid.uuid4().hex
        self.generation: str | None = None  # this holder's object's generation while it holds it
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _content(self) -> bytes:
        return json.dumps({"holder": fileio.owner_stamp().decode("utf-8").strip(), "expires": self.clock() + self.duration,
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
    process's hold is refused at once with :class:`LockHeldError` naming it (its :func:`animegamer_jax.io.fileio.owner_stamp`).
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
    url = paths.is_url(path)
    if url and os.fspath(path).split("://", 1)[0] not in LEASE_SCHEMES:
        yield 0
        return
    key = os.fspath(path) if url else os.path.abspath(os.path.expanduser(os.fspath(path)))
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
