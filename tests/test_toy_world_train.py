"""The toy-world driver (train/toy_world.py): data steps, their resume, and every phase of configs/toy_world.py."""

import os

import pytest

from animegamer_jax import checkpoint
from animegamer_jax.data import datasets, references
from animegamer_jax.train import toy_world as driver
from configs import toy_world as toy_config

#: a small world: 3 characters (1 held out), 2 films each of 2 two-second scenes, 10 fps
WORLD = dict(num_characters=3, num_heldout=1, num_backgrounds=3, films_per_character=2, scenes_per_film=2,
             scene_seconds=2.0, size=(96, 64), fps=10.0, seed=2)


def test_config_trains_the_seen_characters_from_the_tiny_system():
    c = toy_config.get_config()
    assert c.train.pipeline == ("vae", "a1", "a2", "b", "c", "r") and len(c.train.pipeline_steps) == 6
    assert c.train.init_checkpoint == "checkpoints/tiny_system" and c.data.dataset_dir.endswith("toy_train")
    assert (c.data.height, c.data.width, c.dit.hidden_size) == (64, 96, 128)  # the tiny sizes
    assert c.train.vae_curriculum[0] == (0, 1, 64, 96) and c.train.vae_curriculum[-1][1:] == (9, 64, 96)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("toyrun") / "data")
    return root, driver.make_data(root, toy_config.get_config().data, **WORLD)


@pytest.mark.slow
def test_make_data_prepares_both_splits_and_skips_what_is_there(data, capsys):
    root, folders = data
    train, held = (datasets.read_index(folders[s], "train") for s in ("train", "heldout"))
    assert train["num_clips"] == 4 * 2 and held["num_clips"] == 2 * 2  # one 2 s clip per 2 s scene
    assert {c["film_id"].split("_")[1] for c in held["clips"]}.isdisjoint({c["film_id"].split("_")[1]
                                                                           for c in train["clips"]})
    refs = references.dataset_references(folders["train"])
    assert (refs >= 0).all()  # the labels travel with the prepared data: phase r mines its pairs
    stamp = {p: os.stat(os.path.join(d, f)).st_mtime_ns for p in ("world", "train") for d, _, fs in
             os.walk(folders[p]) for f in fs}
    again = driver.make_data(root, toy_config.get_config().data, **WORLD)
    assert again == folders
    assert {p: os.stat(os.path.join(d, f)).st_mtime_ns for p in ("world", "train") for d, _, fs in
            os.walk(folders[p]) for f in fs} == stamp  # nothing rewritten


@pytest.mark.paper  # the driver end to end (90 s): each phase's own step and resume are tests/test_train_model.py's,
# the driver's data step test_make_data_prepares_both_splits_and_skips_what_is_there
def test_every_phase_runs_a_step_and_a_rerun_resumes(data, tmp_path):
    root, _ = data
    c = toy_config.get_config()
    c.train.pipeline = ("a1", "r")  # the first phase (from the tiny system) and the last (reference)
    c.train.pipeline_steps = (1, 1)
    c.train.pipeline_learning_rates = (1e-3, 1e-3)
    c.train.vae_curriculum = ((0, 1, 64, 96), (1, 9, 64, 96))
    c.train.checkpoint_every = 1
    work = str(tmp_path / "run")
    fast = {"xla_backend_optimization_level": 0}
    out = driver.run(c, root, work, compiler_options=fast, **WORLD)
    assert out == os.path.join(work, "system") and checkpoint.is_complete(out)
    held = checkpoint.read_manifest(out)["components"]
    assert {"vae", "dit", "mllm", "shot_encoder", "reference"} <= set(held)
    for phase in c.train.pipeline[:-1]:
        assert checkpoint.is_complete(os.path.join(work, phase, "system"))
    mtime = os.stat(os.path.join(out, "integrity.json")).st_mtime_ns
    assert driver.run(c, root, work, **WORLD) == out  # every phase done: skipped
    assert os.stat(os.path.join(out, "integrity.json")).st_mtime_ns == mtime
