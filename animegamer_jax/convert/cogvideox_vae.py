"""``python -m animegamer_jax.convert vae SRC DST``: a SAT ``3d-vae.pt`` or diffusers VAE -> orbax.

The key map is :mod:`animegamer_jax.models.cogvideox.vae_convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from animegamer_jax import cli, paths
from animegamer_jax.models.cogvideox import vae_convert
from animegamer_jax.models.cogvideox.vae import VAEConfig

_CLI_DOC = """SAT 3d-vae.pt or diffusers AutoencoderKLCogVideoX -> orbax.

SRC: 3d-vae.pt, a diffusers vae folder or a .safetensors file; DST: output orbax directory. The
model's sizes come from the config's ``vae`` section (default configs/animegamer_2b_7b.py)."""


def _define_flags(fv, argv: list[str]) -> None:
    config_flags.DEFINE_config_file("config", paths.resource("configs/animegamer_2b_7b.py"),
                                    "Config whose `vae` section has the sizes; "
                                    "--config.vae.x=v overrides a field.", flag_values=fv, lock_config=False,
                                    sys_argv=argv)
    flags.DEFINE_enum("format", "auto", ["auto", "sat", "diffusers"], "Layout of SRC (auto: detected).",
                      flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m animegamer_jax.convert vae SRC DST [--config=configs/animegamer_2b_7b.py] [--format=auto]``.

    Returns the exit status (2 with a one-line message on a bad command line).
    """
    return cli.run_command("python -m animegamer_jax.convert vae", argv, _define_flags, _CLI_DOC,
                           ("SRC", "DST"), _convert)


def _convert(f, src: str, dst: str) -> int:
    vae_convert.convert(src, dst, VAEConfig.from_config(f.config.vae), f.format)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
