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

import jax

from animegamer_jax import checkpoint, parallel
from animegamer_jax import cli as cli_lib
from animegamer_jax.convert import (animegamer_mllm, check_release, clip, cogvideox_dit, cogvideox_vae, mistral,
                                    release, t5)
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.loading import CheckpointError, load_game_system

def reference_engine(dst: str) -> GameEngine:
    """A :class:`~animegamer_jax.game.engine.GameEngine` on one device playing the system at ``dst``
    in ``reference`` mode (the config saved in the checkpoint, float32 matmuls at highest precision):
    the engine :func:`animegamer_jax.convert.check_release.check_release` takes.

    Raises:
      animegamer_jax.game.loading.CheckpointError: ``dst`` is not a loadable system checkpoint.
    """
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        config = checkpoint.load_config(dst)
    except checkpoint.SystemCheckpointError as e:
        raise CheckpointError(f"{dst}: {e}. Fix: pass the DST written by `convert release`") from None
    config.game.mode = "reference"
    mesh = parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1])
    return GameEngine(config, load_game_system(dst, config, mesh=mesh), mesh=mesh)


def check_release_main(argv: list[str] | None = None) -> int:
    """``python -m animegamer_jax.convert check-release DST CASE.npz`` (convert/check_release.py);
    exit 0 iff all stages hold (1: a stage fails, 2: a bad command line or input)."""
    return cli_lib.run_command("python -m animegamer_jax.convert check-release", argv, lambda fv, argv: None,
                               check_release.__doc__, ("DST", "CASE.npz"), _check_release_report,
                               errors=(FileNotFoundError, CheckpointError))


def _check_release_report(_, dst: str, case: str) -> int:
    """Runs ``check_release`` on :func:`reference_engine` ``(dst)``, printing each stage's line and the
    verdict line; the exit status of :func:`check_release_main`."""
    stages = check_release.check_release(lambda: reference_engine(dst), case, log=print)
    ok = all(s.ok for s in stages)
    name = str(case).rstrip("/").rsplit("/", 1)[-1]
    print(f"{name}: {'all stages hold' if ok else 'FAILED: ' + ', '.join(s.name for s in stages if not s.ok)}")
    return 0 if ok else 1


#: kind -> the ``main(argv)`` that runs it
KINDS = {
    "mistral": mistral.main,
    "animegamer-mllm": animegamer_mllm.main,
    "clip": clip.main,
    "t5": t5.main,
    "dit": cogvideox_dit.main,
    "vae": cogvideox_vae.main,
    "release": release.main,
    "check-release": check_release_main,
}


def main(argv: list[str] | None = None) -> int:
    """Runs ``KINDS[argv[0]](argv[1:])`` (cli_lib.run_subcommand: ``--help`` prints this
    module's docstring, exit status 0; no kind or an unknown one is one ``error:`` line, exit status 2). Returns the exit status."""
    return cli_lib.run_subcommand(argv, KINDS, __doc__)


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
