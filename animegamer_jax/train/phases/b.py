"""Phase b, the MLLM (paper §3.2, docs/mllm.md#losses): its LoRA factors and the parameters named in
``models.mistral.model.TRAINABLE_NAMES`` (RMSNorms, embeddings, lm_head, resamplers) train on turn
batches with ``lm_loss_scale CE + rec_loss_scale MSE`` against the frozen E_a's s_a."""

from flax import nnx

from animegamer_jax.data import batches
from animegamer_jax.models.layers import LoRAParam
from animegamer_jax.models.mistral import model as mistral_model
from animegamer_jax.train import losses
from animegamer_jax.train.phases.base import Phase, path_has

PHASE = Phase(
    name="b",
    components=("mllm", "shot_encoder", "t5", "clip"),
    trainable={"mllm": nnx.Any(LoRAParam, nnx.All(nnx.Param, path_has(mistral_model.TRAINABLE_NAMES)))},
    loss=losses.mllm_loss,
    batch=batches.TURNS,
    schedule=(5e-5, 15_000),
)
