"""``python -m animegamer_jax.convert clip SRC OUT``: an open_clip / HF CLIP state dict -> orbax.

The key map is :mod:`animegamer_jax.models.clip.convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from animegamer_jax import cli, paths
from animegamer_jax.models.clip import convert as clip_convert
from animegamer_jax.models.clip.model import CLIPConfig
from animegamer_jax.weights import load_state_dict, save_state

_CLI_DOC = """open_clip ViT-B-16 state dict or an HF CLIP folder -> orbax.

SRC: open_clip ``.bin`` / ``.pt`` or HF ``.safetensors`` (file or folder); sizes and the activation
come from ``--hf_config`` (an HF ``config.json``) if given, else from the config file's ``clip``
section. OUT: orbax directory, local or gs://."""


def _define_flags(fv, argv: list[str]) -> None:
    config_flags.DEFINE_config_file("config", paths.resource("configs/animegamer_2b_7b.py"),
                                    "Config whose `clip` section has the sizes (ignored with --hf_config); "
                                    "--config.clip.x=v overrides a field.", flag_values=fv, lock_config=False,
                                    sys_argv=argv)
    flags.DEFINE_string("hf_config", "", "An HF CLIP config.json (its sizes win over --config).", flag_values=fv)
    flags.DEFINE_enum("layout", "auto", ["auto", "open_clip", "hf"], "Key names of SRC (auto: detected).",
                      flag_values=fv)
    flags.DEFINE_bool("text_tower", True, "Convert the text tower too (--notext_tower: the vision tower only, "
                      "what the game system uses).", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """``python -m animegamer_jax.convert clip SRC OUT [--config=F] [--notext_tower] [--layout=L]``.

    Returns the exit status (2 with a one-line message on a bad command line).
    """
    return cli.run_command("python -m animegamer_jax.convert clip", argv, _define_flags, _CLI_DOC,
                           ("SRC", "OUT"), _convert)


def _convert(f, src: str, out: str) -> int:
    if f.hf_config:
        cfg = clip_convert.config_from_hf(json.loads(paths.as_path(f.hf_config).read_text()))
    else:
        cfg = CLIPConfig.from_config(f.config.clip)
    vision_only = not f.text_tower
    save_state(clip_convert.convert_clip(load_state_dict(src), cfg, vision_only=vision_only, layout=f.layout), out)
    print(f"wrote {paths.as_path(out)} ({'vision tower' if vision_only else 'full CLIP'}, act {cfg.hidden_act})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
