"""Full-size coverage of `convert release` from ../shared/fixtures/release_tiny/full_size_keys.json alone.

No weights: every full-size release key becomes a zero-stride numpy array of its listed shape (no
memory), and the release converter's own routing (convert/release.py) and the single-network
converters run on them. Layered families (Mistral / DiT / T5 blocks) are proven at full width on
layer 0 with a 1-layer config, after checking that every family has exactly the config's layer
indices with identical shapes; the converted shapes (layer axis prepended) must then equal the
paper-size system's parameter tree from ``nnx.eval_shape`` of configs/animegamer_2b_7b.py.
Both ways are counted: every key is mapped (or dropped on purpose, with its reason), and every
parameter of the tree is produced by some key.
"""

from __future__ import annotations

import copy
import json
import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(ROOT, "..", "shared", "fixtures", "release_tiny", "full_size_keys.json")

pytestmark = [pytest.mark.skipif(not os.path.exists(MANIFEST), reason=f"release fixture absent: {MANIFEST}"),
              pytest.mark.slow]

FILES = {
    "mllm": "AnimeGamer/MLLM-Qiqi/pytorch_model.bin",
    "engine": "AnimeGamer/VDM_Decoder-Qiqi/10000/mp_rank_00_model_states.pt ['module']",
    "mistral": "Mistral-7B-Instruct-v0.1/*.safetensors",
    "t5": "google/t5-v1_1-xxl (as loaded by T5EncoderModel.from_pretrained)",
    "clip": "laion/CLIP-ViT-B-16-laion2B-s34B-b88K/open_clip_pytorch_model.bin",
    "vae": "vae/3d-vae.pt ['state_dict']",
}
#: layer-index patterns per file (family template -> index)
LAYERED = {
    "mllm": [r"(\.layers\.)(\d+)(\.)"],
    "mistral": [r"(\.layers\.)(\d+)(\.)"],
    "engine": [r"(^model\.diffusion_model\.transformer\.layers\.)(\d+)(\.)",
               r"(adaLN_modulations\.|query_layernorm_list\.|key_layernorm_list\.)(\d+)(\.)",
               r"(^conditioner\.embedders\.0\.transformer\.encoder\.block\.)(\d+)(\.)"],
    "t5": [r"(^encoder\.block\.)(\d+)(\.)"],
}


def _zeros(shape):
    return np.broadcast_to(np.zeros((), np.float32), tuple(shape))


def _layer0(keys: dict, patterns: list[str], counts: dict[str, int]) -> dict:
    """Keeps non-layer keys and layer-0 keys; asserts every family has indices 0..L-1, same shapes."""
    fams: dict[str, dict[int, tuple]] = {}
    out = {}
    for k, v in keys.items():
        for pat in patterns:
            m = re.search(pat, k)
            if m:
                tmpl = k[: m.start(2)] + "{}" + k[m.end(2):]
                fams.setdefault(tmpl, {})[int(m.group(2))] = tuple(v["shape"])
                if int(m.group(2)) == 0:
                    out[k] = _zeros(v["shape"])
                break
        else:
            out[k] = _zeros(v["shape"])
    for tmpl, idx in fams.items():
        n = 1 if "relative_attention_bias" in tmpl else next(c for p, c in counts.items() if p in tmpl)  # T5: block 0 only
        assert sorted(idx) == list(range(n)), f"{tmpl}: layer indices {sorted(idx)[:5]}.. vs {n} layers"
        assert len(set(idx.values())) == 1, f"{tmpl}: shapes differ across layers"
    return out


@pytest.fixture(scope="module")
def manifest():
    with open(MANIFEST, encoding="utf-8") as f:
        files = json.load(f)["files"]
    assert set(FILES.values()) <= set(files)
    return {name: files[key]["keys"] for name, key in FILES.items()}


def _paper_and_one_layer():
    from configs import animegamer_2b_7b

    paper = animegamer_2b_7b.get_config()
    one = copy.deepcopy(paper)
    one.mllm.num_layers = one.dit.num_layers = one.t5.num_layers = 1
    one.mllm.param_dtype = "float32"  # shapes only; skips slow bf16 casts of the 32284 x 4096 tables
    return paper, one


def _shapes(state) -> dict[str, tuple]:
    from flax import nnx

    return {"/".join(map(str, p)): tuple(v.get_raw_value().shape if hasattr(v, "get_raw_value") else v.shape)
            for p, v in nnx.to_flat_state(state)}


@pytest.mark.paper  # the paper-size key tables (25 s); the tiny release's keys are tests/test_release.py's
def test_full_size_keys_map_both_ways(manifest, monkeypatch, capsys):
    import jax
    from flax import nnx

    from animegamer_jax.convert import release
    from animegamer_jax.models import registry
    from animegamer_jax.models.mistral import convert as mistral_convert

    paper, one = _paper_and_one_layer()
    layer_counts = {"layers.": paper.mllm.num_layers, "adaLN": paper.dit.num_layers,
                    "layernorm_list": paper.dit.num_layers, "encoder.block": paper.t5.num_layers}
    dit_counts = {"diffusion_model.transformer.layers": paper.dit.num_layers, "adaLN": paper.dit.num_layers,
                  "layernorm_list": paper.dit.num_layers, "encoder.block": paper.t5.num_layers}
    sds = {}
    for name, keys in manifest.items():
        counts = dit_counts if name == "engine" else layer_counts
        sds[name] = _layer0(keys, LAYERED.get(name, []), counts) if name in LAYERED else {
            k: _zeros(v["shape"]) for k, v in keys.items()}

    # the release's own routing, reading the manifest instead of files
    by_path = {"mllm.bin": sds["mllm"], "engine.pt": sds["engine"], "3d-vae.pt": sds["vae"], "clip.bin": sds["clip"]}
    monkeypatch.setattr(release, "load_torch_lazy", lambda p: dict(by_path[os.path.basename(p)]))
    monkeypatch.setattr(release, "load_folder_lazy", lambda p: dict(sds["t5"] if "t5" in p else sds["mistral"]))
    files = release.ReleaseFiles("SRC", "mllm.bin", "engine.pt", "3d-vae.pt", "t5", "clip.bin", "mistral")
    engine = sds["engine"]
    assert release._engine_check(files, engine) == []
    import time

    calls = {
        "mllm": lambda: release._mllm(files, one, "one-layer"),
        "dit": lambda: release._dit(files, engine, one, "one-layer"),
        "shot_encoder": lambda: release._shot_encoder(files, engine, one, "one-layer"),
        "vae": lambda: release._vae(files, engine, one, "one-layer"),
        "t5": lambda: release._t5(files, engine, one, "one-layer"),
        "clip": lambda: release._clip(files, engine, one, "one-layer"),
    }
    converted = {}
    for name, call in calls.items():
        t0 = time.perf_counter()
        converted[name] = call()
        print(f"{name}: converted in {time.perf_counter() - t0:.1f} s")
    from animegamer_jax.models.mistral.convert import Leaf

    produced = 0
    total = 0
    for name in list(converted):
        job, errs = converted.pop(name)[:2]
        assert not errs and job is not None, (name, errs)
        if isinstance(job, (release._LeafJob, release._DiTJob)):
            # streamed components: the converter checked every leaf against the 1-layer model; run
            # each transform once (whole leaves, layer 0 of stacked ones) to prove the declared shapes
            got = {}
            items = job.leaves.items() if isinstance(job, release._LeafJob) else job.top.items()
            for path, leaf in items:
                key = "/".join(release._key(path))
                if isinstance(leaf, Leaf):
                    arr = leaf.fn(0) if leaf.layers else leaf.fn()
                    assert tuple(arr.shape) == leaf.shape, (key, arr.shape, leaf.shape)
                    got[key] = (leaf.layers,) + leaf.shape if leaf.layers else leaf.shape
                    del arr
                else:
                    got[key] = tuple(np.shape(leaf))
            if isinstance(job, release._DiTJob):
                from animegamer_jax.models.cogvideox import dit_convert

                for k, v in dit_convert.sat_layer(job.sd, job.cfg, job.rank, 0).items():
                    got["/".join(("blocks",) + k)] = (1,) + v.shape
        else:
            got = _shapes(job)
        del job
        want = _shapes(nnx.state(nnx.eval_shape(lambda: registry.build_component(name, paper, nnx.Rngs(0)))))
        stacked = {"mllm": paper.mllm.num_layers, "dit": paper.dit.num_layers, "t5": paper.t5.num_layers}.get(name)
        # the 1-layer tree's leading layer axis (size 1) becomes the paper config's layer count
        exp = {p: ((stacked,) + s[1:] if stacked and ("layers/" in p or p.startswith("blocks/")) else s)
               for p, s in got.items()}
        assert set(exp) == set(want), (name, sorted(set(want) ^ set(exp))[:10])
        bad = {p: (exp[p], want[p]) for p in want if exp[p] != want[p]}
        assert not bad, (name, list(bad.items())[:5])
        produced += len(want)
        total += len(want)
        jax.clear_caches()

    # key side: every key is consumed by a converter above or dropped on purpose
    report = {}
    for name, keys in manifest.items():
        dropped = {k: release.dropped_reason(k) for k in keys if release.dropped_reason(k)}
        report[name] = (len(keys), len(keys) - len(dropped), len(dropped), sorted(set(dropped.values())))
    # the standalone T5 folder and the OpenCLIP file duplicate engine prefixes (same keys, same shapes)
    t5_eng = {k[len("conditioner.embedders.0.transformer."):]: v for k, v in manifest["engine"].items()
              if k.startswith("conditioner.embedders.0.transformer.")}
    assert t5_eng == manifest["t5"]
    clip_eng = {k[len("clip_img_encoder.model."):]: v for k, v in manifest["engine"].items()
                if k.startswith("clip_img_encoder.model.")}
    assert {k: v for k, v in manifest["clip"].items() if not k.startswith("transformer.")} == clip_eng
    vae_eng = {k[len("first_stage_model."):]: v for k, v in manifest["engine"].items() if k.startswith("first_stage_model.")}
    assert vae_eng == manifest["vae"]
    # the Mistral folder (fallback for base weights) has exactly the HF keys of the base model, vocab 32000
    mcfg = mistral_convert.config_from_hf({"vocab_size": 32000, "hidden_size": paper.mllm.hidden_size,
                              "intermediate_size": paper.mllm.intermediate_size, "num_hidden_layers": paper.mllm.num_layers,
                              "num_attention_heads": paper.mllm.num_heads, "num_key_value_heads": paper.mllm.num_kv_heads})
    mistral_convert.check_keys({k: _zeros(v["shape"]) for k, v in manifest["mistral"].items()}, mistral_convert._expected_keys(mcfg, ""), "mistral")
    with capsys.disabled():
        for name, (n, mapped, dropped, why) in report.items():
            print(f"\ncoverage {FILES[name]}: {n} keys, {mapped} mapped, {dropped} dropped on purpose {why}")
        print(f"coverage paper-size system: {produced} of {total} parameters produced by release keys")
    assert sum(r[0] for r in report.values()) == 812 + 1627 + 291 + 220 + 302 + 436
