"""E_a's action-aware representation s_a of a batch (paper Sec. 3.2): the frozen T5 / CLIP features
through the shot encoder, as the training phases condition the decoder on it (train/losses.py) and
eval.decoder / eval.representation score it. Batches are ``data.batches.BatchBuilder``'s (phase a's
keys, or phase b's ``turn_`` keys with ``prefix="turn_"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax


def encode_features(model: Any, batch: Mapping[str, jax.Array], prefix: str = ""
                    ) -> tuple[jax.Array, jax.Array]:
    """Frozen T5 / CLIP features f_md [..., Lt, Dt] and f_v [..., P, Dv] of a batch.

    Uses precomputed ``{prefix}f_md`` / ``{prefix}f_v`` when the batch has them (data/extract_features),
    else runs the frozen encoders on ``{prefix}t5_ids`` [..., Lt] and ``{prefix}first_frame``
    [..., H, W, 3] (leading dims are flattened for the encoders and restored).
    """
    if prefix + "f_md" in batch:
        return batch[prefix + "f_md"], batch[prefix + "f_v"]
    ids, frames = batch[prefix + "t5_ids"], batch[prefix + "first_frame"]
    lead = ids.shape[:-1]
    f_md = model.t5(ids.reshape((-1, ids.shape[-1])))
    f_v = model.clip.visual.encode_reference(frames.reshape((-1,) + frames.shape[-3:]))
    f_md = f_md.reshape(lead + f_md.shape[1:])
    f_v = f_v.reshape(lead + f_v.shape[1:])
    return jax.lax.stop_gradient(f_md), jax.lax.stop_gradient(f_v)


def ea_representation(model: Any, batch: Mapping[str, jax.Array], prefix: str = "") -> jax.Array:
    """E_a's action-aware representation s_a [..., Q, rep_dim] (paper Sec. 3.2; the shot encoder's
    dtype, float32 at tiny size) of a batch's ``{prefix}t5_ids`` [..., Lt] + ``{prefix}first_frame``
    [..., h, w, 3] in [-1, 1] (or precomputed ``{prefix}f_md`` / ``{prefix}f_v``; leading dims, e.g.
    [B] or [B, M] turns, are kept): the frozen T5 / CLIP features through ``model.shot_encoder``.
    ``model`` is any module with ``shot_encoder`` (and ``t5`` / ``clip`` for raw batches)."""
    f_md, f_v = encode_features(model, batch, prefix)
    lead = f_md.shape[:-2]
    reps = model.shot_encoder(f_md.reshape((-1,) + f_md.shape[-2:]), f_v.reshape((-1,) + f_v.shape[-2:]))
    return reps.reshape(lead + reps.shape[1:])
