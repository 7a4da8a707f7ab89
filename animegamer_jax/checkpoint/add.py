"""add_components: a copy of a system checkpoint with components taken from another one.

The files are copied, not re-saved: every file of the base system (its components' arrays, their
orbax metadata) and of the added components keeps its bytes, so the base's stored dtypes (e.g. a
bfloat16 MLLM) and values are exactly as they were. Only the small records are rewritten: the
manifest, the config, orbax's ``_CHECKPOINT_METADATA`` and, last, ``integrity.json``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.checkpoint.errors import SystemCheckpointError
from animegamer_jax.checkpoint.integrity import INTEGRITY_FILE, verify_checkpoint, write_integrity
from animegamer_jax.checkpoint.store import read_json, read_manifest

#: files rewritten rather than copied from the base
_RECORDS = ("manifest/metadata", "config/metadata", "_CHECKPOINT_METADATA", INTEGRITY_FILE)
#: config sections never taken from the source: its training settings describe the run that made it
_RUN_SECTIONS = ("train",)


def merged_config(base: Mapping[str, Any], src: Mapping[str, Any]) -> tuple[dict, list[str]]:
    """``base``'s config JSON plus every key ``src``'s has and ``base``'s lacks (the added components'
    settings, e.g. ``dit.reference_lora_rank``), outside :data:`_RUN_SECTIONS`; ``base``'s values and
    key order are kept. Returns the merged JSON and the added keys, dotted, in order."""
    added: list[str] = []

    def walk(b: Mapping, s: Mapping, prefix: str) -> dict:
        out = dict(b)
        for k, v in s.items():
            key = f"{prefix}{k}"
            if not prefix and k in _RUN_SECTIONS:
                continue
            if k not in b:
                out[k] = v
                added.append(key)
            elif isinstance(v, Mapping) and isinstance(b[k], Mapping):
                out[k] = walk(b[k], v, key + ".")
        return out

    return walk(base, src, ""), added


def add_components(base: str, src: str, dst: str, components: Iterable[str],
                   description: str | None = None, *, replace: bool = False,
                   manifest_extra: Mapping[str, Any] | None = None) -> tuple[str, list[str]]:
    """Writes the new checkpoint ``dst``: ``base`` plus the ``components`` of ``src``.

    Both are checked first (integrity.json, fast check). Every file of ``base`` and of ``src``'s
    ``components`` is copied byte for byte; the manifest lists ``base``'s components and the added
    ones (with ``src``'s parameter counts); the config is :func:`merged_config`; ``description``
    replaces ``base``'s manifest description (None keeps it, "" drops it). With ``replace`` a component
    ``base`` already holds is taken from ``src`` instead (``base``'s files of it are not copied);
    ``manifest_extra`` entries are set in the manifest (e.g. ``characters``). A local ``dst`` is written
    in a temporary sibling folder and renamed into place; a URL is written in place, integrity.json last
    (``store.is_complete``).

    Returns ``(absolute dst, added config keys)``.

    Raises:
      SystemCheckpointError: no component named, a component absent from ``src`` or already in
        ``base``, or ``dst`` exists (a user's folder is never overwritten);
      CheckpointIntegrityError: ``base`` or ``src`` is damaged.
    """
    names = list(components)
    if not names:
        raise SystemCheckpointError("add: name the component(s) to add (--components=reference)")
    base, src, dst = (str(paths.as_path(d)) for d in (base, src, dst))
    verify_checkpoint(base, "fast")
    verify_checkpoint(src, "fast")
    base_man, src_man = read_manifest(base), read_manifest(src)
    missing = [n for n in names if n not in src_man["components"]]
    if missing:
        raise SystemCheckpointError(f"{src} has no component(s) {missing}; it holds {src_man['components']}")
    held = [n for n in names if n in base_man["components"]]
    if held and not replace:
        raise SystemCheckpointError(f"{base} already holds {held}; add only components it lacks")
    if fileio.exists(dst):
        raise SystemCheckpointError(f"{dst} exists; add writes a new checkpoint (pick another folder)")
    config, added = merged_config(read_json(base, "config", "the saved config") or {},
                                  read_json(src, "config", "the saved config") or {})
    manifest = dict(base_man)
    manifest["components"] = sorted(set(base_man["components"]) | set(names))
    manifest["param_counts"] = {**base_man.get("param_counts", {}),
                                **{n: src_man.get("param_counts", {}).get(n) for n in names}}
    if description is not None:
        manifest.pop("description", None)
        if description:
            manifest["description"] = str(description)
    manifest.update(manifest_extra or {})
    meta = json.loads(fileio.read_bytes(paths.join(base, "_CHECKPOINT_METADATA")).decode("utf-8"))
    src_meta = json.loads(fileio.read_bytes(paths.join(src, "_CHECKPOINT_METADATA")).decode("utf-8"))
    handlers = dict(meta.get("item_handlers", {}))
    for n in names:
        handlers[n] = src_meta["item_handlers"][n]
    meta["item_handlers"] = dict(sorted(handlers.items()))

    url = paths.is_url(dst)
    work = dst if url else paths.join(str(paths.as_path(dst).parent), f".{paths.as_path(dst).name}.tmp-"
                                      f"{uuid.uuid4().hex[:8]}")
    try:
        copies = [(base, rel) for rel in fileio.walk_files(base)
                  if rel not in _RECORDS and rel.split("/", 1)[0] not in names]
        copies += [(src, rel) for rel in fileio.walk_files(src) if rel.split("/", 1)[0] in names]
        for root, rel in copies:
            fileio.makedirs(str(paths.as_path(paths.join(work, rel)).parent))
            fileio.write_bytes_atomic(paths.join(work, rel), fileio.read_bytes(paths.join(root, rel)))
        for rel, payload in (("config/metadata", config), ("manifest/metadata", manifest),
                             ("_CHECKPOINT_METADATA", meta)):
            fileio.write_text_atomic(paths.join(work, rel), json.dumps(payload))
        write_integrity(work)  # last: marks the checkpoint complete
        if not url:
            fileio.rename(work, dst)
    except BaseException:
        if not url and fileio.exists(work):
            fileio.rmtree(work)
        raise
    return dst, added
