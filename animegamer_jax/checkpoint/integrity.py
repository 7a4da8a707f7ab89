"""``integrity.json``: the size and sha256 of every file of a system checkpoint, and the check of them.

orbax (0.12.8, pinned in pyproject.toml) stores no checksum of the array data (its default zarr2 /
OCDBT files carry none; only the opt-in zarr3 layout checksums the shard index, crc32c), so a
truncated file would show up as a raw TensorStore error and overwritten bytes would load silently.
:func:`write_integrity` runs after orbax commits (``save_system``, ``SystemWriter.finish``);
:func:`verify_checkpoint` runs before every load:

- ``"fast"``: every file present with its size; files up to :data:`FULL_HASH_BELOW` bytes fully
  hashed, larger ones by :data:`SAMPLE_BLOCKS` evenly spaced blocks of :data:`SAMPLE_BLOCK` bytes
  (``fileio.sha256_sampled``);
- ``"full"``: the sha256 of every byte.

Any missing, truncated or damaged file gives one :class:`CheckpointIntegrityError` line naming the
file and the fix. Training checkpoints (checkpoint/training.py) carry the same record in every step
folder, written inside orbax's commit, and are checked with :func:`verify_checkpoint` before a resume.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.checkpoint.errors import CLI, CheckpointIntegrityError, fix_hint

INTEGRITY_FILE = "integrity.json"
#: files up to this size are fully hashed even by the fast check (bytes)
FULL_HASH_BELOW = 8 << 20
#: the fast check of a larger file hashes this many evenly spaced blocks (first and last included) ...
SAMPLE_BLOCKS = 16
#: ... of this many bytes each
SAMPLE_BLOCK = 64 << 10


def integrity_manifest(directory: str, skip: Collection[str] = ()) -> dict:
    """Sizes and hashes of every file under ``directory`` (what ``integrity.json`` holds).

    ``{"format": 1, "sample": {...}, "files": {relpath: {"size", "sha256"[, "sampled_sha256"]}}}``;
    ``sampled_sha256`` (fileio.sha256_sampled) only for files over :data:`FULL_HASH_BELOW` bytes.
    Each file is read once, in chunks (streamed). ``skip``: relative paths left out (files that are
    still rewritten after the record, e.g. orbax's ``_CHECKPOINT_METADATA`` of a training step).
    """
    files = {}
    for rel in fileio.walk_files(directory):
        if rel == INTEGRITY_FILE or rel in skip:
            continue
        path = paths.join(directory, rel)
        n = fileio.size(path)
        entry = {"size": n, "sha256": fileio.sha256_file(path)}
        if n > FULL_HASH_BELOW:
            entry["sampled_sha256"] = fileio.sha256_sampled(path, n, SAMPLE_BLOCK, SAMPLE_BLOCKS)
        files[rel] = entry
    return {"format": 1, "sample": {"full_hash_below": FULL_HASH_BELOW, "blocks": SAMPLE_BLOCKS,
                                    "block": SAMPLE_BLOCK}, "files": files}


def write_integrity(directory: str, skip: Collection[str] = ()) -> str:
    """Writes ``directory/integrity.json`` for the files there now but ``skip`` (atomic); returns its path."""
    path = paths.join(directory, INTEGRITY_FILE)
    fileio.write_text_atomic(path, json.dumps(integrity_manifest(directory, skip), indent=1, sort_keys=True) + "\n")
    return path


def read_integrity(directory: str, fix: str | None = None) -> dict:
    """The parsed ``integrity.json`` of ``directory``.

    ``fix``: the sentence a damaged manifest's message ends with (None: :func:`errors.fix_hint`'s).

    Raises:
      CheckpointIntegrityError: the file is absent, or is not a manifest of sizes and hashes.
    """
    path = paths.join(directory, INTEGRITY_FILE)
    if not fileio.isfile(path):
        raise CheckpointIntegrityError(
            f"{directory}: no {INTEGRITY_FILE}, so its files cannot be checked (saved by an older version, "
            f"copied without it, or the save did not finish). Fix: re-save it with save_system; if you "
            f"trust it, write one with `{CLI} manifest {directory}`")
    try:
        man = json.loads(fileio.read_bytes(path).decode("utf-8"))
        files = man["files"]
        for v in files.values():
            int(v["size"]), str(v["sha256"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointIntegrityError(
            _with_fix(f"{path} is damaged ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else 'bad content'}).", directory, fix)) from None
    return man


#: (directory, mode, stamp) of every check passed by this process: an unchanged checkpoint is not re-hashed
_VERIFIED: set[tuple[str, str, str]] = set()


def verify_checkpoint(directory: str, mode: str = "fast", fix: str | None = None) -> dict:
    """Checks every file of a system checkpoint against its ``integrity.json``; returns the latter.

    A check this process already passed is not repeated while the manifest and every listed file's
    size and mtime are unchanged (play reads the config, then loads: one check).

    Args:
      mode: ``"fast"`` (sizes; full sha256 of files up to :data:`FULL_HASH_BELOW` bytes, sampled
        blocks of larger ones) or ``"full"`` (sha256 of every byte).
      fix: the sentence each message ends with (None: :func:`errors.fix_hint`'s, for a system
        checkpoint; "" for none: a caller that words its own).

    Raises:
      CheckpointIntegrityError: no or damaged ``integrity.json``, or a file missing, of another
        size or with another hash (one line naming the file and the fix).
      ValueError: unknown ``mode``.
    """
    if mode not in ("fast", "full"):
        raise ValueError(f"verify mode must be 'fast' or 'full', got {mode!r}")
    directory = str(paths.as_path(directory))
    man = read_integrity(directory, fix)
    key = (directory, mode, _stamp(directory, man))
    if key in _VERIFIED:
        return man
    sample = man.get("sample", {})
    for rel, want in sorted(man["files"].items()):
        path = paths.join(directory, rel)
        if not fileio.isfile(path):
            raise CheckpointIntegrityError(_with_fix(f"{directory}: file {rel} is missing (the checkpoint is "
                                                     f"incomplete).", directory, fix))
        n = fileio.size(path)
        if n != want["size"]:
            what = "truncated" if n < want["size"] else "longer than saved"
            raise CheckpointIntegrityError(_with_fix(f"{directory}: file {rel} is {what} ({n} bytes, "
                                                     f"{want['size']} when saved).", directory, fix))
        if mode == "fast" and "sampled_sha256" in want:
            got = fileio.sha256_sampled(path, n, int(sample.get("block", SAMPLE_BLOCK)),
                                        int(sample.get("blocks", SAMPLE_BLOCKS)))
            ok = got == want["sampled_sha256"]
        else:
            ok = fileio.sha256_file(path) == want["sha256"]
        if not ok:
            raise CheckpointIntegrityError(_with_fix(f"{directory}: file {rel} is damaged (its sha256 differs "
                                                     f"from the one saved in {INTEGRITY_FILE}).", directory, fix))
    if mode == "full":
        _VERIFIED.add((directory, "fast", key[2]))
    _VERIFIED.add(key)
    return man


def _with_fix(message: str, directory: str, fix: str | None) -> str:
    """``message`` and the fix sentence (``fix``; None: :func:`errors.fix_hint`'s; "": none)."""
    fix = fix_hint(directory) if fix is None else fix
    return f"{message} {fix}" if fix else message


def _stamp(directory: str, man: dict) -> str:
    """The manifest plus every listed file's size and mtime: changes when any of them changes."""
    stats = []
    for rel in sorted(man["files"]):
        try:
            stats.append((rel, *fileio.stamp(paths.join(directory, rel))))
        except OSError:
            stats.append((rel, -1, -1))
    return json.dumps([man, stats], sort_keys=True)


def checkpoint_identity(directory: str) -> str:
    """``"sha256:<hex>"`` of a checkpoint's ``integrity.json``: names its exact content (output fingerprints).

    Raises:
      CheckpointIntegrityError: no ``integrity.json``.
    """
    directory = str(paths.as_path(directory))
    read_integrity(directory)
    return "sha256:" + fileio.sha256_file(paths.join(directory, INTEGRITY_FILE))
