"""Phase a1, warm-up (paper §3.2): E_a (all) and the DiT's ``flow_embed`` train against the frozen
decoder, conditioned on E_a(T5(action), CLIP(first frame)); v-prediction MSE on clip batches.

The paper trains E_a only; the release code also trains flow and LoRA (docs/training.md#trainable-sets).
"""

from flax import nnx

from animegamer_jax.data import batches
from animegamer_jax.train import losses
from animegamer_jax.train.phases.base import Phase, path_has

PHASE = Phase(
    name="a1",
    components=("shot_encoder", "dit", "t5", "clip"),
    trainable={"shot_encoder": nnx.Param, "dit": nnx.All(nnx.Param, path_has(("flow_embed",)))},
    loss=losses.decoder_loss,
    batch=batches.DECODER,
    schedule=(2e-4, 10_000),
    samples=True,
)
