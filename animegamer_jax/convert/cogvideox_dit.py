"""``python -m animegamer_jax.convert dit ...``: a SAT / diffusers DiT -> orbax; ``dit migrate SRC DST``
rewrites a system checkpoint written before the DiT blocks became NNX modules.

The key map and the migration are :mod:`animegamer_jax.models.cogvideox.dit_convert` (beside the
model); this is their CLI (also ``python -m animegamer_jax.convert.cogvideox_dit [migrate] ...``).
"""

from __future__ import annotations

import numpy as np

from animegamer_jax import paths
from animegamer_jax.models.cogvideox import dit_convert as cd
from animegamer_jax.models.cogvideox.dit import DiTConfig


_CLI_DOC = """SAT mp_rank_00_model_states.pt folder or diffusers CogVideoXTransformer3DModel -> orbax.

Usage: python -m animegamer_jax.convert dit SRC DST --kind={sat,diffusers} [--config=F]
       python -m animegamer_jax.convert dit migrate OLD_SYSTEM NEW_SYSTEM

SRC: a SAT checkpoint dir / .pt, or a diffusers dir / .safetensors; DST: output directory (orbax
item `dit` + dit_config.json). The DiT sizes come from the config's `dit` section (default
configs/animegamer_2b_7b.py); extras (text/ip projections, mix LayerNorms) are saved beside the
checkpoint as `dit_extras.npz`. `migrate` rewrites a system checkpoint written before the DiT
blocks became NNX modules (same arrays, new nesting)."""


def _define_flags(fv, argv: list[str]) -> None:
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", paths.resource("configs/animegamer_2b_7b.py"),
                                    "Config whose `dit` section has the sizes; --config.dit.x=v overrides a field.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_enum("kind", None, ["sat", "diffusers"], "Layout of SRC.", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m animegamer_jax.convert dit SRC DST --kind=sat [--config=PY]`` (or ``dit migrate SRC DST``).

    Returns the exit status (2 with a one-line message on a bad command line).
    """
    import sys

    from animegamer_jax import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["migrate"]:
        return _migrate_main(argv[1:])
    return cli.run_command("python -m animegamer_jax.convert dit", argv, _define_flags, _CLI_DOC,
                           ("SRC", "DST"), _convert)


def _convert(f, src: str, dst: str) -> int:
    from animegamer_jax import cli

    if f.kind is None:
        raise cli.UsageError("--kind is required: --kind=sat (SAT engine) or --kind=diffusers")
    cfg = DiTConfig.from_config(f.config.dit)
    extras = cd.convert(f.kind, src, dst, cfg)
    with paths.as_path(paths.join(dst, "dit_extras.npz")).open("wb") as fh:
        np.savez(fh, **extras)
    print(f"wrote {dst}: DiT {cfg.num_layers} layers x {cfg.hidden_size}, extras {sorted(extras)}")
    return 0


def _migrate_main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m animegamer_jax.convert dit migrate SRC DST`` (also ``python -m
    animegamer_jax.convert.cogvideox_dit migrate SRC DST``); returns the exit status."""
    from animegamer_jax import cli, system_checkpoint

    def migrate(_, src: str, dst: str) -> int:
        print(f"wrote {cd.migrate_system_checkpoint(src, dst)}")
        return 0

    return cli.run_command("python -m animegamer_jax.convert dit migrate", argv or [], lambda fv, argv: None,
                           "Rewrites a system checkpoint's DiT into the NNX block layout (SRC, DST: system "
                           "checkpoint folders, local or gs://; DST must not exist).", ("SRC", "DST"), migrate,
                           errors=(cd.ConversionError, system_checkpoint.SystemCheckpointError))


if __name__ == "__main__":
    raise SystemExit(main())
