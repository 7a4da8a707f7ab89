"""``python -m animegamer_jax.convert <kind> SRC DST [flags]``: outside checkpoints -> our orbax layout.

Every kind takes absl flags after (or between) its positional paths, and a config file where the
sizes come from one: ``--config=configs/release_tiny.py --config.dit.num_layers=2`` (without
``--config`` the overrides apply to configs/animegamer_2b_7b.py). SRC and DST may be URLs.

Kinds (each takes ``--help``):
  mistral           HF Mistral folder (sharded safetensors + index, or pytorch_model.bin)
  animegamer-mllm   the release MLLM pytorch_model.bin (peft names; LoRA kept or merged)
  clip              open_clip ViT-B-16 state dict or an HF CLIP folder
  t5                HF T5EncoderModel safetensors
  dit               SAT mp_rank_00_model_states.pt folder or diffusers CogVideoXTransformer3DModel
                    (``dit migrate OLD NEW``: a system checkpoint of the flat legacy DiT block layout)
  vae               SAT 3d-vae.pt or diffusers AutoencoderKLCogVideoX
  release           the whole release download (checkpoints/ folder) -> one system checkpoint
  check-release     play a recorded release turn on a converted system; per-stage max |diff|
"""

import sys

from animegamer_jax import cli as cli_lib
from animegamer_jax.convert import (animegamer_mllm, check_release, clip, cogvideox_dit, cogvideox_vae, mistral,
                                    release, t5)

#: kind -> the module whose ``main(argv)`` runs it
KINDS = {
    "mistral": mistral,
    "animegamer-mllm": animegamer_mllm,
    "clip": clip,
    "t5": t5,
    "dit": cogvideox_dit,
    "vae": cogvideox_vae,
    "release": release,
    "check-release": check_release,
}


def main(argv: list[str] | None = None) -> int:
    """Runs ``KINDS[argv[0]].main(argv[1:])`` (cli_lib.run_subcommand: ``--help`` prints this
    module's docstring, exit status 0; no kind or an unknown one is one ``error:`` line, exit status 2). Returns the exit status."""
    return cli_lib.run_subcommand(argv, {kind: module.main for kind, module in KINDS.items()}, __doc__)


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
