"""Reading a release download for ``convert release`` (convert/release.py): where its files lie
(:func:`locate`), remote files copied locally to be memory-mapped (:class:`LocalCache`), torch and
safetensors files read lazily, and their pages dropped once written (:func:`drop_file_pages`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import fsspec
from safetensors import safe_open

from animegamer_jax.io import fileio
from animegamer_jax.io import paths

MLLM_GLOB = "AnimeGamer/MLLM-*/pytorch_model.bin"
DECODER_GLOB = "AnimeGamer/VDM_Decoder-*"
VAE_FILE = "vae/3d-vae.pt"
T5_DIR = "google/t5-v1_1-xxl"
CLIP_FILE = "laion/CLIP-ViT-B-16-laion2B-s34B-b88K/open_clip_pytorch_model.bin"
MISTRAL_DIR = "Mistral-7B-Instruct-v0.1"
FIX_REDOWNLOAD = "download the file again and compare its size / SHA256 with the release"
#: ``--allow_pickle``: read torch files with full pickle (``weights_only=False``); off by default
ALLOW_PICKLE = False


class ReleaseError(ValueError):
    """A release folder that cannot be converted. ``problems``: one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def one_line(msg: str) -> str:
    """A converter message on one line (newlines and runs of spaces folded)."""
    return re.sub(r"\s+", " ", re.sub(r"\x1b\[[0-9;]*m", "", str(msg))).strip()


def absolute(path: str) -> str:
    """A user path as shown and used: URLs unchanged, local paths absolute (``paths.as_path``)."""
    return str(paths.as_path(path))


def find_files(folder: str, pattern: str) -> list[str]:
    """``folder/pattern`` matches (local or URL), sorted."""
    p = paths.as_path(folder)
    return sorted(os.fspath(h) for h in p.glob(pattern)) if p.is_dir() else []


def relative(path: str, root: str) -> str:
    return path[len(root.rstrip("/")) + 1:] if path.startswith(root.rstrip("/") + "/") else path


class LocalCache:
    """Local copies of a remote release's files, made by fsspec's ``filecache::`` as each file is first read.

    ``local(path)`` is ``path`` itself for local files; for a URL it is the file's copy in
    ``directory``, downloaded by fsspec's whole-file cache (``filecache::URL``; the file names are
    hashes of the URLs, and the cache's metadata file records each finished download), with one log
    line per file naming its size. A copy that an earlier run left in a user-given ``directory`` is
    reused while the remote object is unchanged (fsspec compares its ``ukey``); a download that failed
    part-way, or whose size is not the remote's, is dropped from the cache and raises ``OSError``.
    ``close()`` removes the folder when this object created it (a temporary one).
    """

    def __init__(self, directory: str | None = None, log: Callable[[str], None] = print):
        self.log = log
        self._own = directory is None
        self.directory = directory
        self.copies: dict[str, str] = {}

    def local(self, path: str) -> str:
        if not paths.is_url(path):
            return path
        if path in self.copies:
            return self.copies[path]
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="animegamer-release-cache-")
        cache, cached = fsspec.core.url_to_fs(f"filecache::{path}", filecache={
            "cache_storage": self.directory, "check_files": True, "expiry_time": False})
        size = int(cache.fs.size(path))
        self.log(f"copying {path} ({size / 2**30:.2f} GiB) to the local cache {self.directory} (unless an "
                 f"earlier run did): torch / safetensors memory-map local files only")
        try:
            with cache.open(cached, "rb") as f:
                out = f.name
            if os.path.getsize(out) != size:
                raise OSError(f"{path}: the local copy {out} holds {os.path.getsize(out)} of {size} bytes")
        except BaseException:
            cache.pop_from_cache(cached)  # never reused by a later read or run
            raise
        self.copies[path] = out
        return out

    def close(self) -> None:
        if self._own and self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.copies = {}


#: the cache of the conversion in progress (:func:`reading`); local files pass through
_cache = LocalCache()


@contextlib.contextmanager
def reading(cache_dir: str | None, log: Callable[[str], None], allow_pickle: bool) -> Iterator[None]:
    """Inside, remote files are copied into ``cache_dir`` (None: a temporary folder, removed on exit) and
    torch files are read with full pickle when ``allow_pickle`` (else the weights-only loader)."""
    global _cache, ALLOW_PICKLE

    ALLOW_PICKLE, _cache = bool(allow_pickle), LocalCache(cache_dir, log)
    try:
        yield
    finally:
        _cache.close()
        ALLOW_PICKLE, _cache = False, LocalCache()


# ----------------------------------------------------------------------------------------------
# Lazy reading
# ----------------------------------------------------------------------------------------------
class LazySafetensors(Mapping):
    """``{name: torch.Tensor}`` over safetensors files, each tensor read on access (bf16 kept)."""

    def __init__(self, files: list[str]):
        self._where: dict[str, Any] = {}
        self._handles = []
        for f in files:
            try:
                h = safe_open(_cache.local(f), framework="pt")
            except Exception as e:  # noqa: BLE001 - safetensors raises several error types
                raise ReleaseError([f"{f}: cannot read the safetensors header ({one_line(e)}); the file is "
                                    f"truncated or corrupt. Fix: {FIX_REDOWNLOAD}"]) from None
            self._handles.append(h)
            for k in h.keys():
                self._where[k] = (h, f)

    def __getitem__(self, key: str):
        h, f = self._where[key]
        try:
            return h.get_tensor(key)
        except Exception as e:  # noqa: BLE001
            raise ReleaseError([f"{f}: tensor {key!r} cannot be read ({one_line(e)}). Fix: {FIX_REDOWNLOAD}"]) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def load_torch_lazy(path: str) -> dict[str, Any]:
    """A torch checkpoint memory-mapped (``torch.load(mmap=True, weights_only=True)``).

    ``{'module': sd}`` (SAT / DeepSpeed) and ``{'state_dict': sd}`` (``3d-vae.pt``) are unwrapped;
    the other DeepSpeed entries are bookkeeping and are not returned.

    Raises:
      ReleaseError: the file is missing, truncated or not a torch zip checkpoint (names the file).
    """
    import torch  # optional

    if not fileio.isfile(path):
        raise ReleaseError([f"{path}: file not found. Fix: put the release file there (see the layout "
                            f"in `python -m animegamer_jax.commands.convert release --help`)"])
    try:
        obj = torch.load(_cache.local(path), map_location="cpu", mmap=True, weights_only=not ALLOW_PICKLE)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError / pickle errors / EOFError
        msg = one_line(e)
        if "weights_only" in msg or "Unsupported global" in msg:
            # e.g. a DeepSpeed file whose bookkeeping beside 'module' pickles Python objects
            raise ReleaseError([f"{path}: holds pickled Python objects beside the tensors ({msg[:160]}), which "
                                f"the safe loader refuses. Fix: if you trust the file (the release's own), rerun "
                                f"with --allow_pickle"]) from None
        raise ReleaseError([f"{path}: cannot be read as a torch checkpoint ({msg[:200]}); the file "
                            f"is truncated or corrupt. Fix: {FIX_REDOWNLOAD}"]) from None
    for k in ("module", "state_dict"):
        if isinstance(obj, Mapping) and isinstance(obj.get(k), Mapping):
            return dict(obj[k])
    if not isinstance(obj, Mapping):
        raise ReleaseError([f"{path}: holds a {type(obj).__name__}, not a state dict. Fix: {FIX_REDOWNLOAD}"])
    return dict(obj)


def load_folder_lazy(path: str) -> Mapping[str, Any]:
    """An HF folder's weights: ``*.safetensors`` (lazily) or ``pytorch_model*.bin`` (memory-mapped)."""
    st = find_files(path, "*.safetensors")
    if st:
        return LazySafetensors(st)
    bins = find_files(path, "pytorch_model*.bin")
    if not bins:
        raise ReleaseError([f"{path}: no *.safetensors or pytorch_model*.bin. Fix: put the release folder there"])
    out: dict[str, Any] = {}
    for b in bins:
        out.update(load_torch_lazy(b))
    return out


# ----------------------------------------------------------------------------------------------
# Locating the files
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ReleaseFiles:
    """Paths of one character's release files under SRC (None: absent)."""

    src: str
    mllm: str
    engine: str
    vae: str | None
    t5: str | None
    clip: str | None
    mistral: str | None


def _one(src: str, pattern: str, character: str | None, what: str, problems: list[str]) -> str | None:
    hits = find_files(src, pattern)
    if character:
        hits = [h for h in hits if f"-{character}" in h]
    if not hits:
        problems.append(f"{paths.join(src, pattern)}: no {what} found. Fix: put the release's {what} there"
                        + (f" (for character {character!r})" if character else ""))
        return None
    if len(hits) > 1:
        problems.append(f"{paths.join(src, pattern)}: several {what}s {[relative(h, src) for h in hits]}. "
                        f"Fix: choose one with --character NAME")
        return None
    return hits[0]


def locate(src: str, character: str | None = None) -> ReleaseFiles:
    """Finds the release files under ``src``.

    Raises:
      ReleaseError: SRC missing, the MLLM / decoder files missing or ambiguous, a bad ``latest``.
    """
    problems: list[str] = []
    src = absolute(src)
    if not fileio.isdir(src):
        raise ReleaseError([f"{src}: release folder not found. Fix: pass the folder that holds "
                            f"AnimeGamer/, vae/, google/, laion/ (the release's checkpoints/)"])
    mllm = _one(src, MLLM_GLOB, character, "MLLM pytorch_model.bin", problems)
    dec = _one(src, DECODER_GLOB, character, "VDM_Decoder folder", problems)
    engine = None
    if dec:
        latest = paths.join(dec, "latest")
        if not fileio.isfile(latest):
            problems.append(f"{latest}: file not found. Fix: the SAT folder needs `latest` naming the "
                            f"iteration folder (e.g. 10000)")
        else:
            it = paths.as_path(latest).read_text().strip()
            engine = paths.join(dec, it, "mp_rank_00_model_states.pt")
            if not fileio.isfile(engine):
                problems.append(f"{engine}: file not found (named by {latest}). Fix: put the decoder's "
                                f"mp_rank_00_model_states.pt there")
                engine = None
    if problems:
        raise ReleaseError(problems)

    def opt(rel: str) -> str | None:
        p = paths.join(src, rel)
        return p if fileio.exists(p) else None

    return ReleaseFiles(src, mllm, engine, opt(VAE_FILE), opt(T5_DIR), opt(CLIP_FILE), opt(MISTRAL_DIR))


def drop_file_pages(files: list[str]) -> None:
    """Drops the resident pages of this process's private mappings of ``files`` (Linux; a remote
    file's local copy).

    The memory-mapped source files are read once, leaf by leaf; without this their clean file pages
    stay in the process's resident set. Pages are re-read from the file if touched again.
    """
    real = {os.path.realpath(q) for q in (_cache.copies.get(f, f) for f in files if f) if os.path.isfile(q)}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/self/maps", encoding="utf-8") as f:
            lines = f.readlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(maxsplit=5)
        # torch maps checkpoints MAP_PRIVATE (``rw-p``); the converters never write into source
        # tensors, so every page there is a clean file page and dropping it loses nothing
        if len(parts) == 6 and parts[5].strip() in real and parts[1].endswith("p"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4)  # MADV_DONTNEED
