"""Train the toy world in one command: generate it, prepare it, train the pipeline; rerunning resumes.

  python -m animegamer_jax.commands.train toy-world [--data_dir=data/prepared] [--workdir=outputs/toy_world] \\
      [--config=configs/toy_world.py] [--config.train.pipeline_steps=...]
  make toy-world [TOY_DATA=DIR] [TOY_WORKDIR=DIR]

Steps, each skipped when its output is already there (so the same command resumes where it stopped):

1. ``DATA_DIR/toy``: the toy world (data/toy_world.py, its default arguments and seed 0), unless a
   complete one is there (its manifest.json says ``complete``).
2. ``DATA_DIR/toy_train`` and ``DATA_DIR/toy_heldout``: the ordinary prepared datasets of its
   ``train/`` and ``heldout/`` films with the generator's labels (data/prepare.py, the config's clip
   sizes and stride), unless a dataset is there.
3. The config's ``train.pipeline`` (configs/toy_world.py: vae -> a1 -> a2 -> b -> c -> r) on
   ``DATA_DIR/toy_train`` into ``WORKDIR`` (``python -m animegamer_jax.commands.train --config.train.phase=all``:
   finished phases are skipped, a stopped one resumes from its newest intact checkpoint). The held-out
   characters' films are prepared for evaluation only; no phase reads them.

Prints the final system checkpoint (``WORKDIR/system``). Exit 0 also when SIGTERM / SIGINT stopped it at
a saved step (it prints the command that resumes); 2 with one line for a bad input.
"""

from __future__ import annotations

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.data import datasets, prepare, toy_world
from animegamer_jax.data.films import list_film_dir
from animegamer_jax.train import pipeline
from animegamer_jax.train.loop import status


def make_data(data_dir: str, data_cfg, **world) -> dict[str, str]:
    """Steps 1 and 2 of the module docstring; ``world``: arguments of ``toy_world.make_toy_world``
    (defaults: its own). Returns {"world", "train", "heldout"}: the three folders under ``data_dir``.

    Raises:
      FileExistsError: ``DATA_DIR/toy`` holds other files than a toy world's (toy_world refuses it).
    """
    out = {"world": paths.join(data_dir, "toy"), "train": paths.join(data_dir, "toy_train"),
           "heldout": paths.join(data_dir, "toy_heldout")}
    try:
        done = bool(toy_world.read_manifest(out["world"]).get("complete"))
    except (FileNotFoundError, ValueError):
        done = False
    if done:
        status("toy world: %s already there", out["world"])
    else:
        status("toy world: generating %s", out["world"])
        toy_world.make_toy_world(out["world"], data_cfg, **world)
    labels = paths.join(out["world"], "labels.jsonl")
    for split in ("train", "heldout"):
        try:
            datasets.find(out[split])
            status("toy world: %s already prepared", out[split])
            continue
        except datasets.DatasetError:
            pass
        films = list_film_dir(paths.join(out["world"], split))
        status("toy world: preparing %d %s films into %s", len(films), split, out[split])
        prepare.prepare_dataset(films, labels, out[split], data_cfg)
    return out


def run(config, data_dir: str, workdir: str, compiler_options: dict | None = None, **world) -> str:
    """Makes the data (:func:`make_data`) and runs ``config.train.pipeline`` on its ``toy_train`` into
    ``workdir`` (``pipeline.run_all``); returns the final system checkpoint.

    Raises:
      loop.Preempted: SIGTERM / SIGINT stopped it (the same call resumes).
    """
    folders = make_data(data_dir, config.data, **world)
    config.data.dataset_dir = folders["train"]
    if "heldout_dataset_dir" in config.eval:
        config.eval.heldout_dataset_dir = folders["heldout"]
    if "toy_world_dir" in config.eval:
        config.eval.toy_world_dir = folders["world"]
    if str(config.train.get("vae_dataset_dir", "")):
        config.train.vae_dataset_dir = folders["train"]
    fileio.makedirs(workdir)
    return pipeline.run_all(config, workdir, compiler_options=compiler_options)
