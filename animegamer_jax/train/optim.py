"""Optimizer and learning-rate schedule of every training phase (docs/training.md#phases, paper App. C.1).

AdamW with fp32 moments (optax keeps moments in the dtype of the parameters, and our master weights
are fp32; ``mu_dtype`` pins the first moment to fp32 even for bf16 params), linear warm-up then
cosine decay, global-norm gradient clipping, and gradient accumulation with ``optax.MultiSteps``
(one optimizer update every ``grad_accum_steps`` micro-batches; the schedule counts updates).

Per-phase peak LR and length are each phase's ``schedule`` (``train.phases``), the paper table's for
a1 2e-4 x 10k, a2 2e-4 x 80k, b 5e-5 x 15k, c 5e-5 x 10k (docs/training.md#phases);
``config.train.learning_rate`` / ``num_steps`` override them when > 0.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import ml_collections
import optax

from animegamer_jax.train import phases


def phase_lr_and_steps(train_cfg: ml_collections.ConfigDict) -> tuple[float, int]:
    """Peak LR and number of optimizer steps for ``train_cfg.phase``.

    ``train_cfg.learning_rate`` / ``train_cfg.num_steps`` win when positive, else the phase's
    ``schedule`` (``train.phases``; the paper's values for a1, a2, b, c).

    Raises:
      ValueError: unknown phase.
    """
    lr, steps = phases.phase(str(train_cfg.phase)).schedule
    if float(train_cfg.learning_rate) > 0:
        lr = float(train_cfg.learning_rate)
    if int(train_cfg.num_steps) > 0:
        steps = int(train_cfg.num_steps)
    return lr, steps


def make_schedule(train_cfg: ml_collections.ConfigDict) -> optax.Schedule:
    """Linear warm-up from 0 to the peak LR over ``warmup_steps``, then cosine decay to
    ``peak * end_lr_factor`` at ``num_steps`` (all counted in optimizer updates)."""
    peak, steps = phase_lr_and_steps(train_cfg)
    warmup = max(0, min(int(train_cfg.warmup_steps), steps - 1))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=max(steps, warmup + 1),
        end_value=peak * float(train_cfg.end_lr_factor))


def make_optimizer(train_cfg: ml_collections.ConfigDict) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The phase's optax transformation and its LR schedule.

    Chain: ``clip_by_global_norm(grad_clip)`` (skipped when <= 0) -> ``adamw(schedule, b1, b2, eps,
    weight_decay, mu_dtype=float32)``, wrapped in ``optax.MultiSteps(every_k=grad_accum_steps)``
    when accumulating. Returns ``(tx, schedule)``; the schedule maps an optimizer-update count to
    the LR.
    """
    schedule = make_schedule(train_cfg)
    parts: list[Any] = []
    if float(train_cfg.grad_clip) > 0:
        parts.append(optax.clip_by_global_norm(float(train_cfg.grad_clip)))
    parts.append(optax.adamw(schedule, b1=float(train_cfg.adam_b1), b2=float(train_cfg.adam_b2),
                             eps=float(train_cfg.adam_eps), weight_decay=float(train_cfg.weight_decay),
                             mu_dtype=jnp.float32))
    tx = optax.chain(*parts)
    k = int(train_cfg.grad_accum_steps)
    if k < 1:
        raise ValueError(f"train.grad_accum_steps must be >= 1, got {k}")
    if k > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=k)
    return tx, schedule
