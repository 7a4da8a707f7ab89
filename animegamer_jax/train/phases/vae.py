"""Phase "vae" (not in the paper, which starts from the released CogVideoX VAE): the 3D causal VAE as a
KL-regularized autoencoder (L1 + MSE + KL) on random windows of the clips under a clip-size curriculum
(``train.vae_curriculum``), so that toy configs (configs/tiny.py) get a VAE whose latents show their
footage. It reads ``train.vae_dataset_dir`` when set, and fits ``vae.scaling_factor`` at its end."""

from flax import nnx

from animegamer_jax.data import batches
from animegamer_jax.train import losses
from animegamer_jax.train.phases.base import Phase

PHASE = Phase(
    name="vae",
    components=("vae",),
    trainable={"vae": nnx.Param},
    loss=losses.vae_loss,
    batch=batches.VAE,
    schedule=(1e-4, 10_000),
)
