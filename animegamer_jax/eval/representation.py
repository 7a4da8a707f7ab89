r"""Where play's predicted representations land among the training clips' own.

  python -m animegamer_jax.commands.eval representation --game data/games/sample_tour.txt \
      [--checkpoint checkpoints/tiny_system] [--dataset data/prepared/tiny] [--json out.json]

Plays ``--game`` (a game script, game/script.py) on the system checkpoint as ``play`` does, and for each
turn compares the MLLM's predicted s_a [Q, D] (paper Sec. 3.3: the next action-aware representation) with
s_a = E_a(T5 of the action, CLIP of the first frame) of every clip of a prepared dataset (paper Sec. 3.2,
as in phase a: ``inference/action_representation.py`` ``ea_representation``), by mean squared difference over the Q x D
elements:

* ``clips``: the dataset clips whose action is the turn's Motion text (the labels' words), with the
  ``nearest`` and ``farthest`` of them and ``mse_to_mean``, the distance to the mean of their s_a.
  A prediction much nearer the mean than to any one clip is their average: what phase b's MSE loss
  learns when one instruction labels several clips, and what the decoder draws as a blur of them.
* ``nearest_other_action``: the nearest clip with another action (does the turn land on its own action?).
* ``rep_mean_square``: the prediction's mean square (an average of unlike representations is smaller).

The default dataset is the checkpoint config's ``data.dataset_dir`` (the training clips, for the tiny
system data/prepared/tiny, README "Train the tiny system"). A turn whose action no clip has reports
``clips`` 0 and no nearest clip of its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.data import loader
from animegamer_jax.data.batches import BatchBuilder
from animegamer_jax.eval.decoder import check_dataset, clip_example
from animegamer_jax.inference.action_representation import ea_representation


class _Encoder(nnx.Module):
    """E_a and its frozen encoders, as one module for nnx.jit."""

    def __init__(self, components: dict):
        for name in ("shot_encoder", "t5", "clip"):
            setattr(self, name, components[name])


def clip_representations(components: dict, config, dataset_dir: str) -> tuple[np.ndarray, list[dict]]:
    """E_a's s_a of every clip of a prepared dataset.

    Args:
      components: ``shot_encoder``, ``t5`` and ``clip`` modules (``checkpoint.load_system``).
      config: the system's config (T5 tokenizer and lengths).
      dataset_dir: prepared dataset (path or URL) of clips of the config's size and length.

    Returns:
      ``(reps float32 [N, Q, D], rows)``, one row per clip in dataset order:
      ``{"index", "film_id", "clip_index", "action"}``.

    Raises:
      datasets.DatasetError: no prepared dataset, no clips, or clips of another size (eval.decoder
        ``check_dataset``).
    """
    check_dataset(dataset_dir, config)
    source = loader.ClipSource(dataset_dir)
    builder = BatchBuilder(config, "decoder")  # phase a's inputs: T5 ids of the action, the first frame
    run = nnx.jit(lambda m, b: ea_representation(m, {k: b[k] for k in ("t5_ids", "first_frame")}))
    model = _Encoder(components)
    reps, rows = [], []
    for i in range(len(source)):
        rec = source[i]
        batch = builder(clip_example(rec))
        reps.append(np.asarray(jax.device_get(run(model, jax.tree.map(jnp.asarray, batch))), np.float32)[0])
        rows.append({"index": int(i), "film_id": str(rec["film_id"]), "clip_index": int(rec["clip_index"]),
                     "action": str(rec["action"])})
    return np.stack(reps), rows


def turn_distances(turn_reps: list[np.ndarray], actions: list[str], clip_reps: np.ndarray,
                   rows: list[dict]) -> list[dict]:
    """Per turn, where its predicted s_a lies among the clips' E_a s_a (module docstring). A turn's own
    clips are those whose action equals its Motion text exactly (E_a's T5 input), whatever their
    characters and background.

    Args:
      turn_reps: per turn, the MLLM's s_a float [Q, D].
      actions: per turn, its Motion text.
      clip_reps: float [N, Q, D], :func:`clip_representations`.
      rows: the clips' rows, :func:`clip_representations`.

    Returns:
      one dict per turn: ``action``, ``rep_mean_square``, ``clips`` (count), ``mse_to_mean``,
      ``nearest``, ``farthest``, ``nearest_other_action`` (each ``rows`` entry plus ``mse``, or None).

    Raises:
      ValueError: ``turn_reps`` and ``actions`` of different lengths, or a turn's [Q, D] not the clips'.
    """
    if len(turn_reps) != len(actions):
        raise ValueError(f"{len(turn_reps)} turn representations for {len(actions)} actions")
    out = []
    for rep, action in zip(turn_reps, actions):
        if np.shape(rep) != clip_reps.shape[1:]:
            raise ValueError(f"a turn's s_a is {np.shape(rep)}, the clips' {clip_reps.shape[1:]} (another system?)")
        rep = np.asarray(rep, np.float32)
        mse = np.mean((clip_reps - rep[None]) ** 2, axis=(1, 2))
        same = [i for i, r in enumerate(rows) if r["action"] == action]
        other = [i for i, r in enumerate(rows) if r["action"] != action]

        def pick(ids: list[int], fn) -> dict | None:  # the row (with its mse) of min / max mse, or None
            if not ids:
                return None
            i = fn(ids, key=lambda j: mse[j])
            return dict(rows[i], mse=float(mse[i]))

        mean = float(np.mean((np.mean(clip_reps[same], axis=0) - rep) ** 2)) if same else None
        out.append({"action": action, "rep_mean_square": float(np.mean(rep ** 2)), "clips": len(same),
                    "mse_to_mean": mean, "nearest": pick(same, min), "farthest": pick(same, max),
                    "nearest_other_action": pick(other, min)})
    return out
