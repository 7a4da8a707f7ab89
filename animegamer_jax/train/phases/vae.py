"""Phase "vae" (not in the paper, which starts from the released CogVideoX VAE): the 3D causal VAE as a
KL-regularized autoencoder (L1 + MSE + KL) on random windows of the clips under a clip-size curriculum
(``train.vae_curriculum``), so that toy configs (configs/tiny.py) get a VAE whose latents show their
footage. It reads ``train.vae_dataset_dir`` when set, and fits ``vae.scaling_factor`` at its end."""

from flax import nnx

from animegamer_jax.train import losses
from animegamer_jax.train.phases.base import Phase


def _settings(config):
    t = config.train
    return {"vae_curriculum": [list(s) for s in t.vae_curriculum],
            "vae_windows_per_clip": int(t.vae_windows_per_clip),
            "vae_max_crop_scale": float(t.get("vae_max_crop_scale", 1.0))}


PHASE = Phase(
    name="vae",
    components=("vae",),
    outputs=("vae",),
    trainable=lambda dit_trainable, distill_trainable: {"vae": nnx.Param},
    loss=losses.vae_loss,
    batch="vae",
    loader="clips",
    schedule=(1e-4, 10_000),
    batch_settings=_settings,
    dataset_key="vae_dataset_dir",
)
