"""Phase a2, joint training (paper §3.2): E_a and the DiT's "joint" set (LoRA + ``flow_embed`` +
block adaLN; ``train.dit_trainable="all"``: every DiT parameter, for toy configs without a
pretrained CogVideoX) on a1's batches and loss."""

from flax import nnx

from animegamer_jax.train import losses
from animegamer_jax.train.phases.base import Phase, dit_set

PHASE = Phase(
    name="a2",
    components=("shot_encoder", "dit", "t5", "clip"),
    outputs=("shot_encoder", "dit"),
    trainable=lambda dit_trainable, distill_trainable: {
        "shot_encoder": nnx.Param, "dit": nnx.Param if dit_trainable == "all" else dit_set("joint")},
    loss=losses.decoder_loss,
    batch="decoder",
    loader="clips",
    schedule=(2e-4, 80_000),
    encode_latents=True,
    samples=True,
)
