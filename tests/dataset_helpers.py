"""Datasets for tests: a prepared dataset's index without its records (for code that reads only the
index: data/datasets.py read_index), and stand-in shot-encoder features (data.extract_features with
no CLIP / T5)."""

import json
import os

import numpy as np

from animegamer_jax.data import datasets
from animegamer_jax.data.clip_dataset import features as features_lib
from configs import tiny


def index_only_dataset(path, clips, config=None, films=(), split="train"):
    """Writes ``<path>/animegamer_clips/test/2.0.0/{dataset_info,metadata}.json`` holding ``clips`` (rows
    as metadata.json stores them; ``index`` added) in ``split``; returns ``str(path)``."""
    version = os.path.join(str(path), "animegamer_clips", "test", "2.0.0")
    os.makedirs(version, exist_ok=True)
    rows = [{"index": i, **row} for i, row in enumerate(clips)]
    with open(os.path.join(version, "dataset_info.json"), "w") as f:
        json.dump({"name": "animegamer_clips", "configName": "test", "version": "2.0.0",
                   "splits": [{"name": split, "shardLengths": [str(len(rows))]}]}, f)
    with open(os.path.join(version, "metadata.json"), "w") as f:
        json.dump({"format": datasets.CLIP_FORMAT, "config": config or {"height": 64, "width": 96},
                   "films": list(films), "skipped": [], "unlabelled": [], "labels": "",
                   "splits": {split: {"num_clips": len(rows), "clips": rows}}}, f)
    return str(path)


def random_features(frames, ids):
    """A stand-in shot-encoder input at configs/tiny.py sizes: f_v [B, P, Dv] / f_md [B, Lt, Dt] float32
    drawn from a generator seeded by each clip's first-frame pixels and T5 ids."""
    cfg = tiny.get_config()
    f_v, f_md = [], []
    for frame, row in zip(frames, ids):
        rs = np.random.RandomState(int(frame.sum()) % 2**31 + int(row.sum()))
        f_v.append(rs.randn(cfg.rep.num_image_tokens, cfg.clip.vision_width).astype(np.float32))
        f_md.append(rs.randn(cfg.t5.max_length, cfg.t5.d_model).astype(np.float32))
    return np.stack(f_v), np.stack(f_md)


def load_random_features():
    """features.LoadEncoder of random_features (top level: Beam pickles it); ids = [len(text), 1, 0...]."""
    cfg = tiny.get_config()
    return random_features, lambda texts: np.array([[len(t), 1] + [0] * (cfg.t5.max_length - 2) for t in texts],
                                                   np.int32)


def tiny_features_config():
    """The FeaturesConfig of configs/tiny.py's f_v / f_md sizes (float32)."""
    cfg = tiny.get_config()
    return features_lib.features_config(cfg.rep.num_image_tokens, cfg.clip.vision_width, cfg.t5.max_length,
                                        cfg.t5.d_model)
