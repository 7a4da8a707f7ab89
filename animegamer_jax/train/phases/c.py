"""Phase c, decoder adaptation (paper §3.2): the DiT's "adaptation" set (LoRA + ``flow_embed`` + block
adaLN) trains conditioned on the frozen MLLM's predicted s_a; v-prediction MSE on turn batches that
carry the target turn's clip."""

from animegamer_jax.data import batches
from animegamer_jax.train import losses
from animegamer_jax.train.phases.base import Phase, dit_set

PHASE = Phase(
    name="c",
    components=("mllm", "shot_encoder", "dit", "t5", "clip"),
    trainable={"dit": dit_set("adaptation")},
    loss=losses.adaptation_loss,
    batch=batches.TURNS_CLIP,
    schedule=(5e-5, 10_000),
    samples=True,
)
