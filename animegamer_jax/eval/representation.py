r"""Where play's predicted representations land among the training clips' own.

  python -m animegamer_jax.eval.representation --game data/games/sample_tour.txt \
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

import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx

from animegamer_jax import cli as cli_lib
from animegamer_jax import fileio, paths
from animegamer_jax.checkpoint import SystemCheckpointError, load_config, load_system
from animegamer_jax.config import ConfigError
from animegamer_jax.data import datasets, loader
from animegamer_jax.data.batches import BatchBuilder
from animegamer_jax.eval.decoder import check_dataset, clip_example
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.loading import CheckpointError, load_game_system
from animegamer_jax.game.script import GameScriptError, load_script
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


def define_flags(fv, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.eval.representation`` on ``fv`` (absl)."""
    flags.DEFINE_string("game", None, "Game script to play (one instruction a line, game/script.py).", flag_values=fv)
    flags.DEFINE_string("checkpoint", "checkpoints/tiny_system", "System checkpoint.", flag_values=fv)
    flags.DEFINE_string("dataset", "", "Prepared dataset whose clips to compare with (default: the checkpoint "
                        "config's data.dataset_dir, its training clips).", flag_values=fv)
    flags.DEFINE_string("json", "", "Also write the figures to this JSON file.", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """Prints, per turn, where the predicted s_a lies among the clips' E_a s_a; returns the exit status
    (2 with a one-line message on bad input)."""
    return cli_lib.run_command("animegamer-eval-representation", argv, define_flags, __doc__, None, _run,
                               (ConfigError, FileNotFoundError, SystemCheckpointError, datasets.DatasetError,
                                GameScriptError, CheckpointError, ValueError, OSError))


def _fmt(c: dict | None, action: bool = False) -> str:
    if c is None:
        return "none"
    return f"{c['film_id']}#{c['clip_index']}" + (f" ({c['action']!r})" if action else "") + f" {c['mse']:.3f}"


def _run(f, *rest: str) -> int:
    """The body of :func:`main` on parsed flags ``f`` (a bad input raises; ``cli.run_command`` reports it)."""
    if rest:
        raise cli_lib.UsageError(f"unexpected arguments {list(rest)}")
    if not f.game:
        raise cli_lib.UsageError("--game is required: a game script, e.g. data/games/sample_tour.txt")
    game = load_script(paths.resource(f.game))
    ckpt = paths.resource(f.checkpoint)
    config = load_config(ckpt)
    dataset = paths.resource(f.dataset or str(config.data.dataset_dir))
    check_dataset(dataset, config)  # before the load: a wrong or missing dataset fails fast
    if f.json:
        fileio.write_text_atomic(f.json, "{}")  # an unwritable --json fails before the run
    # E_a first: a checkpoint without T5 / CLIP fails before the game is played
    components = load_system(ckpt, config, names=["shot_encoder", "t5", "clip"])
    clip_reps, rows = clip_representations(components, config, dataset)
    engine = GameEngine(config, load_game_system(ckpt, config))
    played = engine.play([game])[0]
    res = turn_distances([t.rep for t in played["turns"]], [t.motion for t in game.turns], clip_reps, rows)
    for k, (turn, r) in enumerate(zip(game.turns, res)):
        mean = "none" if r["mse_to_mean"] is None else f"{r['mse_to_mean']:.3f}"
        print(f"turn {k + 1} {turn.motion!r}: {r['clips']} clip(s) with this action; MSE to their mean {mean}, "
              f"nearest {_fmt(r['nearest'])}, farthest {_fmt(r['farthest'])}; nearest of another action "
              f"{_fmt(r['nearest_other_action'], action=True)}; mean square of the prediction "
              f"{r['rep_mean_square']:.3f}")
    ms = np.mean(clip_reps ** 2, axis=(1, 2))
    print(f"{ckpt}: {len(res)} turns of {f.game} against E_a of the {len(rows)} clips of {dataset} (MSE over "
          f"Q x D; the clips' own mean squares {ms.min():.2f}-{ms.max():.2f})")
    if f.json:
        fileio.write_text_atomic(f.json, json.dumps({"game": f.game, "checkpoint": ckpt, "dataset": dataset,
                                                     "turns": res}, indent=1))
    return 0


def cli() -> None:
    """Console script ``animegamer-eval-representation`` (pyproject.toml)."""
    raise SystemExit(main())


if __name__ == "__main__":
    cli()
