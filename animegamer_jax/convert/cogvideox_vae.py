"""``python -m animegamer_jax.convert vae SRC DST``: a SAT ``3d-vae.pt`` or diffusers VAE -> orbax.

The key map is :mod:`animegamer_jax.models.cogvideox.vae_convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

from animegamer_jax.convert.common import cli_parser, section_config
from animegamer_jax.models.cogvideox import vae_convert as cv
from animegamer_jax.models.cogvideox.vae import VAEConfig


def main(argv: list[str] | None = None) -> None:
    """CLI: ``SRC DST [--config configs/animegamer_2b_7b.py] [--format auto]``."""
    p = cli_parser("vae", "SAT 3d-vae.pt or diffusers AutoencoderKLCogVideoX -> orbax")
    p.add_argument("src", help="3d-vae.pt, a diffusers vae folder or a .safetensors file")
    p.add_argument("dst", help="output orbax directory")
    p.add_argument("--format", default="auto", choices=("auto", "sat", "diffusers"))
    args = p.parse_args(argv)
    cv.convert(args.src, args.dst, section_config(args, "vae", VAEConfig.from_config), args.format)
    print(f"wrote {args.dst}")


if __name__ == "__main__":
    main()
