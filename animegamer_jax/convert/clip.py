"""``python -m animegamer_jax.convert clip SRC OUT``: an open_clip / HF CLIP state dict -> orbax.

The key map is :mod:`animegamer_jax.models.clip.convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

from animegamer_jax import paths
from animegamer_jax.convert.common import cli_parser, load_state_dict, save_state, section_config
from animegamer_jax.models.clip import convert as cc
from animegamer_jax.models.clip.model import CLIPConfig


def main(argv: list[str] | None = None) -> None:
    """CLI: ``SRC OUT [--config F | --hf_config config.json] [--vision_only] [--layout L]``.

    SRC: open_clip ``.bin`` / ``.pt`` or HF ``.safetensors`` (file or folder); sizes and the
    activation come from ``--hf_config`` (an HF ``config.json``) if given, else from the config
    file's ``clip`` section. OUT: orbax directory.
    """
    p = cli_parser("clip", main.__doc__)
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--hf_config", default="")
    p.add_argument("--layout", default="auto", choices=["auto", "open_clip", "hf"])
    p.add_argument("--vision_only", action="store_true")
    a = p.parse_args(argv)
    cfg = section_config(a, "clip", CLIPConfig.from_config, cc.config_from_hf)
    save_state(cc.convert_clip(load_state_dict(a.src), cfg, vision_only=a.vision_only, layout=a.layout), a.out)
    print(f"wrote {paths.as_path(a.out)} ({'vision tower' if a.vision_only else 'full CLIP'}, act {cfg.hidden_act})")


if __name__ == "__main__":
    main()
