"""``python -m animegamer_jax.convert t5 SRC OUT``: an HF T5 encoder -> orbax.

The key map is :mod:`animegamer_jax.models.t5.convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from animegamer_jax import cli, paths
from animegamer_jax.models.t5 import convert as t5_convert
from animegamer_jax.models.t5.model import T5Config

_CLI_DOC = """HF T5EncoderModel safetensors -> orbax.

SRC: HF T5 safetensors / ``.bin`` file or folder (``google/t5-v1_1-xxl``); OUT: orbax directory,
local or gs://. Sizes from ``--hf_config`` (an HF config.json) if given, else the config's ``t5``."""


def _define_flags(fv, argv: list[str]) -> None:
    config_flags.DEFINE_config_file("config", paths.resource("configs/animegamer_2b_7b.py"),
                                    "Config whose `t5` section has the sizes (ignored with --hf_config); "
                                    "--config.t5.x=v overrides a field.", flag_values=fv, lock_config=False,
                                    sys_argv=argv)
    flags.DEFINE_string("hf_config", "", "An HF T5 config.json (its sizes win over --config).", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """``python -m animegamer_jax.convert t5 SRC OUT [--hf_config=config.json | --config=F]``.

    Returns the exit status (2 with a one-line message on a bad command line).
    """
    return cli.run_command("python -m animegamer_jax.convert t5", argv, _define_flags, _CLI_DOC,
                           ("SRC", "OUT"), _convert)


def _convert(f, src: str, out: str) -> int:
    if f.hf_config:
        cfg = t5_convert.config_from_hf(json.loads(paths.as_path(f.hf_config).read_text()))
    else:
        cfg = T5Config.from_config(f.config.t5)
    t5_convert.convert_file(src, cfg, out)
    print(f"wrote {paths.as_path(out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
