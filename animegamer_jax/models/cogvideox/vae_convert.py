"""CogVideoX VAE checkpoints (SAT ``3d-vae.pt``, diffusers safetensors) -> our NNX state / orbax.

Names (docs/vae.md#checkpoint-keys). Our parameter paths mirror diffusers' ``AutoencoderKLCogVideoX``:
``encoder.down_blocks.0.resnets.1.conv1.conv.kernel`` <-> ``...conv1.conv.weight``; the only
differences are the leaf names and layouts:

  ======================  =====================  ===================================================
  ours                    diffusers              layout change
  ======================  =====================  ===================================================
  ``*.kernel`` (5-D)      ``*.weight`` Conv3d    [C_out, C_in, kt, kh, kw] -> [kt, kh, kw, C_in, C_out]
  ``*.kernel`` (4-D)      ``*.weight`` Conv2d    [C_out, C_in, kh, kw] -> [kh, kw, C_in, C_out]
  ``*.scale``             ``*.weight`` GroupNorm none
  ``*.bias``              ``*.bias``             none
  ======================  =====================  ===================================================

SAT -> diffusers renames (the diffusers conversion script ``convert_cogvideox_to_diffusers.py``):
``block.`` -> ``resnets.``, ``down.`` -> ``down_blocks.``, ``downsample`` -> ``downsamplers.0``,
``upsample`` -> ``upsamplers.0``, ``nin_shortcut`` -> ``conv_shortcut``,
``{encoder,decoder}.mid.block_{1,2}`` -> ``{encoder,decoder}.mid_block.resnets.{0,1}``, then
``decoder.up.{i}`` -> ``decoder.up_blocks.{L-1-i}`` (SAT stores ``up[0]`` as the highest
resolution), and ``loss.*`` keys are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.weights import raise_key_problems, to_numpy
from animegamer_jax.models.cogvideox.vae import CogVideoXVAE, VAEConfig

_SAT_RENAMES = (
    ("block.", "resnets."),
    ("down.", "down_blocks."),
    ("downsample", "downsamplers.0"),
    ("upsample", "upsamplers.0"),
    ("nin_shortcut", "conv_shortcut"),
    ("encoder.mid.block_1", "encoder.mid_block.resnets.0"),
    ("encoder.mid.block_2", "encoder.mid_block.resnets.1"),
    ("decoder.mid.block_1", "decoder.mid_block.resnets.0"),
    ("decoder.mid.block_2", "decoder.mid_block.resnets.1"),
)
_SAT_PREFIXES = ("first_stage_model.", "module.")


def sat_to_diffusers_keys(state_dict: Mapping[str, Any], num_levels: int = 4) -> dict[str, Any]:
    """Renames a SAT ``3d-vae.pt`` state dict to diffusers names (docs/vae.md#checkpoint-keys).

    Args:
      state_dict: SAT keys (``encoder.down.0.block.1.norm1.weight``, ...); a leading
        ``first_stage_model.`` (SAT engine checkpoints) is stripped; ``loss.*`` keys are dropped.
      num_levels: number of resolution levels (len(block_out_channels)) for the up-index reversal.

    Returns:
      A new dict with diffusers keys and the same values.
    """
    out = {}
    for key, value in state_dict.items():
        for p in _SAT_PREFIXES:
            if key.startswith(p):
                key = key[len(p) :]
        if key.startswith("loss"):
            continue
        for old, new in _SAT_RENAMES:
            key = key.replace(old, new)
        m = re.match(r"^decoder\.up\.(\d+)\.(.*)$", key)
        if m:
            key = f"decoder.up_blocks.{num_levels - 1 - int(m.group(1))}.{m.group(2)}"
        out[key] = value
    return out


def _ours_to_diffusers(path: tuple) -> tuple[str, str]:
    """Our flat state path -> (diffusers key, leaf kind)."""
    *mods, leaf = (str(p) for p in path)
    name = {"kernel": "weight", "scale": "weight", "bias": "bias"}[leaf]
    return ".".join(mods + [name]), leaf


def _from_torch_layout(arr: np.ndarray, leaf: str) -> np.ndarray:
    if leaf == "kernel":
        if arr.ndim == 5:
            return arr.transpose(2, 3, 4, 1, 0)
        if arr.ndim == 4:
            return arr.transpose(2, 3, 1, 0)
    return arr


def diffusers_to_state(state_dict: Mapping[str, Any], cfg: VAEConfig) -> nnx.State:
    """Converts a diffusers ``AutoencoderKLCogVideoX`` state dict into our parameter state.

    Args:
      state_dict: diffusers keys -> torch tensors or numpy arrays (any float dtype; stored float32).
        Quant convs are not supported (the CogVideoX VAE has none: ``use_quant_conv=False``).
      cfg: the :class:`VAEConfig` the state is for.

    Returns:
      ``nnx.State`` of ``nnx.Param`` (float32), for ``nnx.update(CogVideoXVAE(cfg, ...), state)``.

    Raises:
      ConversionError: naming every missing key, unexpected key, and mis-shaped key
        (with the expected and found torch-layout shapes).
    """
    abstract = nnx.eval_shape(lambda: CogVideoXVAE(cfg, rngs=nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(abstract, nnx.Param))
    missing, bad_shape, pairs, used = [], [], [], set()
    for path, var in flat:
        key, leaf = _ours_to_diffusers(path)
        if key not in state_dict:
            missing.append(key)
            continue
        used.add(key)
        arr = _from_torch_layout(to_numpy(state_dict[key]), leaf)
        if tuple(arr.shape) != tuple(var.shape):
            bad_shape.append(f"{key}: expected {tuple(var.shape)} (ours), found {tuple(arr.shape)}")
            continue
        pairs.append((path, var.replace(jnp.asarray(arr, jnp.float32))))
    raise_key_problems("CogVideoX VAE checkpoint does not match the config:", 20, " | ", missing_keys=missing,
                       unexpected_keys=[k for k in state_dict if k not in used], mis_shaped_keys=bad_shape)
    return nnx.from_flat_state(pairs)


def sat_to_state(state_dict: Mapping[str, Any], cfg: VAEConfig) -> nnx.State:
    """SAT ``3d-vae.pt`` state dict -> our state (renames of docs/vae.md#checkpoint-keys, then
    :func:`diffusers_to_state`).

    Raises:
      ConversionError: as :func:`diffusers_to_state`, keys named in diffusers spelling.
    """
    return diffusers_to_state(sat_to_diffusers_keys(state_dict, len(cfg.block_out_channels)), cfg)


def build_vae(cfg: VAEConfig, state: nnx.State) -> CogVideoXVAE:
    """A :class:`CogVideoXVAE` holding ``state`` (no random init: the graph comes from ``eval_shape``)."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: CogVideoXVAE(cfg, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, state)


def detect_format(src: str) -> str:
    """The layout of the VAE checkpoint at ``src`` by its name: "sat" for a torch file (``.pt``,
    ``.pth``, ``.ckpt``, ``.bin``), else "diffusers" (a folder or ``.safetensors``)."""
    return "sat" if str(src).endswith((".pt", ".pth", ".ckpt", ".bin")) else "diffusers"


def convert_vae(state_dict: Mapping[str, Any], cfg: VAEConfig, fmt: str) -> nnx.State:
    """A SAT ``3d-vae.pt`` or diffusers VAE state dict -> our state.

    Args:
      state_dict: as read by :func:`animegamer_jax.weights.load_state_dict` (a SAT / DeepSpeed
        ``{"module": ...}`` is unwrapped).
      cfg: :class:`VAEConfig` (``VAEConfig.from_config(config.vae)``).
      fmt: "sat" or "diffusers" (:func:`detect_format` tells by the file name).

    Raises:
      ConversionError: keys missing, unexpected or of the wrong shape (every one named).
      ValueError: an unknown ``fmt``.
    """
    if fmt == "sat":
        module = state_dict.get("module")
        return sat_to_state(module if isinstance(module, Mapping) else state_dict, cfg)
    if fmt == "diffusers":
        return diffusers_to_state(state_dict, cfg)
    raise ValueError(f"unknown VAE checkpoint format {fmt!r}")
