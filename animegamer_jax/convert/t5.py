"""``python -m animegamer_jax.convert t5 SRC OUT``: an HF T5 encoder -> orbax.

The key map is :mod:`animegamer_jax.models.t5.convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

from animegamer_jax import paths
from animegamer_jax.convert.common import cli_parser, section_config
from animegamer_jax.models.t5 import convert as ct
from animegamer_jax.models.t5.model import T5Config


def main(argv: list[str] | None = None) -> None:
    """CLI: ``SRC OUT [--hf_config config.json | --config F]``.

    SRC: HF T5 safetensors / ``.bin`` file or folder (``google/t5-v1_1-xxl``); OUT: orbax directory.
    """
    p = cli_parser("t5", main.__doc__)
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--hf_config", default="")
    a = p.parse_args(argv)
    ct.convert_file(a.src, section_config(a, "t5", T5Config.from_config, ct.config_from_hf), a.out)
    print(f"wrote {paths.as_path(a.out)}")


if __name__ == "__main__":
    main()
