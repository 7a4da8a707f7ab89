"""cast_system: a copy of a system checkpoint with chosen components stored in a narrower float dtype."""

from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.checkpoint.errors import SystemCheckpointError
from animegamer_jax.checkpoint.store import (load_config, load_system, pure_dict, read_manifest, save_system,
                                             stored_dtypes)


def cast_system(src: str, dst: str, components: Iterable[str], dtype: str = "bfloat16",
                description: str | None = None) -> str:
    """Copies the system checkpoint ``src`` to the new directory ``dst`` with the float32 arrays of
    ``components`` stored as ``dtype`` (smaller files; ``load_system`` casts them back to each
    module's own dtype, so only the rounding changes). Every other array keeps the dtype it is stored
    with in ``src`` (values and dtypes unchanged). Loads the whole system on this process's first
    device: meant for toy and mid-size systems such as checkpoints/tiny_system. ``description``
    replaces ``src``'s manifest description (``save_system``); None keeps it.

    Returns the absolute ``dst``.

    Raises:
      SystemCheckpointError: ``src`` is damaged or lacks a named component, or ``dst`` exists (a
        user's folder is never overwritten); ValueError: ``dtype`` is not a floating dtype narrower
        than float32 (bfloat16, float16).
    """
    target = jnp.dtype(dtype)
    if not jnp.issubdtype(target, jnp.floating) or target.itemsize >= 4:
        raise ValueError(f"cast dtype {dtype!r}: use a floating dtype narrower than float32 (bfloat16, float16)")
    names = list(components)
    src_manifest = read_manifest(src)
    held = src_manifest["components"]
    missing = [n for n in names if n not in held]
    if missing:
        raise SystemCheckpointError(f"{src} has no component(s) {missing}; it holds {held}")
    if fileio.exists(str(paths.as_path(dst))):
        raise SystemCheckpointError(f"{dst} exists; cast writes a new checkpoint (pick another folder)")
    config = load_config(src)
    out = {}
    for name, module in load_system(src, config).items():
        # load_system casts to the config's dtypes: decide from the dtypes src stores
        stored = stored_dtypes(src, name)
        flat, treedef = jax.tree_util.tree_flatten_with_path(pure_dict(module))
        kinds = [stored.get(jax.tree_util.keystr(p), a.dtype) for p, a in flat]
        leaves = [a.astype(target if name in names and k == jnp.float32 else k) for (_, a), k in zip(flat, kinds)]
        out[name] = jax.tree_util.tree_unflatten(treedef, leaves)
    if description is None:
        description = str(src_manifest.get("description", ""))
    return save_system(dst, out, config, description=description)
