"""CogVideoX VAE converters (diffusers safetensors, SAT 3d-vae.pt, orbax) and full-size shapes."""

import re

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from animegamer_jax.weights import ConversionError, load_state_dict, restore_state, save_state
from animegamer_jax.models.cogvideox.vae_convert import (
    build_vae,
    convert_vae,
    detect_format,
    diffusers_to_state,
    sat_to_diffusers_keys,
)
from animegamer_jax.models.cogvideox.vae import CogVideoXVAE, VAEConfig, count_params
from tests.convert_checks import assert_names_bad_keys

TINY = dict(block_out_channels=(8, 8, 16, 16), latent_channels=4, layers_per_block=1, norm_num_groups=4)


@pytest.fixture(scope="module")
def ref_sd():
    from diffusers import AutoencoderKLCogVideoX

    torch.manual_seed(0)
    return AutoencoderKLCogVideoX(**TINY).state_dict()


def _to_sat(sd, num_levels=4):
    """diffusers -> SAT names, written independently of the converter (inverse of docs/vae.md#checkpoint-keys)."""
    out = {}
    for k, v in sd.items():
        m = re.match(r"decoder\.up_blocks\.(\d+)\.(.*)", k)
        if m:
            k = f"decoder.up.{num_levels - 1 - int(m.group(1))}.{m.group(2)}"
        k = re.sub(r"(encoder|decoder)\.mid_block\.resnets\.(\d)", lambda g: f"{g[1]}.mid.block_{int(g[2]) + 1}", k)
        k = k.replace("down_blocks.", "down.").replace("resnets.", "block.").replace("downsamplers.0", "downsample")
        k = k.replace("upsamplers.0", "upsample").replace("conv_shortcut", "nin_shortcut")
        out[k] = v.half()  # the release ships fp16-able weights; the converter upcasts
    out["loss.logvar"] = torch.zeros(())
    out["loss.discriminator.conv.weight"] = torch.zeros(3)
    return out


def _flat(state):
    return {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(state)}


@pytest.mark.slow
def test_diffusers_layouts(ref_sd):
    state = _flat(diffusers_to_state(ref_sd, VAEConfig(**TINY)))
    k = ref_sd["encoder.down_blocks.1.resnets.0.conv1.conv.weight"].numpy()
    np.testing.assert_array_equal(state[("encoder", "down_blocks", 1, "resnets", 0, "conv1", "conv", "kernel")], k.transpose(2, 3, 4, 1, 0))
    k = ref_sd["decoder.up_blocks.0.upsamplers.0.conv.weight"].numpy()
    np.testing.assert_array_equal(state[("decoder", "up_blocks", 0, "upsamplers", 0, "conv", "kernel")], k.transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(
        state[("decoder", "norm_out", "norm_layer", "scale")], ref_sd["decoder.norm_out.norm_layer.weight"].numpy()
    )
    assert len(state) == len(ref_sd)


@pytest.mark.slow
def test_sat_file_to_orbax_matches_diffusers(ref_sd, tmp_path):
    sat = _to_sat(ref_sd)
    assert "decoder.up.3.block.0.norm1.conv_y.conv.weight" in sat and "encoder.mid.block_2.conv2.conv.weight" in sat
    torch.save({"state_dict": sat}, tmp_path / "3d-vae.pt")
    cfg = VAEConfig(**TINY)
    assert detect_format(str(tmp_path / "3d-vae.pt")) == "sat" and detect_format(str(tmp_path)) == "diffusers"
    got = convert_vae(load_state_dict(str(tmp_path / "3d-vae.pt")), cfg, "sat")
    save_state(got, str(tmp_path / "orbax"))
    want = _flat(diffusers_to_state({k: v.half() for k, v in ref_sd.items()}, cfg))
    got_flat = _flat(got)
    assert got_flat.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got_flat[k], want[k])
    restored = _flat(restore_state(nnx.eval_shape(lambda: CogVideoXVAE(cfg, rngs=nnx.Rngs(0))), str(tmp_path / "orbax")))
    for k in want:
        np.testing.assert_array_equal(restored[k], want[k])
    # SAT engine checkpoints carry a first_stage_model. prefix.
    prefixed = {f"first_stage_model.{k}": v for k, v in load_state_dict(str(tmp_path / "3d-vae.pt")).items()}
    assert set(sat_to_diffusers_keys(prefixed)) == set(ref_sd)


@pytest.mark.slow
def test_diffusers_safetensors_file(ref_sd, tmp_path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in ref_sd.items()}, tmp_path / "diffusion_pytorch_model.safetensors")
    cfg = VAEConfig(**TINY)
    model = build_vae(cfg, diffusers_to_state(load_state_dict(str(tmp_path)), cfg))
    np.testing.assert_array_equal(
        np.asarray(model.encoder.conv_out.conv.bias[...]), ref_sd["encoder.conv_out.conv.bias"].numpy()
    )


@pytest.mark.slow
def test_mismatch_is_loud(ref_sd):
    cfg = VAEConfig(**TINY)
    assert_names_bad_keys(lambda bad: diffusers_to_state(bad, cfg), ref_sd, drop=["decoder.mid_block.resnets.1.conv2.conv.bias"],
                          put={"encoder.quant_conv.weight": torch.zeros(1),
                               "encoder.conv_in.conv.weight": torch.zeros(8, 3, 3, 3, 5)},
                          expect=["missing keys (1): ['decoder.mid_block.resnets.1.conv2.conv.bias']",
                                  "unexpected keys (1): ['encoder.quant_conv.weight']",
                                  "mis-shaped keys (1): ['encoder.conv_in.conv.weight: expected (3, 3, 3, 3, 8) (ours), "
                                  "found (3, 3, 5, 3, 8)']"])
    with pytest.raises(ConversionError, match="missing keys"):
        diffusers_to_state(ref_sd, VAEConfig(**{**TINY, "layers_per_block": 2}))


@pytest.mark.slow
def test_full_config_eval_shape():
    """Full CogVideoX-2B VAE: parameter count equals diffusers' (built on the meta device)."""
    from configs.animegamer_2b_7b import get_config
    from diffusers import AutoencoderKLCogVideoX

    cfg = VAEConfig.from_config(get_config().vae)
    assert cfg.block_out_channels == (128, 256, 256, 512) and cfg.latent_channels == 16
    n = count_params(cfg)
    with torch.device("meta"):
        ref = AutoencoderKLCogVideoX()
    n_ref = sum(p.numel() for p in ref.parameters())
    print(f"full VAE params: {n:,} (diffusers {n_ref:,})")
    assert n == n_ref
    graphdef, state = nnx.split(nnx.eval_shape(lambda: CogVideoXVAE(cfg, rngs=nnx.Rngs(0))))
    z = jax.ShapeDtypeStruct((1, 5, 16, 60, 90), np.float32)
    out = jax.eval_shape(lambda st, z: nnx.merge(graphdef, st).decode(z), state, z)
    assert out.shape == (1, 17, 480, 720, 3) and out.dtype == np.float32
    x = jax.ShapeDtypeStruct((1, 17, 480, 720, 3), np.float32)
    post = jax.eval_shape(lambda st, x: nnx.merge(graphdef, st).encode(x).mean, state, x)
    assert post.shape == (1, 5, 16, 60, 90)
