"""Phase d, the few-step student (not in the paper; docs/training.md#phase-d-distillation): consistency
distillation of the guided, frozen teacher ``dit`` into ``student`` (``train.distill_trainable``:
"full", every student parameter, or "lora": its LoRA factors, ``flow_embed``, ``guidance_embed`` and
block adaLN) on a1's clip batches. LCM trains its full-UNet student at 8e-6 for ~10k steps."""

from flax import nnx

from animegamer_jax.data import batches
from animegamer_jax.diffusion import samplers
from animegamer_jax.train import losses
from animegamer_jax.train.phases.base import Choice, Phase, dit_set, path_has


def _settings(config):
    """What the distilled runs are: the drawn scales and the teacher's grid."""
    t = config.train
    return {"distill_cfg_scales": [float(v) for v in t.distill_cfg_scales],
            "student_grid_steps": samplers.student_grid_steps(config.diffusion),
            "cfg_exp": float(config.diffusion.cfg_exp), "cfg_schedule": str(config.diffusion.cfg_schedule),
            "distill_trainable": str(t.get("distill_trainable", "full"))}


PHASE = Phase(
    name="d",
    components=("shot_encoder", "dit", "student", "t5", "clip"),
    trainable={"student": Choice("distill_trainable", {
        "full": nnx.Param,
        "lora": nnx.Any(dit_set("adaptation"), nnx.All(nnx.Param, path_has(("guidance_embed",))))})},
    loss=losses.distill_loss,
    batch=batches.DECODER,
    schedule=(1e-5, 10_000),
    settings=_settings,
)
