"""The tiny system trained on the toy world (data/toy_world.py): named sprite characters, so a held-out
character can be played from its reference image (phase r; docs/training.md "Train the toy world").

configs/tiny.py's model sizes and 64x96 clips; the data are the toy world's training films (the
K - M seen characters only: the held-out characters' films are in another folder that no phase
reads). The pipeline starts from checkpoints/tiny_system (T5 and CLIP frozen), fine-tunes its VAE on
the toy clips and trains a1 -> a2 -> b -> c -> r.

Use (generates and prepares the data, then trains; rerunning resumes):
  make toy-world   # = python -m animegamer_jax.commands.train toy-world --workdir=outputs/toy_world
Cost: about 2 h of steps on 2 idle CPU cores (a2 is most of it), longer on a shared host.
"""

import ml_collections

from configs import tiny


def get_config() -> ml_collections.ConfigDict:
    """Returns the toy-world configuration (tiny sizes, toy-world data, a1 -> a2 -> b -> c -> r)."""
    c = tiny.get_config()
    c.name = "toy_world"
    # prepared as docs/data.md#the-toy-world prepares them (2 s clips every 1 s)
    c.data.dataset_dir = "data/prepared/toy_train"  # the seen characters' films
    c.data.clip_stride_seconds = 1.0
    c.eval.heldout_dataset_dir = "data/prepared/toy_heldout"  # the held-out characters' films (eval only)
    c.eval.toy_world_dir = "data/prepared/toy"  # the generator's folder: characters/<Name>/reference.png

    # T5 and CLIP come from the shipped tiny system and stay frozen. Its VAE reconstructs the toy clips
    # at 18.2 dB (17-frame clips; 22.6 on the sample film's), the checkered and striped backgrounds
    # worst, so phase "vae" first fine-tunes it on the toy clips at 64x96 (single frames, then single
    # frames and 9-frame clips interleaved); a1 -> a2 -> b -> c then train on its latents (a2 the
    # whole DiT, from the tiny system's) and r the reference adapter.
    c.train.init_checkpoint = "checkpoints/tiny_system"
    c.train.pipeline = ("vae", "a1", "a2", "b", "c", "r")
    # steps: vae ~2, a2 ~5, b ~4, c ~3, r ~4 steps/s on 2 idle cores: about 2 h in all
    c.train.pipeline_steps = (1500, 300, 12000, 6000, 1000, 5000)
    c.train.pipeline_learning_rates = (2e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3)
    c.train.vae_curriculum = ((0, 1, 64, 96),) + tuple(
        st for s in range(300, 1500, 100) for st in ((s, 1, 64, 96), (s + 30, 9, 64, 96)))
    c.train.vae_dataset_dir = ""  # the toy clips themselves (data.dataset_dir), at the model's size
    c.train.vae_eval_dataset_dir = ""
    c.train.vae_max_crop_scale = 1.0
    c.train.checkpoint_every = 500
    c.train.keep_checkpoints = 2
    c.train.log_every = 50

    c.game.checkpoint = "outputs/toy_world/system"
    return c
