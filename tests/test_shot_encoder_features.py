"""Feature extraction (f_v, f_md per clip) as a tfds Beam build (data/extract_features.py,
data/clip_dataset/features.py): read back through the loader, the features equal the models applied
directly to the same clips; a second build is refused without --overwrite and replaces the first
with it, a stale incomplete folder is removed; a worker's models are FSDP-sharded over its local
devices. The clip dataset is built by data.prepare from the sample film; weights are tiny and random."""

import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from animegamer_jax import parallel

from animegamer_jax.io import paths
from animegamer_jax.data import datasets, extract_features, loader, prepare, sample
from animegamer_jax.commands.data import main as data_main
from animegamer_jax.data.clip_dataset import features as features_lib
from animegamer_jax.models.clip.model import CLIPConfig, CLIPVisionTransformer
from animegamer_jax.models.t5.model import T5Config, T5Encoder
from animegamer_jax.tokenizers.t5_tokenizer import T5Tokenizer
from configs import tiny
from tests.random_weights import normal_model
from tests.subproc import run_python

pytestmark = pytest.mark.slow  # its tests (or the fixtures they share) take over ~10 s each on a loaded 2-core host

_CACHE: dict = {}


def tiny_models():
    """(clip, t5, tokenizer) of configs/tiny.py with random weights, built once per process."""
    if "models" not in _CACHE:
        cfg = tiny.get_config()
        clip = normal_model(lambda: CLIPVisionTransformer(CLIPConfig.from_config(cfg.clip), rngs=nnx.Rngs(0)), 0)
        t5 = normal_model(lambda: T5Encoder(T5Config.from_config(cfg.t5), rngs=nnx.Rngs(0)), 1)
        _CACHE["models"] = clip, t5, T5Tokenizer(cfg.t5.spiece_model, cfg.t5.max_length)
    return _CACHE["models"]


def load_tiny_encoder():
    """A ``features.LoadEncoder`` (pickled by reference into the Beam DoFn): one encoder per process, so
    later builds reuse its compiled program."""
    if "encoder" not in _CACHE:
        clip, t5, tok = tiny_models()
        _CACHE["encoder"] = extract_features.FeatureEncoder(clip, t5, parallel.make_mesh((-1, 1, 1, 1))), tok
    return _CACHE["encoder"]


@pytest.fixture(scope="session")
def clip_dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("features_clips")
    film = str(d / "sample_film.mp4")
    sample.make_sample_film(film, size=(160, 90))
    prepare.prepare_dataset([("sample_film", film)], paths.resource("data/sample_labels.jsonl"), str(d / "clips"),
                            tiny.get_config().data)
    return str(d / "clips")


@pytest.fixture(scope="module")
def built(clip_dataset, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("features") / "feat")
    report = extract_features.extract_features(
        clip_dataset, out, load_tiny_encoder, extract_features.features_config(tiny.get_config()), batch_size=3,
        run_meta={"clip_weights": "random-0", "t5_weights": "random-1"})
    return out, report


def test_features_read_through_the_loader_equal_the_models(clip_dataset, built):
    out, report = built
    assert report.splits == {"train": 7}
    assert report.counters == {"batches_encoded": 3, "clips_encoded": 7}  # 3 + 3 + 1 (padded to 3)
    assert report.out_dir == os.path.join(out, features_lib.NAME, "16x32-8x32-float32", "2.0.0")
    src = loader.ClipSource(clip_dataset, features_dir=out)
    assert src.index["feature_fields"] == ["f_md", "f_v"]
    recs = [src[i] for i in range(len(src))]
    f_v, f_md = np.stack([r["f_v"] for r in recs]), np.stack([r["f_md"] for r in recs])
    assert f_v.shape == (7, 16, 32) and f_md.shape == (7, 8, 32) and f_v.dtype == np.float32
    frames = np.stack([r["first_frame"] for r in recs])
    actions = [r["action"] for r in recs]

    clip, t5, tok = tiny_models()
    enc, _ = load_tiny_encoder()
    direct = enc(frames[3:6], tok(actions[3:6]))  # the build's second batch, as one direct call
    np.testing.assert_array_equal(f_v[3:6], direct[0])
    np.testing.assert_array_equal(f_md[3:6], direct[1])
    want_v = nnx.jit(lambda m, x: m.encode_reference(x))(clip, jnp.asarray(frames, jnp.float32) / 127.5 - 1.0)
    want_md = nnx.jit(lambda m, t: m(t))(t5, jnp.asarray(tok(actions)))
    np.testing.assert_allclose(f_v, np.asarray(want_v), atol=1e-5)
    np.testing.assert_allclose(f_md, np.asarray(want_md), atol=1e-5)
    assert np.abs(f_v[0] - f_v[1]).max() > 1e-3  # different clips, different features (no pad or index mix-up)

    meta = datasets.metadata(out)
    assert meta["format"] == features_lib.FORMAT and meta["text_field"] == "action"
    assert meta["dataset"] == str(datasets.find(clip_dataset)) and meta["t5_weights"] == "random-1"
    assert meta["splits"] == {"train": {"num_clips": 7, "fingerprint": datasets.dataset_fingerprint(
        datasets.read_index(clip_dataset, "train"))}}
    assert meta["counters"] == report.counters


def test_refused_without_overwrite_replaced_with_it(clip_dataset, built, tmp_path, capsys):
    out, _ = built
    args = [f"--dataset={clip_dataset}", f"--out={out}", "--random_init"]
    assert data_main(["extract-features", *args]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert data_main(["extract-features", f"--dataset={clip_dataset}", f"--out={tmp_path / 'x'}"]) == 2
    assert "--clip_weights is required" in capsys.readouterr().err
    cfg32 = extract_features.features_config(tiny.get_config())
    for bad_out, kwargs, match in ((clip_dataset, {}, "other datasets"), (str(tmp_path / "y"), {"text_field": "nope"},
                                   "no field 'nope'"), ("gs://bucket/feat", {}, "gcsfuse")):
        with pytest.raises(ValueError, match=match):
            extract_features.extract_features(clip_dataset, bad_out, load_tiny_encoder, cfg32, batch_size=3, **kwargs)

    copy = str(tmp_path / "feat")
    shutil.copytree(out, copy)
    stale = os.path.join(copy, features_lib.NAME, "16x32-8x32-float16", "incomplete.abc123_2.0.0")
    os.makedirs(stale)
    report = extract_features.extract_features(
        clip_dataset, copy, load_tiny_encoder, extract_features.features_config(tiny.get_config(), "float16"),
        batch_size=3, overwrite=True)
    assert not os.path.exists(stale) and report.splits == {"train": 7}
    assert sorted(os.listdir(os.path.join(copy, features_lib.NAME))) == ["16x32-8x32-float16"]  # float32 replaced
    old, new = loader.ClipSource(clip_dataset, features_dir=out)[6], loader.ClipSource(clip_dataset,
                                                                                        features_dir=copy)[6]
    assert new["f_v"].dtype == np.float16 and new["f_md"].dtype == np.float16
    np.testing.assert_allclose(new["f_v"], old["f_v"], atol=1e-2)


def test_worker_models_fsdp_over_local_devices_match_one_device():
    out = run_python("""
        import jax, numpy as np
        from flax import nnx
        from animegamer_jax import parallel
        from animegamer_jax.data import extract_features as ef
        from animegamer_jax.models.clip.model import CLIPConfig, CLIPVisionTransformer
        from animegamer_jax.models.t5.model import T5Config, T5Encoder
        from configs import tiny
        jax.config.update("jax_default_matmul_precision", "highest")
        cfg = tiny.get_config()
        try:
            ef.ModelLoader(cfg, random_init=True, batch_size=6)()
        except parallel.ShardingConfigError as e:
            print("BATCH", "multiple of 4" in str(e))
        def make(fn, seed):
            g, a = nnx.split(nnx.eval_shape(fn))
            r = np.random.default_rng(seed)
            return nnx.merge(g, jax.tree.map(lambda s: np.asarray(r.normal(0, 0.2, s.shape), s.dtype), a))
        clip = make(lambda: CLIPVisionTransformer(CLIPConfig.from_config(cfg.clip), rngs=nnx.Rngs(0)), 0)
        t5 = make(lambda: T5Encoder(T5Config.from_config(cfg.t5), rngs=nnx.Rngs(0)), 1)
        frames = np.random.default_rng(2).integers(0, 256, (4, 40, 60, 3)).astype(np.uint8)
        ids = np.random.default_rng(3).integers(0, 200, (4, 8)).astype(np.int32)
        one = ef.FeatureEncoder(clip, t5, parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1]))(frames, ids)
        # what ModelLoader / load_models do with loaded weights: the worker mesh, params placed by logical axes
        mesh = parallel.make_mesh(ef.WORKER_MESH_SHAPE, devices=jax.local_devices())
        rules = parallel.rules_from_config(cfg)
        for m in (clip, t5):
            nnx.update(m, jax.device_put(nnx.state(m), parallel.param_shardings(nnx.state(m), mesh, rules)))
        many = ef.FeatureEncoder(clip, t5, mesh, rules)(frames, ids)
        print("SPEC", t5.shared[...].sharding.spec, "DIFF", max(float(np.abs(a - b).max()) for a, b in zip(one, many)))
    """, devices=4)
    assert "BATCH True" in out  # the batch must split over the worker's 4 local devices
    spec, diff = out.split("SPEC")[1].split("DIFF")
    assert "fsdp" in spec  # the T5 embedding is FSDP-sharded by its logical "embed" axis
    assert float(diff) <= 1e-5
