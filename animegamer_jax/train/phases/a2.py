"""Phase a2, joint training (paper §3.2): E_a and the DiT's "joint" set (LoRA + ``flow_embed`` +
block adaLN; ``train.dit_trainable="all"``: every DiT parameter, for toy configs without a
pretrained CogVideoX) on a1's components, batches and loss."""

import dataclasses

from flax import nnx

from animegamer_jax.train.phases import a1
from animegamer_jax.train.phases.base import Choice, dit_set

PHASE = dataclasses.replace(
    a1.PHASE, name="a2", schedule=(2e-4, 80_000),
    trainable={"shot_encoder": nnx.Param, "dit": Choice("dit_trainable", {"paper": dit_set("joint"), "all": nnx.Param})})
