"""CogVideoX DiT: parity vs diffusers (through the real converters), SAT names, LoRA, bf16, 2B shapes.

How diffusers' text projection is mapped: our DiT takes the already-projected 226-token prefix
(s_a) as `cond`, while diffusers' `CogVideoXTransformer3DModel` projects raw text embeddings with
`patch_embed.text_proj` first. The tests apply `patch_embed.text_proj` to the text embeddings on the
torch side and feed the projected tokens to our model as `cond` (the converter returns text_proj
among its extras and maps everything else).
"""

import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from animegamer_jax.diffusion import samplers
from animegamer_jax.models import layers as lora_lib
from animegamer_jax.models.cogvideox import dit_convert as conv
from animegamer_jax.models.cogvideox.dit import (CogVideoXDiT, DiTBlock, DiTConfig, TRAINABLE_SETS, flow_value,
                                                 merge_lora)
from animegamer_jax.train.model import trainable_filter
from animegamer_jax.weights import load_state_dict
from tests.convert_checks import assert_names_bad_keys

TEXT_DIM, TEXT_LEN, FRAMES, H, W = 24, 8, 2, 8, 12
CFG = DiTConfig(hidden_size=32, num_layers=2, num_heads=2, head_dim=16, time_embed_dim=16, in_channels=4,
                out_channels=4, text_length=TEXT_LEN, final_norm_eps=1e-5, lora_rank=0)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """Tiny random diffusers model saved to safetensors, inputs, and its torch output."""
    import torch
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(0)
    tm = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=16,
        text_embed_dim=TEXT_DIM, num_layers=2, sample_width=W, sample_height=H,
        sample_frames=(FRAMES - 1) * 4 + 1, patch_size=2, max_text_seq_length=TEXT_LEN,
        use_rotary_positional_embeddings=False).eval()
    with torch.no_grad():
        for p in tm.parameters():  # move every weight away from its (often zero / one) init
            p.add_(0.1 * torch.randn_like(p))
    path = str(tmp_path_factory.mktemp("diffusers_dit"))
    tm.save_pretrained(path)
    x = torch.randn(2, FRAMES, 4, H, W)
    txt = torch.randn(2, TEXT_LEN, TEXT_DIM)
    t = torch.tensor([999, 37])
    with torch.no_grad():
        out = tm(x, txt, t).sample.numpy()
        cond = tm.patch_embed.text_proj(txt).numpy()
    sd = {k: v.detach().clone() for k, v in tm.state_dict().items()}
    return {"path": path, "sd": sd, "x": x.numpy(), "cond": cond, "t": t.numpy(), "out": out}


_FORWARD = nnx.jit(lambda model, x, cond, t, flow: model(x, cond, t, flow))


def _run(model, ref, flow=None):
    """Jitted forward (one compile per config; eager calls would re-trace the layer scan)."""
    return np.asarray(_FORWARD(model, jnp.asarray(ref["x"]), jnp.asarray(ref["cond"]), jnp.asarray(ref["t"]), flow))


@pytest.mark.parity
@pytest.mark.slow
def test_parity_vs_diffusers_from_saved_file(ref, tmp_path):
    sd = load_state_dict(ref["path"])
    params, extras = conv.from_diffusers(sd, CFG)
    np.testing.assert_array_equal(extras["text_proj.weight"], ref["sd"]["patch_embed.text_proj.weight"].numpy())
    model = conv.build_model(CFG, params, keep_init=("flow_embed", "lora"))
    out = _run(model, ref, flow=jnp.array([0.5, 40.0]))
    err = np.abs(out - ref["out"]).max()
    print(f"diffusers parity max abs diff {err:.3e} (|ref| max {np.abs(ref['out']).max():.3f})")
    assert err <= 2e-5
    # The orbax round trip of the converter's path (file -> state dict -> model -> orbax) gives the same network.
    converted, converted_extras = conv.convert_dit(load_state_dict(ref["path"]), CFG, "diffusers")
    assert sorted(converted_extras) == sorted(extras)
    conv.save_orbax(converted, str(tmp_path / "ckpt"))
    np.testing.assert_array_equal(_run(conv.load_orbax(str(tmp_path / "ckpt")), ref), _run(model, ref))


@pytest.mark.parity
@pytest.mark.slow
def test_block_parity_vs_diffusers_cogvideox_block():
    """One `DiTBlock` against diffusers' `CogVideoXBlock` (fp32, converted through `block_from_diffusers`)."""
    import torch
    from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock

    torch.manual_seed(1)
    tb = CogVideoXBlock(dim=32, num_attention_heads=2, attention_head_dim=16, time_embed_dim=16,
                        attention_bias=True, norm_eps=CFG.norm_eps).eval()
    with torch.no_grad():
        for p in tb.parameters():
            p.add_(0.1 * torch.randn_like(p))
    img, txt, temb = torch.randn(2, 24, 32), torch.randn(2, TEXT_LEN, 32), torch.randn(2, 16)
    with torch.no_grad():
        ref_img, ref_txt = (t.numpy() for t in tb(img, txt, temb))
    sd = {k: v.numpy() for k, v in tb.state_dict().items()}
    block = conv.load_params(DiTBlock(CFG, rngs=nnx.Rngs(0)), conv.block_from_diffusers(sd, "", CFG))
    got_txt, got_img = nnx.jit(lambda b, t, i, e: b(t, i, e))(block, *(jnp.asarray(a.numpy()) for a in (txt, img, temb)))
    err = max(np.abs(np.asarray(got_img) - ref_img).max(), np.abs(np.asarray(got_txt) - ref_txt).max())
    print(f"CogVideoXBlock parity max abs diff {err:.3e} (|ref| max {np.abs(ref_img).max():.2f})")
    assert err <= 1e-5


@pytest.mark.slow
def test_remat_policies_same_values_and_grads(ref):
    """Named remat policies of the block scan: "full" gives the forward and gradients of "none"; every
    policy puts its `jax.checkpoint` policy on the scanned block (traced, not compiled)."""
    from animegamer_jax.models import remat

    params, _ = conv.from_diffusers(ref["sd"], CFG)
    x, cond, t = (jnp.asarray(ref[k]) for k in ("x", "cond", "t"))

    def loss_and_grad(model):
        return nnx.value_and_grad(lambda m: jnp.mean(jnp.square(m(x, cond, t, None))))(model)

    models = {name: conv.build_model(dataclasses.replace(CFG, remat=name), params, keep_init=("flow_embed", "lora"))
              for name in remat.REMAT_POLICIES}
    out = {}
    for name in ("none", "full"):
        loss, grads = nnx.jit(loss_and_grad)(models[name])
        out[name] = (float(loss), np.asarray(grads["blocks"]["attn1"]["to_q"]["kernel"][...]))
    assert abs(out["full"][0] - out["none"][0]) <= 1e-6 * abs(out["none"][0])
    np.testing.assert_allclose(out["full"][1], out["none"][1], rtol=1e-5, atol=1e-7)
    assert np.abs(out["none"][1]).max() > 0

    def policies(model):
        graphdef, state = nnx.split(model)
        jaxpr = jax.make_jaxpr(lambda st: nnx.merge(graphdef, st)(x, cond, t, None))(state)
        found = []

        def walk(jp):
            jp = getattr(jp, "jaxpr", jp)  # ClosedJaxpr -> Jaxpr
            for eqn in jp.eqns:
                if eqn.primitive.name in ("checkpoint", "remat", "remat2"):
                    found.append(eqn.params.get("policy"))
                for v in eqn.params.values():
                    for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                        if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
                            walk(sub)
        walk(jaxpr)
        return found

    assert policies(models["none"]) == []
    assert policies(models["full"]) == [None]
    assert policies(models["save_dots"]) == [jax.checkpoint_policies.dots_with_no_batch_dims_saveable]
    assert len(policies(models["offload_dots"])) == 1 and policies(models["offload_dots"])[0] is not None
    assert DiTConfig(remat=True).remat == "full" and DiTConfig(remat=False).remat == "none"
    with pytest.raises(ValueError, match="unknown remat policy 'some'"):
        DiTConfig(remat="some")


def _to_sat(sd, cfg, rank, rng, scaling):
    """diffusers state dict -> SAT names (inverse of docs/dit.md#checkpoint-keys), with LoRA folded out.

    LoRA matrices are random and the `.original` base weights are W - scaling * B A, so merging
    them gives back the diffusers weights exactly (up to float rounding).
    """
    g = lambda k: sd[k].numpy().astype(np.float64)  # noqa: E731
    D = cfg.hidden_size
    P = "model.diffusion_model."
    out = {
        "time_embed.0.weight": g("time_embedding.linear_1.weight"), "time_embed.0.bias": g("time_embedding.linear_1.bias"),
        "time_embed.2.weight": g("time_embedding.linear_2.weight"), "time_embed.2.bias": g("time_embedding.linear_2.bias"),
        "mixins.patch_embed.proj.weight": g("patch_embed.proj.weight"), "mixins.patch_embed.proj.bias": g("patch_embed.proj.bias"),
        "transformer.final_layernorm.weight": g("norm_final.weight"), "transformer.final_layernorm.bias": g("norm_final.bias"),
        "mixins.final_layer.norm_final.weight": g("norm_out.norm.weight"),
        "mixins.final_layer.norm_final.bias": g("norm_out.norm.bias"),
        "mixins.final_layer.adaLN_modulation.1.weight": g("norm_out.linear.weight"),
        "mixins.final_layer.adaLN_modulation.1.bias": g("norm_out.linear.bias"),
        "mixins.final_layer.linear.weight": g("proj_out.weight"), "mixins.final_layer.linear.bias": g("proj_out.bias"),
        "mixins.pos_embed.pos_embedding": np.zeros((1, TEXT_LEN + 48, D)),
        "mixins.patch_embed.text_proj.0.weight": rng.standard_normal((D, TEXT_DIM)),
        "mixins.patch_embed.ip_proj.0.weight": rng.standard_normal((D, 7)),
        "mixins.patch_embed.txt_mix_layer_norm.weight": np.ones(D),
    }
    for n in (0, 2):
        out[f"flow_embed.{n}.weight"] = rng.standard_normal((cfg.time_embed_dim, D if n == 0 else cfg.time_embed_dim))
        out[f"flow_embed.{n}.bias"] = rng.standard_normal(cfg.time_embed_dim)
    for l in range(cfg.num_layers):
        b, t, a = f"transformer_blocks.{l}.", f"transformer.layers.{l}.", "mixins.adaln_layer."
        out[t + "input_layernorm.weight"] = g(b + "norm1.norm.weight")
        out[t + "input_layernorm.bias"] = g(b + "norm1.norm.bias")
        out[t + "post_attention_layernorm.weight"] = g(b + "norm2.norm.weight")
        out[t + "post_attention_layernorm.bias"] = g(b + "norm2.norm.bias")
        w1, w2 = g(b + "norm1.linear.weight").reshape(2, 3, D, -1), g(b + "norm2.linear.weight").reshape(2, 3, D, -1)
        b1, b2 = g(b + "norm1.linear.bias").reshape(2, 3, D), g(b + "norm2.linear.bias").reshape(2, 3, D)
        out[a + f"adaLN_modulations.{l}.1.weight"] = np.concatenate([w1[0], w2[0], w1[1], w2[1]]).reshape(12 * D, -1)
        out[a + f"adaLN_modulations.{l}.1.bias"] = np.concatenate([b1[0], b2[0], b1[1], b2[1]]).reshape(12 * D)
        qkv = [g(b + f"attn1.to_{n}.weight") for n in "qkv"]
        for i in range(3):
            A, B = rng.standard_normal((rank, D)), rng.standard_normal((D, rank))
            out[t + f"attention.query_key_value.matrix_A.{i}"], out[t + f"attention.query_key_value.matrix_B.{i}"] = A, B
            qkv[i] = qkv[i] - scaling * B @ A
        out[t + "attention.query_key_value.original.weight"] = np.concatenate(qkv)
        out[t + "attention.query_key_value.original.bias"] = np.concatenate([g(b + f"attn1.to_{n}.bias") for n in "qkv"])
        A, B = rng.standard_normal((rank, D)), rng.standard_normal((D, rank))
        out[t + "attention.dense.matrix_A.0"], out[t + "attention.dense.matrix_B.0"] = A, B
        out[t + "attention.dense.original.weight"] = g(b + "attn1.to_out.0.weight") - scaling * B @ A
        out[t + "attention.dense.original.bias"] = g(b + "attn1.to_out.0.bias")
        out[t + "mlp.dense_h_to_4h.weight"] = g(b + "ff.net.0.proj.weight")
        out[t + "mlp.dense_h_to_4h.bias"] = g(b + "ff.net.0.proj.bias")
        out[t + "mlp.dense_4h_to_h.weight"] = g(b + "ff.net.2.weight")
        out[t + "mlp.dense_4h_to_h.bias"] = g(b + "ff.net.2.bias")
        for ours, theirs in (("query_layernorm_list", "norm_q"), ("key_layernorm_list", "norm_k")):
            out[a + f"{ours}.{l}.weight"] = g(b + f"attn1.{theirs}.weight")
            out[a + f"{ours}.{l}.bias"] = g(b + f"attn1.{theirs}.bias")
    sat = {P + k: v for k, v in out.items()}
    sat["first_stage_model.encoder.conv_in.conv.weight"] = np.zeros(3)  # other engine parts are ignored
    return {"module": sat}


@pytest.mark.parity
@pytest.mark.slow
def test_sat_names_with_lora_convert_to_same_outputs(ref):
    rank, alpha = 4, 2.0
    rng = np.random.default_rng(0)
    sat = _to_sat(ref["sd"], CFG, rank, rng, alpha / rank)
    merged_cfg = dataclasses.replace(CFG, lora_alpha=alpha)
    params, extras = conv.from_sat(sat, merged_cfg)
    assert set(extras) == {"text_proj.0.weight", "ip_proj.0.weight", "txt_mix_layer_norm.weight"}
    np.testing.assert_allclose(params[("flow_embed", "linear_2_kernel")],
                               sat["module"]["model.diffusion_model.flow_embed.2.weight"].T, rtol=1e-6)
    merged = conv.build_model(merged_cfg, params)
    err_merged = np.abs(_run(merged, ref) - ref["out"]).max()

    lora_cfg = dataclasses.replace(merged_cfg, lora_rank=rank)
    lora_params, _ = conv.from_sat(sat, lora_cfg)
    lora_model = conv.build_model(lora_cfg, lora_params)
    err_lora = np.abs(_run(lora_model, ref) - ref["out"]).max()
    err_fold = np.abs(_run(merge_lora(lora_model), ref) - ref["out"]).max()
    print(f"SAT-name max abs diff: merged at conversion {err_merged:.2e}, LoRA kept {err_lora:.2e}, "
          f"merge_lora {err_fold:.2e}")
    assert max(err_merged, err_lora, err_fold) <= 2e-5
    with pytest.raises(conv.ConversionError, match="LoRA rank 4 does not match cfg.lora_rank 8"):
        conv.from_sat(sat, dataclasses.replace(CFG, lora_rank=8))


def test_converters_fail_loudly(ref):
    sd = ref["sd"]
    assert_names_bad_keys(lambda bad: conv.from_diffusers(bad, CFG), sd, drop=["transformer_blocks.1.attn1.to_k.weight"],
                          put={"transformer_blocks.0.attn1.extra.weight": sd["proj_out.bias"],
                               "norm_final.weight": sd["norm_final.weight"][:5]},
                          expect=["missing keys (1): ['transformer_blocks.1.attn1.to_k.weight']",
                                  "unexpected keys (1): ['transformer_blocks.0.attn1.extra.weight']",
                                  "norm_final.weight: got (5,), expected (32,)"])
    params, _ = conv.from_diffusers(ref["sd"], CFG)
    with pytest.raises(conv.ConversionError, match=r"missing \(\d+\): \[[^]]*flow_embed.linear_1_bias"):
        conv.build_model(CFG, params)
    with pytest.raises(conv.ConversionError, match="no LoRA"):
        conv.from_sat({"model.diffusion_model.time_embed.0.weight": np.zeros((16, 32))},
                      dataclasses.replace(CFG, lora_rank=4))


@pytest.mark.slow
def test_bf16_forward_close_to_fp32(ref):
    params, _ = conv.from_diffusers(ref["sd"], CFG)
    f32 = conv.build_model(CFG, params, keep_init=("flow_embed", "lora"))
    bf16 = conv.build_model(dataclasses.replace(CFG, dtype="bfloat16", param_dtype="bfloat16"), params,
                            keep_init=("flow_embed", "lora"))
    o32, o16 = _run(f32, ref), _run(bf16, ref).astype(np.float32)
    assert np.all(np.isfinite(o16))
    rel = np.linalg.norm(o16 - o32) / np.linalg.norm(o32)
    print(f"bf16 vs fp32 relative L2 error {rel:.3e}")
    assert rel < 3e-2


@pytest.mark.slow
def test_flow_embedding_zero_init_and_effect(ref):
    params, _ = conv.from_diffusers(ref["sd"], CFG)
    model = conv.build_model(dataclasses.replace(CFG, lora_rank=2), params, keep_init=("flow_embed", "lora"))
    base = _run(model, ref, jnp.array([0.5, 0.5]))
    np.testing.assert_array_equal(base, _run(model, ref, jnp.array([40.0, 15.0])))  # zero-init: no-op
    np.testing.assert_allclose(base, ref["out"], atol=2e-5)  # LoRA B = 0 at init: no-op
    model.flow_embed.linear_2_kernel[...] = jnp.full((16, 16), 0.05)
    moved = _run(model, ref, jnp.array([40.0, 15.0]))
    assert np.abs(moved - base).max() > 1e-3


@pytest.mark.slow
def test_flow_value_table():
    from configs import animegamer_2b_7b

    table = tuple(animegamer_2b_7b.get_config().dit.flow_table)
    got = np.asarray(flow_value(np.array([1, 2, 3, 4, 5, 0, -1, 9]), table))
    np.testing.assert_array_equal(got, [0.5, 2.5, 10.0, 15.0, 40.0, 40.0, 40.0, 40.0])
    assert float(flow_value(2, (0.5, 1.0, 5.0, 20.0, 40.0))) == 1.0  # app.py table


def test_trainable_filters():
    """The DiT's trainable sets (train.model.trainable_filter on a bare DiT, dit.TRAINABLE_SETS)."""
    model = CogVideoXDiT(dataclasses.replace(CFG, lora_rank=2), rngs=nnx.Rngs(0))

    def names(phase, dit_trainable="paper"):
        st = nnx.state(model, trainable_filter(phase, dit_trainable, component="dit"))
        return {".".join(str(p) for p in path) for path, _ in st.flat_state()}

    lora = {f"blocks.attn1.{n}.lora_{ab}" for n in ("to_q", "to_k", "to_v", "to_out") for ab in "ab"}
    flow = {f"flow_embed.linear_{i}_{k}" for i in (1, 2) for k in ("kernel", "bias")}
    assert names("a1") == names("a1", "all") == flow  # our a1: flow only, the DiT's LoRA stays frozen
    assert names("a2") == names("c") == lora | flow | {"blocks.adaln.kernel", "blocks.adaln.bias"}
    assert TRAINABLE_SETS["joint"] == TRAINABLE_SETS["adaptation"] == ("flow_embed", "adaln")
    assert TRAINABLE_SETS["warmup"] == ("flow_embed",)  # the release's a1 set, + LoRA
    every = {".".join(str(p) for p in path) for path, _ in nnx.state(model, nnx.Param).flat_state()}
    assert names("a2", "all") == every
    with pytest.raises(ValueError, match="trains \\('dit',\\), not 'mllm'"):
        trainable_filter("c", component="mllm")
    # The one LoRA (models/layers.py): a filter on lora.LoRAParam finds the DiT's factors too.
    assert {".".join(map(str, p)) for p, _ in nnx.state(model, lora_lib.LoRAParam).flat_state()} == lora


@pytest.mark.slow
def test_dit_in_jitted_guided_sampler():
    cfg = dataclasses.replace(CFG, lora_rank=2)
    model = CogVideoXDiT(cfg, rngs=nnx.Rngs(1))
    plan = samplers.make_plan(3, "dpmpp_2m", cfg_scale=6.0)

    @nnx.jit
    def generate(model, x, cond, uncond, flow, key):
        def denoise_fn(x, t, cb):
            return model(x, cb["cond"], t, cb["flow"])

        return samplers.sample(denoise_fn, x, {"cond": cond, "flow": flow}, {"cond": uncond, "flow": flow},
                               key, plan)

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1, FRAMES, 4, H, W)), jnp.float32)
    cond = jnp.asarray(rng.standard_normal((1, TEXT_LEN, 32)), jnp.float32)
    out = generate(model, x, cond, jnp.zeros_like(cond), jnp.array([2.5]), jax.random.key(2))
    assert out.shape == x.shape and np.all(np.isfinite(np.asarray(out)))


_EVAL_SHAPE_SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from animegamer_jax import parallel
    from animegamer_jax.models.cogvideox.dit import CogVideoXDiT, DiTConfig
    from configs import animegamer_2b_7b
    c = animegamer_2b_7b.get_config()
    cfg = DiTConfig.from_config(c.dit)
    abstract = nnx.eval_shape(lambda: CogVideoXDiT(cfg, rngs=nnx.Rngs(0)))
    state = nnx.state(abstract, nnx.Param)
    total = sum(int(np.prod(v.get_raw_value().shape)) for _, v in state.flat_state())
    lora = sum(int(np.prod(v.get_raw_value().shape)) for p, v in state.flat_state() if "lora" in str(p[-1]))
    print("PARAMS", total, lora)
    mesh = parallel.make_mesh((1, 4, 2, 1))
    sh = parallel.param_shardings(state, mesh, parallel.rules_from_config(c))
    flat = {".".join(str(getattr(k, "key", k)) for k in path): s
            for path, s in jax.tree_util.tree_flatten_with_path(sh)[0]}
    for name in ("blocks.attn1.to_q.kernel", "blocks.ff.proj_in.kernel", "blocks.attn1.to_out.kernel",
                 "blocks.attn1.to_q.lora_b", "patch_kernel"):
        key = [k for k in flat if k.startswith(name)][0]
        print("SPEC", name, tuple(flat[key].spec))
    out = jax.eval_shape(lambda m, x, c, t, f: m(x, c, t, f), abstract,
                         jax.ShapeDtypeStruct((2, 5, 16, 60, 90), jnp.float32),
                         jax.ShapeDtypeStruct((2, 226, 1920), jnp.float32),
                         jax.ShapeDtypeStruct((2,), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.float32))
    print("OUT", out.shape, out.dtype)

    # cond/uncond halves of one guided batch split over the data axis give the unsharded result.
    from animegamer_jax.diffusion import samplers
    fn = lambda x, t, cb: jnp.tanh(x + cb["c"]) * jnp.cos(t / 300.0)[:, None]
    plan = samplers.make_plan(4, "dpmpp_2m")
    x, cnd = jnp.ones((1, 6)), jnp.linspace(-1, 1, 6)[None]
    run = jax.jit(lambda x, c: samplers.sample(fn, x, {"c": c}, {"c": 0 * c}, jax.random.key(0), plan))
    plain = run(x, cnd)
    mesh2 = parallel.make_mesh((2, 4, 1, 1))
    with parallel.sharding_context(mesh2, parallel.rules_from_config(c)):
        txt = run.lower(x, cnd).as_text()
        sharded = run(x, cnd)
    print("SAMPLER_SHARDED", "sharding" in txt and "data" in txt or "devices=[2" in txt,
          float(jnp.abs(sharded - plain).max()))
""")


@pytest.mark.slow
def test_eval_shape_2b_params_and_shardings():
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    res = subprocess.run([sys.executable, "-c", _EVAL_SHAPE_SCRIPT], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = {ln.split(" ", 1)[0] + (" " + ln.split(" ")[1] if ln.startswith("SPEC") else ""): ln
             for ln in res.stdout.splitlines()}
    D, E, F, L, P, r = 1920, 512, 7680, 30, 2, 64
    per_block = 4 * D + E * 12 * D + 12 * D + D * 3 * D + 3 * D + 4 * 64 + D * D + D + D * F + F + F * D + D
    embed = 2 * (D * E + E + E * E + E)  # time + flow
    final = 2 * D + E * 2 * D + 2 * D + 2 * D + D * 16 * P * P + 16 * P * P
    base = 16 * P * P * D + D + embed + L * per_block + final
    lora = L * (3 * (D * r + r * D) + D * r + r * D)
    print(res.stdout)
    assert lines["PARAMS"] == f"PARAMS {base + lora} {lora}"
    assert base == 1_687_163_840 and lora == 29_491_200
    assert lines["SPEC blocks.attn1.to_q.kernel"].endswith("(None, 'fsdp', 'tensor', None)")
    assert lines["SPEC blocks.ff.proj_in.kernel"].endswith("(None, 'fsdp', 'tensor')")
    assert lines["SPEC blocks.attn1.to_out.kernel"].endswith("(None, 'tensor', None, 'fsdp')")
    assert lines["SPEC blocks.attn1.to_q.lora_b"].endswith("(None, None, 'tensor', None)")
    assert "OUT (2, 5, 16, 60, 90) bfloat16" in res.stdout  # config dtype
    flag, diff = lines["SAMPLER_SHARDED"].split()[1:]
    assert flag == "True" and float(diff) < 1e-6


def _legacy_blocks(new):
    """The pre-NNX-module flat block dict (fused q/k/v) holding the arrays of a new `blocks` dict."""
    a = new["attn1"]
    return {"norm1_scale": new["norm1"]["scale"], "norm1_bias": new["norm1"]["bias"],
              "norm2_scale": new["norm2"]["scale"], "norm2_bias": new["norm2"]["bias"],
              "adaln_kernel": new["adaln"]["kernel"], "adaln_bias": new["adaln"]["bias"],
              "qkv_kernel": np.stack([a[n]["kernel"] for n in ("to_q", "to_k", "to_v")], axis=2),
              "qkv_bias": np.stack([a[n]["bias"] for n in ("to_q", "to_k", "to_v")], axis=1),
              "qkv_lora_a": np.stack([a[n]["lora_a"] for n in ("to_q", "to_k", "to_v")], axis=1),
              "qkv_lora_b": np.stack([a[n]["lora_b"] for n in ("to_q", "to_k", "to_v")], axis=1),
              "q_norm_scale": a["norm_q"]["scale"], "q_norm_bias": a["norm_q"]["bias"],
              "k_norm_scale": a["norm_k"]["scale"], "k_norm_bias": a["norm_k"]["bias"],
              "out_kernel": a["to_out"]["kernel"], "out_bias": a["to_out"]["bias"],
              "out_lora_a": a["to_out"]["lora_a"], "out_lora_b": a["to_out"]["lora_b"],
              "mlp_in_kernel": new["ff"]["proj_in"]["kernel"], "mlp_in_bias": new["ff"]["proj_in"]["bias"],
              "mlp_out_kernel": new["ff"]["proj_out"]["kernel"], "mlp_out_bias": new["ff"]["proj_out"]["bias"]}


def test_migrate_legacy_blocks_same_arrays_new_nesting():
    """Old flat stacked block dicts (fused q/k/v) map onto the `DiTBlock` nesting array for array."""
    abstract = nnx.eval_shape(lambda: CogVideoXDiT(dataclasses.replace(CFG, lora_rank=2), rngs=nnx.Rngs(3)))
    rng = np.random.default_rng(3)
    new = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32),
                       nnx.state(abstract, nnx.Param).to_pure_dict()["blocks"])
    legacy = _legacy_blocks(new)
    assert legacy["qkv_kernel"].shape == (2, 32, 3, 2, 16)  # the old [L, D, 3, N, H]
    assert conv.is_legacy_blocks(legacy) and not conv.is_legacy_blocks(new)
    got = conv.migrate_legacy_blocks(legacy)
    flat = lambda t: {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(t)[0]}  # noqa: E731
    assert flat(got).keys() == flat(new).keys()
    for k, v in flat(new).items():
        np.testing.assert_array_equal(flat(got)[k], v, err_msg=k)
    with pytest.raises(conv.ConversionError, match=r"unknown names \['adaln', 'attn1', 'ff', 'norm1', 'norm2'\]"):
        conv.migrate_legacy_blocks(new)


@pytest.mark.slow
def test_migrate_system_checkpoint_end_to_end(tmp_path):
    """An old-layout system checkpoint fails to load with the fix named; after migration it loads
    with the same arrays."""
    from animegamer_jax import checkpoint, parallel
    from animegamer_jax.config import load_config
    from animegamer_jax.convert.migrate import migrate_system_checkpoint

    config = load_config("configs/tiny.py")
    mesh = parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1])
    _, target, _ = checkpoint.abstract_component("dit", config, mesh)
    rng = np.random.default_rng(0)
    pure = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype), checkpoint.pure_dict(target))
    old = dict(pure, blocks=_legacy_blocks(pure["blocks"]))
    src = checkpoint.save_system(str(tmp_path / "old"), {"dit": old}, config)
    with pytest.raises(checkpoint.SystemCheckpointError, match="old flat block layout.*convert dit migrate"):
        checkpoint.load_system(src, names=["dit"])
    dst = migrate_system_checkpoint(src, str(tmp_path / "new"))
    got = nnx.state(checkpoint.load_system(dst, names=["dit"])["dit"], nnx.Param).to_pure_dict()
    flat = lambda t: {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(t)[0]}  # noqa: E731
    want = flat(pure)
    assert flat(got).keys() == want.keys()
    for k, v in flat(got).items():
        np.testing.assert_array_equal(v, want[k], err_msg=k)
    with pytest.raises(conv.ConversionError, match="already in the NNX module layout"):
        migrate_system_checkpoint(dst, str(tmp_path / "again"))


@pytest.mark.slow
def test_prepare_for_inference_merges_and_casts():
    """Play's one-time weight preparation: LoRA merged + cast; fp32 result equals the unmerged model."""
    from animegamer_jax.models.cogvideox.dit import prepare_for_inference
    from animegamer_jax.models.layers import LoRAParam

    cfg = dataclasses.replace(CFG, lora_rank=4, lora_alpha=2.0)
    model = CogVideoXDiT(cfg, rngs=nnx.Rngs(3))
    state = nnx.state(model, LoRAParam)  # B starts at zero: give the adapters a real effect
    nnx.update(model, jax.tree.map(lambda a: a + 0.05 * jnp.cos(jnp.arange(a.size, dtype=a.dtype)).reshape(a.shape),
                                   state))
    r = np.random.default_rng(1)
    x = jnp.asarray(r.normal(size=(2, FRAMES, 4, H, W)), jnp.float32)
    cond = jnp.asarray(r.normal(size=(2, TEXT_LEN, 32)), jnp.float32)
    t, flow = jnp.asarray([999, 37]), jnp.asarray([2.5, 10.0])
    want = np.asarray(_FORWARD(model, x, cond, t, flow))
    fp32 = prepare_for_inference(model, jnp.float32)
    assert fp32.cfg.lora_rank == 0 and not jax.tree.leaves(nnx.state(fp32, LoRAParam))
    np.testing.assert_allclose(np.asarray(_FORWARD(fp32, x, cond, t, flow)), want, atol=1e-5, rtol=0)
    bf16 = prepare_for_inference(model, jnp.bfloat16)
    assert {a.dtype for a in jax.tree.leaves(nnx.state(bf16, nnx.Param))} == {jnp.dtype(jnp.bfloat16)}
    assert bf16.cfg.param_dtype == "bfloat16" and model.cfg.lora_rank == 4  # the input is left alone


@pytest.mark.slow
def test_cfg_and_context_parallel_sampling_equals_one_device():
    """One game on 8 fake devices in play's latency layout (inference/layout.py apply_layout: CFG halves on
    `data` (2), the joint text+video sequence on `context` (4), weights sharded over all 8), through
    play's own sampler (inference/clip_sampler.py dit_sampler, batch 1, no filler rows): the sampled latents equal
    the 1-device result within 1e-5, K/V are all-gathered (context parallel attention), the
    weights are split 8 ways, and each device does about 1/8 of the compiled FLOPs."""
    from tests.subproc import run_python

    out = run_python("""
        import jax, jax.numpy as jnp, numpy as np
        jax.config.update("jax_default_matmul_precision", "highest")
        from flax import nnx
        from animegamer_jax import parallel
        from animegamer_jax.config import load_config
        from animegamer_jax.inference.mode import apply_mode
        from animegamer_jax.inference.layout import apply_layout
        from animegamer_jax.inference.clip_sampler import dit_sampler
        from animegamer_jax.models.cogvideox.dit import CogVideoXDiT, DiTConfig

        cfg = apply_mode(load_config("configs/tiny.py", [
            "dit.hidden_size=32", "dit.num_heads=2", "dit.head_dim=16", "dit.time_embed_dim=16", "dit.lora_rank=0",
            # 4 latent channels: keeps the replicated patch embedding / proj_out small beside the sharded blocks
            "dit.in_channels=4", "dit.out_channels=4", "dit.num_latent_frames=2", "dit.sample_height=8", "dit.sample_width=8", "dit.attention_impl=blockwise",
            "rep.dim=32", "rep.num_text_tokens=4", "rep.num_image_tokens=4", "diffusion.num_sampling_steps=2"]))
        g, st = nnx.split(CogVideoXDiT(DiTConfig.from_config(cfg.dit, text_length=8), rngs=nnx.Rngs(0)))
        sample = dit_sampler(g, cfg)  # 8 text + 2 x 4 x 4 = 40 tokens
        r = np.random.default_rng(0)
        rep, unc = jnp.asarray(r.normal(size=(1, 8, 32)), jnp.float32), jnp.asarray(r.normal(size=(8, 32)), jnp.float32)
        ml, keys = jnp.asarray([2], jnp.int32), jnp.asarray([[0, 7]], jnp.uint32)
        run = lambda st, unc, rep, ml, keys: sample({"dit": st, "uncond": unc}, rep, ml, keys)  # noqa: E731

        one = jax.jit(run).lower(st, unc, rep, ml, keys).compile()
        ref = np.asarray(one(st, unc, rep, ml, keys))
        lat = apply_layout(cfg, "latency", 8)
        mesh, rules = parallel.mesh_from_config(lat), parallel.rules_from_config(lat)
        assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 1, "context": 4}, mesh.shape
        st8 = jax.device_put(st, parallel.param_shardings(st, mesh, rules))  # as GameEngine places them
        w = st8["blocks"]["attn1"]["to_q"]["kernel"][...]
        split = w.addressable_shards[0].data.size * 8 == w.size
        with parallel.sharding_context(mesh, rules):
            par = jax.jit(run).lower(st8, unc, rep, ml, keys).compile()
            out = np.asarray(par(st8, unc, rep, ml, keys))
        ratio = par.cost_analysis()["flops"] * 8 / one.cost_analysis()["flops"]
        print("RESULT", float(np.abs(out - ref).max()), "all-gather" in par.as_text(), split, ratio)
    """)
    diff, gathered, split, ratio = out.split("RESULT")[1].split()
    assert float(diff) <= 1e-5 and gathered == "True" and split == "True"
    assert float(ratio) <= 1.3, f"per-device FLOPs x 8 / one-device FLOPs = {ratio}"
