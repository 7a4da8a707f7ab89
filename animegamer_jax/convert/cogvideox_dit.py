"""``python -m animegamer_jax.convert dit ...``: a SAT / diffusers DiT -> orbax; ``dit migrate SRC DST``
rewrites a system checkpoint whose DiT blocks are stored in the flat legacy layout.

The key map and the block migration are :mod:`animegamer_jax.models.cogvideox.dit_convert` (beside
the model); this is their CLI (also ``python -m animegamer_jax.convert.cogvideox_dit [migrate] ...``)
and :func:`migrate_system_checkpoint`, which applies the migration to a whole system checkpoint.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import flags
from flax import nnx
from ml_collections import config_flags

from animegamer_jax import checkpoint, cli, fileio, parallel, paths
from animegamer_jax.models.cogvideox import dit_convert
from animegamer_jax.models.cogvideox.dit import DiTConfig
from animegamer_jax.weights import ConversionError

_CLI_DOC = """SAT mp_rank_00_model_states.pt folder or diffusers CogVideoXTransformer3DModel -> orbax.

Usage: python -m animegamer_jax.convert dit SRC DST --kind={sat,diffusers} [--config=F]
       python -m animegamer_jax.convert dit migrate OLD_SYSTEM NEW_SYSTEM

SRC: a SAT checkpoint dir / .pt, or a diffusers dir / .safetensors; DST: output directory (orbax
item `dit` + dit_config.json). The DiT sizes come from the config's `dit` section (default
configs/animegamer_2b_7b.py); extras (text/ip projections, mix LayerNorms) are saved beside the
checkpoint as `dit_extras.npz`. `migrate` rewrites a system checkpoint whose DiT blocks are stored
in the flat legacy layout into the NNX module layout (same arrays, new nesting)."""

_MIGRATE_DOC = ("Rewrites a system checkpoint's DiT into the NNX block layout (SRC, DST: system checkpoint "
                "folders, local or gs://; DST must not exist).")


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


def _define_flags(fv, argv: list[str]) -> None:
    config_flags.DEFINE_config_file("config", paths.resource("configs/animegamer_2b_7b.py"),
                                    "Config whose `dit` section has the sizes; --config.dit.x=v overrides a field.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_enum("kind", None, ["sat", "diffusers"], "Layout of SRC.", flag_values=fv)


def _no_flags(fv, argv: list[str]) -> None:
    """``dit migrate`` has no flags."""


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m animegamer_jax.convert dit SRC DST --kind=sat [--config=PY]`` (or ``dit migrate SRC DST``).

    Returns the exit status (2 with a one-line message on a bad command line).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["migrate"]:
        return cli.run_command("python -m animegamer_jax.convert dit migrate", argv[1:], _no_flags, _MIGRATE_DOC,
                               ("SRC", "DST"), _migrate,
                               errors=(ConversionError, checkpoint.SystemCheckpointError))
    return cli.run_command("python -m animegamer_jax.convert dit", argv, _define_flags, _CLI_DOC,
                           ("SRC", "DST"), _convert)


def _convert(f, src: str, dst: str) -> int:
    if f.kind is None:
        raise cli.UsageError("--kind is required: --kind=sat (SAT engine) or --kind=diffusers")
    cfg = DiTConfig.from_config(f.config.dit)
    extras = dit_convert.convert(f.kind, src, dst, cfg)
    with paths.as_path(paths.join(dst, "dit_extras.npz")).open("wb") as fh:
        np.savez(fh, **extras)
    print(f"wrote {dst}: DiT {cfg.num_layers} layers x {cfg.hidden_size}, extras {sorted(extras)}")
    return 0


def _migrate(_, src: str, dst: str) -> int:
    print(f"wrote {migrate_system_checkpoint(src, dst)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
