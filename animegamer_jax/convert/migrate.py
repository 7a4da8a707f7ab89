"""System checkpoints written before the DiT blocks became NNX modules -> the current layout
(``python -m animegamer_jax.commands.convert dit migrate OLD NEW`` runs :func:`migrate_system_checkpoint`).

The block migration itself (same arrays, new nesting) is
:func:`animegamer_jax.models.cogvideox.dit_convert.migrate_legacy_blocks`, beside the model.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from animegamer_jax import checkpoint, parallel

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.models.cogvideox import dit_convert
from animegamer_jax.weights import ConversionError


def migrate_system_checkpoint(src: str, dst: str) -> str:
    """Rewrites a system checkpoint whose `dit` has the flat legacy block layout into `dst` (NNX nesting).

    Every other component, the config and all arrays are copied unchanged (`save_system`); `src` is
    verified in full first when it has an integrity.json. `dst` must not exist. Returns the absolute
    `dst`.

    Raises:
      ConversionError: `src` has no `dit`, or its `dit` is already in the NNX module layout.
      SystemCheckpointError: `src` is not a system checkpoint, or a file of it is damaged.
    """
    src, dst = str(paths.as_path(src)), str(paths.as_path(dst))
    manifest = checkpoint.read_manifest(src)
    if fileio.exists(paths.join(src, checkpoint.INTEGRITY_FILE)):
        checkpoint.verify_checkpoint(src, "full")  # migrate only what is intact
    if "dit" not in manifest["components"]:
        raise ConversionError(f"{src} has no `dit` component to migrate")
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
        dit = ckptr.restore(paths.join(src, "dit"))
    dit = jax.tree.map(np.asarray, dit)
    if not dit_convert.is_legacy_blocks(dit["blocks"]):
        raise ConversionError(f"{src}: the `dit` blocks are already in the NNX module layout")
    dit["blocks"] = dit_convert.migrate_legacy_blocks(dit["blocks"])
    config = checkpoint.load_config(src)
    others = [n for n in manifest["components"] if n != "dit"]
    comps: dict[str, Any] = dict(checkpoint.load_system(src, config, names=others, verify=None)) if others else {}
    graphdef, target, _ = checkpoint.abstract_component(
        "dit", config, parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1]))
    state = nnx.State(target)
    state.replace_by_pure_dict(jax.tree.map(jnp.asarray, dit))
    comps["dit"] = nnx.merge(graphdef, state)
    return checkpoint.save_system(dst, {n: comps[n] for n in manifest["components"]}, config)
