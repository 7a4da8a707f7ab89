"""Phase r, the reference adapter (not in the paper; docs/training.md#phase-r-reference): the adapter
(a type embedding and its own LoRA) trains on a2's loss with each clip's reference image VAE-encoded in
the step; the DiT and E_a stay as they are, so with no reference the decoder is unchanged.
Concat-ID-style adapters train at about 1e-4 for some 10k steps."""

from flax import nnx

from animegamer_jax.data import batches
from animegamer_jax.train import losses
from animegamer_jax.train.phases.base import Phase

PHASE = Phase(
    name="r",
    components=("shot_encoder", "dit", "t5", "clip", "vae", "reference"),
    trainable={"reference": nnx.Param},
    loss=losses.reference_loss,
    batch=batches.REFERENCE,
    schedule=(1e-4, 10_000),
)
