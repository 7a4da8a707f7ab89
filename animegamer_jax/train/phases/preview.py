"""Phase preview (not in the paper; docs/training.md#phase-preview): a small conv decoder trained from
scratch, distilled from the frozen VAE (its encoder gives the latents, its decoder the target; L1 + MSE)
on whole clips' frames. TAESD-like decoders train at about 1e-3."""

from flax import nnx

from animegamer_jax.data import batches
from animegamer_jax.train import losses
from animegamer_jax.train.phases.base import Phase

PHASE = Phase(
    name="preview",
    components=("vae", "preview"),
    trainable={"preview": nnx.Param},
    loss=losses.preview_loss,
    batch=batches.FRAMES,
    schedule=(1e-3, 10_000),
)
