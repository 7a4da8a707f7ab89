"""``python -m animegamer_jax.convert dit ...``: a SAT / diffusers DiT -> orbax; ``dit migrate SRC DST``
rewrites a system checkpoint written before the DiT blocks became NNX modules.

The key map and the migration are :mod:`animegamer_jax.models.cogvideox.dit_convert` (beside the
model); this is their CLI (also ``python -m animegamer_jax.convert.cogvideox_dit [migrate] ...``).
"""

from __future__ import annotations

import sys

import numpy as np

from animegamer_jax import paths
from animegamer_jax.convert.common import cli_parser, section_config
from animegamer_jax.models.cogvideox import dit_convert as cd
from animegamer_jax.models.cogvideox.dit import DiTConfig


def main(argv: list[str] | None = None) -> None:
    """CLI: ``--kind sat --src DIR --dst DIR [--config PY]``, or ``migrate SRC DST``.

    The DiT sizes come from the config's `dit` section (default configs/animegamer_2b_7b.py); extras
    (text/ip projections, mix LayerNorms) are saved beside the checkpoint as `dit_extras.npz`.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["migrate"]:
        return _migrate_main(argv[1:])
    ap = cli_parser("dit", main.__doc__)
    ap.add_argument("--kind", choices=("sat", "diffusers"), required=True)
    ap.add_argument("--src", required=True, help="SAT checkpoint dir / .pt, or diffusers dir / .safetensors")
    ap.add_argument("--dst", required=True, help="output directory (orbax item `dit` + dit_config.json)")
    args = ap.parse_args(argv)
    cfg = section_config(args, "dit", DiTConfig.from_config)
    extras = cd.convert(args.kind, args.src, args.dst, cfg)
    with paths.as_path(paths.join(args.dst, "dit_extras.npz")).open("wb") as f:
        np.savez(f, **extras)
    print(f"wrote {args.dst}: DiT {cfg.num_layers} layers x {cfg.hidden_size}, extras {sorted(extras)}")


def _migrate_main(argv: list[str]) -> None:
    """CLI: ``migrate SRC DST``."""
    ap = cli_parser("dit migrate", "migrate a system checkpoint's DiT to the NNX block layout", config=False)
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args(argv)
    print(f"wrote {cd.migrate_system_checkpoint(a.src, a.dst)}")


if __name__ == "__main__":
    main()
