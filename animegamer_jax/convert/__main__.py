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
                    (``dit migrate OLD NEW``: a system checkpoint of the old DiT block layout)
  vae               SAT 3d-vae.pt or diffusers AutoencoderKLCogVideoX
  release           the whole release download (checkpoints/ folder) -> one system checkpoint
  check-release     play a recorded release turn on a converted system; per-stage max |diff|
"""

import importlib
import sys

KINDS = {
    "mistral": "animegamer_jax.convert.mistral",
    "animegamer-mllm": "animegamer_jax.convert.animegamer_mllm",
    "clip": "animegamer_jax.convert.clip",
    "t5": "animegamer_jax.convert.t5",
    "dit": "animegamer_jax.convert.cogvideox_dit",
    "vae": "animegamer_jax.convert.cogvideox_vae",
    "release": "animegamer_jax.convert.release",
    "check-release": "animegamer_jax.convert.check_release",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in KINDS:
        print(__doc__, file=sys.stderr)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown kind {argv[0]!r}; choose one of {', '.join(KINDS)}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    rc = importlib.import_module(KINDS[argv[0]]).main(argv[1:])
    return rc if isinstance(rc, int) else 0


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
