"""System checkpoints for tests: a shipped checkpoint copied without some of its components."""

import json
import os
import shutil

from animegamer_jax import checkpoint


def system_without(src: str, dst: str, names: tuple[str, ...]) -> str:
    """A copy of the system checkpoint ``src`` at ``dst`` without the components ``names`` (their
    folders, manifest entries and orbax handlers dropped; integrity.json rewritten); returns ``dst``."""
    shutil.copytree(src, dst, ignore=lambda d, entries: [e for e in entries
                                                         if os.path.samefile(d, src) and e in names])
    man_path = os.path.join(dst, "manifest", "metadata")
    man = json.load(open(man_path))
    man["components"] = [c for c in man["components"] if c not in names]
    man["param_counts"] = {k: v for k, v in man["param_counts"].items() if k not in names}
    meta_path = os.path.join(dst, "_CHECKPOINT_METADATA")
    meta = json.load(open(meta_path))
    meta["item_handlers"] = {k: v for k, v in meta["item_handlers"].items() if k not in names}
    for path, payload in ((man_path, man), (meta_path, meta)):
        with open(path, "w") as f:
            json.dump(payload, f)
    checkpoint.write_integrity(dst)
    return dst
