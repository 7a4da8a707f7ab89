"""Naming user paths: local folders, ``gs://`` and whatever else ``etils.epath`` / fsspec handle.

Every path a user gives (workdir, checkpoints, outputs, TensorBoard logs, sample videos, datasets)
is a string here: :func:`is_url` tells a URL (``scheme://...``) from a local path, :func:`join` builds
``path/part`` for both, :func:`as_path` gives the ``etils.epath.Path`` that orbax, tensorstore and
epath reads take (``gs://bucket/runs/a2`` stays a URL, not ``./gs:/bucket/...``; a local path becomes
absolute, as orbax wants), :func:`resource` finds a repository file named by a config, and
:func:`av_output` / :func:`finish_av_output` give PyAV a target it can write for a URL. File operations
(exists, folders, atomic writes, renames, listing, hashing) live one layer up, in
:mod:`animegamer_jax.io.fileio`; this module imports nothing of the package.

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
from typing import Any

from etils import epath

PathLike = str | os.PathLike

#: the checkout (or editable install) holding ``configs/``, ``data/`` and ``checkpoints/``
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    """``path/part/...`` as a string. A URL through epath (``os.path.join`` would turn ``gs://b`` into
    ``gs:/b``); a local path through ``os.path.join``, so a relative path stays relative and ``~`` stays
    as given (the form users see in messages); :func:`as_path` makes it absolute where that matters."""
    s = os.fspath(path)
    return os.fspath(epath.Path(s).joinpath(*parts)) if is_url(s) else os.path.join(s, *parts)


def av_output(path: PathLike) -> Any:
    """Target for ``av.open(target, mode="w", format=...)``: the local path itself, or a BytesIO to
    upload with :func:`finish_av_output` (PyAV cannot write to URLs)."""
    return io.BytesIO() if is_url(path) else os.fspath(as_path(path))


def finish_av_output(path: PathLike, target: Any) -> None:
    """Uploads ``target`` to URL ``path`` when it is the BytesIO :func:`av_output` gave; nothing for a
    local path (PyAV wrote the file itself)."""
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
