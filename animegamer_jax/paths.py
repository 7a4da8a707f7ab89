"""User paths as URLs: local folders, ``gs://`` and whatever else ``etils.epath`` / fsspec handle.

Every path a user gives (workdir, checkpoints, outputs, TensorBoard logs, sample videos, datasets)
goes through :func:`as_path`, an ``etils.epath.Path``: ``gs://bucket/runs/a2`` stays a URL (no
``os.path.abspath`` turning it into ``./gs:/bucket/...``), a local path becomes absolute (orbax
wants absolute paths). Reads and writes then go through epath (fsspec + gcsfs for ``gs://``), orbax
through epath + tensorstore.

GCS emulators: the Google client-library convention is ``STORAGE_EMULATOR_HOST=host:port`` (gcsfs
and google-cloud-storage honour it). TensorStore, which writes orbax's arrays, reads its own
``TENSORSTORE_GCS_HTTP_URL`` instead and asks for credentials; :func:`configure_gcs_emulator`
(run when ``animegamer_jax`` is imported) maps the first onto the second and supplies the dummy
token tensorstore accepts (``GOOGLE_AUTH_TOKEN_FOR_TESTING``), so one variable reroutes every GCS
access of the process, orbax included.
"""

from __future__ import annotations

import io
import os
import subprocess
import uuid
from typing import Any

import fsspec
from etils import epath

PathLike = str | os.PathLike

#: the checkout (or editable install) holding ``configs/``, ``data/`` and ``checkpoints/``
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def checkout_commit() -> tuple[str, bool | None]:
    """``(commit hash, dirty)`` of the git checkout at :data:`REPO_ROOT` (dirty: tracked files differ
    from the commit), or ``("unknown", None)`` outside a checkout / without git. For reports that
    name the code that produced them."""
    try:
        head = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return head, bool(dirty)


def is_url(path: PathLike) -> bool:
    """True for ``scheme://...`` paths (gs://, s3://, ...); False for local paths."""
    return "://" in os.fspath(path)


def as_path(path: PathLike) -> epath.Path:
    """``epath.Path`` of a user path: URLs unchanged, local paths made absolute (``~`` expanded)."""
    if isinstance(path, epath.Path) and is_url(path):
        return path
    s = os.fspath(path)
    if is_url(s):
        return epath.Path(s)
    return epath.Path(s).expanduser().absolute()


def resource(path: PathLike) -> str:
    """A path from a config or a flag default, e.g. ``configs/tiny.py``, ``data/tiny_t5_spiece.model``,
    ``checkpoints/tiny_system``: unchanged when it is a URL, absolute, or exists from the working
    directory; else, when it exists relative to :data:`REPO_ROOT`, that absolute path (so commands
    run from any directory); else unchanged (the caller's error then names what the user gave)."""
    s = os.fspath(path)
    if not s or is_url(s) or os.path.isabs(s) or os.path.exists(s):
        return s
    candidate = os.path.join(REPO_ROOT, s)
    return candidate if os.path.exists(candidate) else s


def join(path: PathLike, *parts: str) -> str:
    """``path / part / ...`` as a string (URL-safe, unlike ``os.path.join`` on ``gs://``)."""
    return os.fspath(as_path(path).joinpath(*parts))


def exists(path: PathLike) -> bool:
    return as_path(path).exists()


def isdir(path: PathLike) -> bool:
    """Whether ``path`` is a folder (a local path through ``os.path``, a URL through epath)."""
    return as_path(path).is_dir() if is_url(path) else os.path.isdir(os.path.expanduser(os.fspath(path)))


def isfile(path: PathLike) -> bool:
    """Whether ``path`` is a file (a local path through ``os.path``, a URL through epath)."""
    return as_path(path).is_file() if is_url(path) else os.path.isfile(os.path.expanduser(os.fspath(path)))


def makedirs(path: PathLike) -> epath.Path:
    p = as_path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p


def rmtree(path: PathLike) -> None:
    """Removes a folder tree (no error when absent)."""
    p = as_path(path)
    if p.exists():
        p.rmtree()


def _fs(path: epath.Path) -> Any:
    fs, _ = fsspec.core.url_to_fs(os.fspath(path))
    return fs


def fs_info(path: PathLike) -> dict:
    """fsspec ``info()`` of a URL object (size, generation / updated time, ...)."""
    p = as_path(path)
    return _fs(p).info(os.fspath(p))


def list_files(root: PathLike) -> list[str]:
    """Every object under URL ``root``, relative to it, sorted (one listing request, not a walk)."""
    p = as_path(root)
    fs = _fs(p)
    base = fs._strip_protocol(os.fspath(p)).rstrip("/") + "/"
    return sorted(f[len(base):] for f in fs.find(os.fspath(p)) if f.startswith(base))


def move_dir(src: PathLike, dst: PathLike) -> None:
    """Renames folder ``src`` to ``dst`` (``dst`` must not exist).

    Local: one ``os.replace`` (atomic). Object stores have no rename: every object is copied, then
    the source removed, so callers that need atomicity there write a completion marker last.
    """
    s, d = as_path(src), as_path(dst)
    if not is_url(s):
        os.replace(s, d)
        return
    fs = _fs(s)
    # copy + delete, not fs.mv: gcsfs's mv first tries the objects.moveTo API, which flat buckets
    # (and emulators) refuse with a logged traceback per object before it falls back to this
    fs.copy(os.fspath(s).rstrip("/") + "/", os.fspath(d).rstrip("/") + "/", recursive=True)
    fs.rm(os.fspath(s), recursive=True)


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path``: a local path through a temp file in the same folder and
    ``os.replace`` (the temp file is removed if writing fails); on object stores one object upload,
    which is atomic by itself (readers see the old or the new object)."""
    if is_url(path):
        as_path(path).write_bytes(data)
        return
    path = os.path.expanduser(os.fspath(path))
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


def av_output(path: PathLike) -> Any:
    """Target for ``av.open(target, mode="w", format=...)``: the local path itself, or a BytesIO to
    upload with :func:`finish_av_output` (PyAV cannot write to URLs)."""
    return io.BytesIO() if is_url(path) else os.fspath(as_path(path))


def finish_av_output(path: PathLike, target: Any) -> None:
    if isinstance(target, io.BytesIO):
        as_path(path).write_bytes(target.getvalue())


def configure_gcs_emulator(environ: dict | None = None) -> None:
    """Routes tensorstore (orbax's array I/O) to ``STORAGE_EMULATOR_HOST`` when it is set.

    Adds ``http://`` to ``STORAGE_EMULATOR_HOST`` when missing (google-cloud-storage, which orbax
    uses to probe the bucket, needs it; gcsfs accepts both), sets ``TENSORSTORE_GCS_HTTP_URL`` and, unless
    credentials are configured, ``GOOGLE_AUTH_TOKEN_FOR_TESTING``; turns off gcsfs's experimental bucket-type probe
    (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``: a gRPC storage-control call an emulator does not serve,
    which otherwise stalls 60 s per bucket). Values the user set are left alone. Must run before
    gcsfs is imported (``animegamer_jax/__init__.py`` does).
    """
    env = os.environ if environ is None else environ
    host = env.get("STORAGE_EMULATOR_HOST", "")
    if not host or host == "default":
        return
    url = host if host.startswith(("http://", "https://")) else f"http://{host}"
    env["STORAGE_EMULATOR_HOST"] = url  # google-cloud-storage (orbax's bucket probe) needs the scheme
    env.setdefault("TENSORSTORE_GCS_HTTP_URL", url.rstrip("/"))
    env.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    if "GOOGLE_APPLICATION_CREDENTIALS" not in env:
        env.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
