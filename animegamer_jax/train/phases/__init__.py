"""The training phases: one module per phase holding its record (:class:`Phase`: components, trainable
set, batch kind, loss, schedule), and the table the train command (``train.model.phase_spec``,
``train.pipeline``) and the compile tool (``aot.programs``) read.

| phase   | components (frozen in brackets)               | trained                                     | batch      |
|---------|-----------------------------------------------|---------------------------------------------|------------|
| vae     | vae                                           | VAE (all)                                   | vae        |
| a1      | shot_encoder, dit, [t5, clip, vae]            | E_a (all) + DiT ``flow_embed``              | decoder    |
| a2      | shot_encoder, dit, [t5, clip, vae]            | E_a + DiT LoRA + ``flow_embed`` + block adaLN | decoder  |
| b       | mllm, [shot_encoder, t5, clip]                | MLLM LoRA, RMSNorms, embeddings, lm_head, resamplers | turns |
| c       | dit, [mllm, shot_encoder, t5, clip, vae]      | DiT LoRA + ``flow_embed`` + block adaLN     | turns_clip |
| d       | student, [dit, shot_encoder, t5, clip, vae]   | student: all, or LoRA + ``flow_embed`` + ``guidance_embed`` + block adaLN | decoder |
| r       | reference, [shot_encoder, dit, t5, clip, vae] | the reference adapter (type embedding + its LoRA) | reference |
| preview | preview, [vae]                                | the preview decoder (all)                   | frames     |

A new phase is a module here defining ``PHASE = Phase(...)`` and a line in :data:`PHASES`
(its name also goes into ``config.TRAIN_PHASES``, which ``config.validate`` checks flags against).
"""

from __future__ import annotations

from animegamer_jax.train.phases import a1, a2, b, c, d, preview, r, vae
from animegamer_jax.train.phases.base import Phase

#: phase name -> its record, in ``config.TRAIN_PHASES`` order
PHASES: dict[str, Phase] = {m.PHASE.name: m.PHASE for m in (vae, a1, a2, b, c, d, r, preview)}


def phase(name: str) -> Phase:
    """The record of the phase ``name``.

    Raises:
      ValueError: (one line) an unknown name, naming the phases.
    """
    if name not in PHASES:
        raise ValueError(f"unknown training phase {name!r}; use one of {', '.join(PHASES)}")
    return PHASES[name]


__all__ = ["PHASES", "Phase", "phase"]
