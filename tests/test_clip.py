"""CLIP parity vs HF CLIPModel / CLIPVisionModel (tiny, fp32) through our converter, open_clip
names, loud conversion errors, preprocessing vs a torch reimplementation, full-size eval_shape."""

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import jax
import jax.numpy as jnp

from animegamer_jax.models.clip import convert as clip_convert
from animegamer_jax.models.clip import model as clip_model
from tests.convert_checks import assert_names_bad_keys

VOCAB, CTX, EOT = 100, 16, 99


def _hf_clip(act: str):
    torch.manual_seed(0)
    v = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, image_size=32,
             patch_size=8, hidden_act=act)
    t = dict(hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, vocab_size=VOCAB,
             max_position_embeddings=CTX, hidden_act=act, eos_token_id=EOT, bos_token_id=0, pad_token_id=1)
    cfg = transformers.CLIPConfig(text_config=t, vision_config=v, projection_dim=16)
    model = transformers.CLIPModel(cfg).eval()
    # Random init leaves LayerNorms at identity and biases at 0; perturb so they are tested.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or "class_embedding" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _open_clip_names(sd: dict) -> dict:
    """Lays an HF CLIPModel state dict out under open_clip's parameter names."""
    out = {}

    def blocks(src, dst, n):
        for i in range(n):
            s, d = f"{src}.encoder.layers.{i}.", f"{dst}.resblocks.{i}."
            out[d + "attn.in_proj_weight"] = torch.cat([sd[s + f"self_attn.{x}_proj.weight"] for x in "qkv"])
            out[d + "attn.in_proj_bias"] = torch.cat([sd[s + f"self_attn.{x}_proj.bias"] for x in "qkv"])
            for w in ("weight", "bias"):
                out[d + f"attn.out_proj.{w}"] = sd[s + f"self_attn.out_proj.{w}"]
                out[d + f"ln_1.{w}"] = sd[s + f"layer_norm1.{w}"]
                out[d + f"ln_2.{w}"] = sd[s + f"layer_norm2.{w}"]
                out[d + f"mlp.c_fc.{w}"] = sd[s + f"mlp.fc1.{w}"]
                out[d + f"mlp.c_proj.{w}"] = sd[s + f"mlp.fc2.{w}"]

    out["visual.conv1.weight"] = sd["vision_model.embeddings.patch_embedding.weight"]
    out["visual.class_embedding"] = sd["vision_model.embeddings.class_embedding"]
    out["visual.positional_embedding"] = sd["vision_model.embeddings.position_embedding.weight"]
    for w in ("weight", "bias"):
        out[f"visual.ln_pre.{w}"] = sd[f"vision_model.pre_layrnorm.{w}"]
        out[f"visual.ln_post.{w}"] = sd[f"vision_model.post_layernorm.{w}"]
        out[f"ln_final.{w}"] = sd[f"text_model.final_layer_norm.{w}"]
    blocks("vision_model", "visual.transformer", 3)
    blocks("text_model", "transformer", 2)
    out["visual.proj"] = sd["visual_projection.weight"].T
    out["token_embedding.weight"] = sd["text_model.embeddings.token_embedding.weight"]
    out["positional_embedding"] = sd["text_model.embeddings.position_embedding.weight"]
    out["text_projection"] = sd["text_projection.weight"].T
    out["logit_scale"] = sd["logit_scale"]
    out["attn_mask"] = torch.full((CTX, CTX), float("-inf")).triu(1)  # open_clip buffer, not a param
    return out


def _inputs():
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)  # NCHW for torch
    ids = rng.integers(2, EOT, size=(3, 10))
    for row, pos in enumerate((9, 4, 6)):
        ids[row, pos] = EOT
        ids[row, pos + 1:] = 1
    return pixels, ids


def _ours(model, pixels, ids):
    @nnx.jit
    def run(m, x, t):
        return m.visual(x, m.cfg.vision_layers - 1), m.visual.patch_tokens(x), m.encode_image(x, True), m.encode_text(t, True), m(x, t)

    return jax.tree.map(np.asarray, run(model, jnp.asarray(pixels.transpose(0, 2, 3, 1)), jnp.asarray(ids, jnp.int32)))


@pytest.mark.parity
@pytest.mark.slow
def test_clip_parity_hf_and_open_clip_names():
    # exact GELU here (laion2b); the vision-model test below covers quick_gelu (OpenAI CLIP).
    act = "gelu"
    hf = _hf_clip(act)
    pixels, ids = _inputs()
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids), pixel_values=torch.tensor(pixels), output_hidden_states=True)
    ref_pen = out.vision_model_output.hidden_states[-2].numpy()
    cfg = clip_convert.config_from_hf(hf.config.to_dict())
    assert cfg.hidden_act == act and cfg.eot_token_id == EOT
    sd = hf.state_dict()
    results = {}
    for layout, src in (("hf", sd), ("open_clip", _open_clip_names(sd))):
        assert clip_convert.detect_layout(src) == layout
        model = clip_convert.load_clip(src, cfg)
        pen, patches, img, txt, logits = _ours(model, pixels, ids)
        results[layout] = dict(
            pen=np.abs(pen - ref_pen).max(),
            img=np.abs(img - out.image_embeds.numpy()).max(),
            txt=np.abs(txt - out.text_embeds.numpy()).max(),
            logits=np.abs(logits - out.logits_per_image.numpy()).max() / np.abs(out.logits_per_image.numpy()).max(),
        )
        np.testing.assert_array_equal(patches, pen[:, 1:])
        assert patches.shape == (2, 16, 32)
    for layout, errs in results.items():
        for k, e in errs.items():
            assert e <= 1e-5, (layout, k, e)


@pytest.mark.parity
@pytest.mark.slow
def test_clip_vision_model_parity_and_argmax_pooling():
    hf = _hf_clip("quick_gelu")
    pixels, ids = _inputs()
    vis = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**hf.config.vision_config.to_dict())).eval()
    vis.load_state_dict(hf.vision_model.state_dict())  # transformers 5: no vision_model. prefix
    with torch.no_grad():
        ref = vis(pixel_values=torch.tensor(pixels), output_hidden_states=True).hidden_states[-2][:, 1:].numpy()
    cfg = clip_convert.config_from_hf(hf.config.to_dict())
    tower = clip_convert.load_clip(vis.state_dict(), cfg, vision_only=True)
    assert isinstance(tower, clip_model.CLIPVisionTransformer)
    got = np.asarray(nnx.jit(lambda m, x: m.patch_tokens(x))(tower, jnp.asarray(pixels.transpose(0, 2, 3, 1))))
    assert np.abs(got - ref).max() <= 1e-5
    # The vision tower also loads from a full checkpoint (text keys skipped on purpose), and
    # without the vision_model. prefix.
    full = clip_convert.convert_clip(hf.state_dict(), cfg, vision_only=True)
    assert not any(k.startswith("vision_model.") for k in vis.state_dict())
    bare = clip_convert.convert_clip(vis.state_dict(), cfg, vision_only=True)
    np.testing.assert_array_equal(np.asarray(full["conv1"][...]), np.asarray(bare["conv1"][...]))
    # open_clip pooling (argmax of ids) equals first-EOT pooling when EOT is the largest id.
    import dataclasses

    model = clip_convert.load_clip(hf.state_dict(), dataclasses.replace(cfg, eot_token_id=None))
    model_eot = clip_convert.load_clip(hf.state_dict(), cfg)
    t = jnp.asarray(ids, jnp.int32)
    np.testing.assert_allclose(np.asarray(model.encode_text(t)), np.asarray(model_eot.encode_text(t)), atol=0)


def test_converter_is_loud():
    hf = _hf_clip("gelu")
    cfg = clip_convert.config_from_hf(hf.config.to_dict())
    sd = dict(hf.state_dict())
    assert_names_bad_keys(lambda bad: clip_convert.convert_clip(bad, cfg), sd, drop=["vision_model.encoder.layers.1.mlp.fc1.bias"],
                          put={"vision_model.extra.weight": torch.zeros(3), "text_projection.weight": torch.zeros(16, 8)},
                          expect=["missing source keys (1): ['vision_model.encoder.layers.1.mlp.fc1.bias']",
                                  "unexpected source keys (1): ['vision_model.extra.weight']",
                                  "text_projection: source gives (8, 16), model expects (24, 16)"])
    oc = _open_clip_names(sd)
    del oc["visual.positional_embedding"]
    with pytest.raises(clip_convert.ConversionError, match=r"visual\.positional_embedding"):
        clip_convert.convert_clip(oc, cfg)
    with pytest.raises(clip_convert.ConversionError, match="layout"):
        clip_convert.convert_clip(sd, cfg, layout="sat")
    with pytest.raises(ValueError, match="hidden_act"):
        clip_model.CLIPConfig(hidden_act="relu")


def test_config_from_open_clip_reads_activation():
    vit_b16 = {"embed_dim": 512, "vision_cfg": {"image_size": 224, "layers": 12, "width": 768, "patch_size": 16},
               "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "layers": 12}}
    cfg = clip_convert.config_from_open_clip(vit_b16)
    assert (cfg.hidden_act, cfg.vision_heads, cfg.vision_mlp_dim, cfg.text_mlp_dim) == ("gelu", 12, 3072, 2048)
    assert clip_convert.config_from_open_clip({**vit_b16, "quick_gelu": True}).hidden_act == "quick_gelu"


def _torch_preprocess(x: torch.Tensor, size: int, method: str) -> torch.Tensor:
    """Torch reimplementation: the release's kornia resize (diffusers keeps a verbatim copy of it)
    or torch's antialiased bicubic, then [-1, 1] -> [0, 1] -> CLIP mean/std."""
    if method == "kornia":
        from diffusers.pipelines.stable_video_diffusion.pipeline_stable_video_diffusion import _resize_with_antialiasing

        x = _resize_with_antialiasing(x, (size, size))
    else:
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bicubic", align_corners=False, antialias=True)
    x = (x + 1.0) / 2.0
    mean = torch.tensor(clip_model.CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(clip_model.CLIP_STD).view(1, 3, 1, 1)
    return (x - mean) / std


@pytest.mark.parametrize("method,hw,size", [("kornia", (480, 720), 224), ("kornia", (30, 20), 32), ("jax", (96, 144), 32)])
@pytest.mark.slow
def test_preprocess_matches_torch_reimplementation(method, hw, size):
    rng = np.random.default_rng(1)
    # Smooth image (like a frame) plus noise, in [-1, 1].
    yy, xx = np.mgrid[0:hw[0], 0:hw[1]] / (hw[0] / 5)
    img = np.stack([np.sin(xx + c) * np.cos(yy - c) for c in range(3)], -1)[None] * 0.8
    img = np.clip(img + 0.1 * rng.standard_normal(img.shape), -1, 1).astype(np.float32)
    ours = np.asarray(jax.jit(clip_model.preprocess, static_argnums=(1, 2))(jnp.asarray(img), size, method))
    ref = _torch_preprocess(torch.tensor(img.transpose(0, 3, 1, 2)), size, method).numpy().transpose(0, 2, 3, 1)
    assert ours.shape == (1, size, size, 3)
    assert np.abs(ours - ref).max() <= 1e-3 * (0.1 if method == "kornia" else 1)


def test_preprocess_constants_and_errors():
    grey = np.asarray(clip_model.preprocess(jnp.zeros((1, 32, 32, 3)), 32))[0, 0, 0]
    np.testing.assert_allclose(grey, (0.5 - np.array(clip_model.CLIP_MEAN)) / np.array(clip_model.CLIP_STD), rtol=1e-6)
    # Each resize row is a partition of unity (a constant image stays constant).
    np.testing.assert_allclose(clip_model.kornia_resize_matrix(720, 224).sum(1), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="resize method"):
        clip_model.preprocess(jnp.zeros((1, 8, 8, 3)), 4, "pil")


def test_full_size_eval_shape():
    from configs import animegamer_2b_7b

    cfg = clip_model.CLIPConfig.from_config(animegamer_2b_7b.get_config().clip)
    model = nnx.eval_shape(lambda: clip_model.CLIP(cfg, rngs=nnx.Rngs(0)))
    n_vis = sum(x.size for x in jax.tree.leaves(nnx.state(model.visual, nnx.Param)))
    n_all = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    # open_clip ViT-B-16: 86,192,640 visual params incl. the 768x512 proj; 149,620,737 in all.
    assert n_vis == 86_192_640 - 768 * 512
    assert n_all == 149_620_737
    out = jax.eval_shape(lambda m, x: m.visual.encode_reference(x), model, jax.ShapeDtypeStruct((2, 480, 720, 3), jnp.float32))
    assert out.shape == (2, 196, 768) and out.dtype == jnp.bfloat16
    spec = model.visual.blocks.attn.q_kernel.get_metadata().get("out_sharding")
    assert tuple(spec) == ("layers", "embed", "heads", "head_dim")
