"""Shot encoder E_a: parity vs a torch reimplementation of the release's mixin path (weights through
our converter under SAT names), uncond embedding, full-size eval_shape, end-to-end tiny features."""

import numpy as np
import pytest
import torch
from flax import nnx

import jax
import jax.numpy as jnp

from animegamer_jax.models.shot_encoder import convert as shot_encoder_convert
from animegamer_jax.weights import ConversionError
from animegamer_jax.models.shot_encoder import model as shot_encoder_model
from tests.random_weights import normal_model

CFG = shot_encoder_model.ShotEncoderConfig(dim=24, text_dim=16, image_dim=12, num_text_tokens=5, num_image_tokens=9)


class TorchMix(torch.nn.Module):
    """The release's ImagePatchEmbeddingMixin text/ip path (ip_hidden_size=768, no attention mix)."""

    def __init__(self, c):
        super().__init__()
        self.text_proj = torch.nn.Sequential(torch.nn.Linear(c.text_dim, c.dim), torch.nn.GELU(), torch.nn.Linear(c.dim, c.dim))
        self.ip_proj = torch.nn.Sequential(torch.nn.Linear(c.image_dim, c.dim), torch.nn.GELU(), torch.nn.Linear(c.dim, c.dim))
        self.txt_mix_layer_norm = torch.nn.LayerNorm(c.dim)
        self.ip_mix_layer_norm = torch.nn.LayerNorm(c.dim)
        self.output_mix_layer_norm = torch.nn.LayerNorm(c.dim)

    def forward(self, crossattn, ip):
        return torch.cat([self.txt_mix_layer_norm(self.text_proj(crossattn)), self.ip_mix_layer_norm(self.ip_proj(ip))], 1)


def _torch_ref():
    torch.manual_seed(0)
    ref = TorchMix(CFG).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    sd = {shot_encoder_convert.SAT_PREFIX + k: v for k, v in ref.state_dict().items()}
    sd[shot_encoder_convert.SAT_PREFIX + "proj.weight"] = torch.zeros(24, 16, 2, 2)  # patch conv: not E_a
    sd["model.diffusion_model.transformer.layers.0.attention.dense.weight"] = torch.zeros(2, 2)
    return ref, sd


@pytest.mark.parity
def test_parity_and_uncond():
    ref, sd = _torch_ref()
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: shot_encoder_model.ShotEncoder(CFG, rngs=nnx.Rngs(0))))
    model = nnx.merge(graphdef, jax.tree.map(jnp.asarray, shot_encoder_convert.convert_shot_encoder(sd, CFG)))
    rng = np.random.default_rng(0)
    t = rng.standard_normal((2, 5, 16)).astype(np.float32)
    i = rng.standard_normal((2, 9, 12)).astype(np.float32)
    with torch.no_grad():
        want = ref(torch.tensor(t), torch.tensor(i)).numpy()
        want_u = ref(torch.zeros(1, 5, 16), torch.zeros(1, 9, 12)).numpy()
    got = np.asarray(model(jnp.asarray(t), jnp.asarray(i)))
    assert got.shape == (2, 14, 24)
    assert np.abs(got - want).max() <= 1e-5
    u = np.asarray(model.uncond(3))
    assert u.shape == (3, 14, 24)
    assert np.abs(u - want_u).max() <= 1e-5
    # Two constant rows from the biases, not zeros (docs/encoders.md#unconditional-embedding).
    np.testing.assert_allclose(u[:, :5], np.broadcast_to(u[:1, :1], (3, 5, 24)), atol=1e-6)
    np.testing.assert_allclose(u[:, 5:], np.broadcast_to(u[:1, 5:6], (3, 9, 24)), atol=1e-6)
    assert np.abs(u).max() > 0.1 and np.abs(u[0, 0] - u[0, 5]).max() > 1e-3
    # Text first: the text half depends only on f_md.
    got2 = np.asarray(model(jnp.asarray(t), jnp.asarray(i[::-1])))
    np.testing.assert_array_equal(got2[:, :5], got[:, :5])


def test_converter_is_loud():
    _, sd = _torch_ref()
    del sd[shot_encoder_convert.SAT_PREFIX + "ip_proj.2.bias"]
    sd[shot_encoder_convert.SAT_PREFIX + "mix_proj.weight"] = torch.zeros(226, 483)
    sd[shot_encoder_convert.SAT_PREFIX + "text_proj.0.weight"] = torch.zeros(24, 15)
    with pytest.raises(ConversionError) as e:
        shot_encoder_convert.convert_shot_encoder(sd, CFG)
    msg = str(e.value)
    assert "ip_proj.2.bias" in msg and "mix_proj.weight" in msg
    assert "text_proj.fc_in.kernel: source gives (15, 24), model expects (16, 24)" in msg
    with pytest.raises(ValueError, match="widths"):
        shot_encoder_model.ShotEncoder(CFG, rngs=nnx.Rngs(0))(jnp.zeros((1, 5, 12)), jnp.zeros((1, 9, 12)))


def test_full_size_eval_shape():
    from configs import animegamer_2b_7b

    cfg = shot_encoder_model.ShotEncoderConfig.from_config(animegamer_2b_7b.get_config())
    model = nnx.eval_shape(lambda: shot_encoder_model.ShotEncoder(cfg, rngs=nnx.Rngs(0)))
    out = jax.eval_shape(lambda m, t, i: m(t, i), model, jax.ShapeDtypeStruct((4, 30, 4096), jnp.float32),
                         jax.ShapeDtypeStruct((4, 196, 768), jnp.float32))
    assert out.shape == (4, 226, 1920)
    assert jax.eval_shape(lambda m: m.uncond(2), model).shape == (2, 226, 1920)
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert n == (4096 * 1920 + 1920 + 1920 * 1920 + 1920) + (768 * 1920 + 1920 + 1920 * 1920 + 1920) + 4 * 1920


def test_tiny_end_to_end_from_frames_and_text():
    """tiny config: frame -> CLIP f_v, text -> T5 f_md, -> E_a (B, 8 + 16, 64)."""
    from animegamer_jax.models.clip.model import CLIPConfig, CLIPVisionTransformer
    from animegamer_jax.models.t5.model import T5Config, T5Encoder
    from animegamer_jax.tokenizers.t5_tokenizer import T5Tokenizer
    from configs import tiny

    c = tiny.get_config()
    clip = normal_model(lambda: CLIPVisionTransformer(CLIPConfig.from_config(c.clip), rngs=nnx.Rngs(0)), 0)
    t5 = normal_model(lambda: T5Encoder(T5Config.from_config(c.t5), rngs=nnx.Rngs(0)), 1)
    ea = normal_model(lambda: shot_encoder_model.ShotEncoder.from_config(c, rngs=nnx.Rngs(0)), 2)
    ids = T5Tokenizer(c.t5.spiece_model, c.t5.max_length)(["the cat run forward", "sit down"])
    frames = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (2, 48, 72, 3)), jnp.float32)

    @nnx.jit
    def run(clip, t5, ea, frames, ids):
        return ea(t5(ids), clip.encode_reference(frames))

    s_a = run(clip, t5, ea, frames, jnp.asarray(ids))
    assert s_a.shape == (2, c.rep.num_text_tokens + c.rep.num_image_tokens, c.rep.dim)
    assert bool(jnp.isfinite(s_a).all())
