"""CogVideoX VAE checkpoints (SAT ``3d-vae.pt``, diffusers safetensors) -> our NNX state / orbax.

Names (docs/vae.md#checkpoint-keys). Our parameter paths mirror diffusers' ``AutoencoderKLCogVideoX``:
``encoder.down_blocks.0.resnets.1.conv1.conv.kernel`` <-> ``...conv1.conv.weight``; the only
differences are the leaf names and layouts:

  ======================  =====================  ===================================
  ours                    diffusers              layout change
  ======================  =====================  ===================================
  ``*.kernel`` (5-D)      ``*.weight`` Conv3d    (O, I, kt, kh, kw) -> (kt, kh, kw, I, O)
  ``*.kernel`` (4-D)      ``*.weight`` Conv2d    (O, I, kh, kw) -> (kh, kw, I, O)
  ``*.scale``             ``*.weight`` GroupNorm none
  ``*.bias``              ``*.bias``             none
  ======================  =====================  ===================================

SAT -> diffusers renames (the diffusers conversion script ``convert_cogvideox_to_diffusers.py``):
``block.`` -> ``resnets.``, ``down.`` -> ``down_blocks.``, ``downsample`` -> ``downsamplers.0``,
``upsample`` -> ``upsamplers.0``, ``nin_shortcut`` -> ``conv_shortcut``,
``{encoder,decoder}.mid.block_{1,2}`` -> ``{encoder,decoder}.mid_block.resnets.{0,1}``, then
``decoder.up.{i}`` -> ``decoder.up_blocks.{L-1-i}`` (SAT stores ``up[0]`` as the highest
resolution), and ``loss.*`` keys are dropped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax import paths
from animegamer_jax.models.cogvideox_vae import CogVideoXVAE, VAEConfig

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


class VAECheckpointError(ValueError):
    """A checkpoint that does not match the VAE: lists missing, unexpected and mis-shaped keys."""


def _to_numpy(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):  # torch tensor (fp16 / bf16 included)
        return v.detach().float().cpu().numpy()
    return np.asarray(v, dtype=np.float32)


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


def _fmt(keys: list[str], limit: int = 20) -> str:
    keys = sorted(keys)
    more = f" ... (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def diffusers_to_state(state_dict: Mapping[str, Any], cfg: VAEConfig) -> nnx.State:
    """Converts a diffusers ``AutoencoderKLCogVideoX`` state dict into our parameter state.

    Args:
      state_dict: diffusers keys -> torch tensors or numpy arrays (any float dtype; stored float32).
        Quant convs are not supported (the CogVideoX VAE has none: ``use_quant_conv=False``).
      cfg: the :class:`VAEConfig` the state is for.

    Returns:
      ``nnx.State`` of ``nnx.Param`` (float32), for ``nnx.update(CogVideoXVAE(cfg, ...), state)``.

    Raises:
      VAECheckpointError: naming every missing key, unexpected key, and mis-shaped key
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
        arr = _from_torch_layout(_to_numpy(state_dict[key]), leaf)
        if tuple(arr.shape) != tuple(var.shape):
            bad_shape.append(f"{key}: expected {tuple(var.shape)} (ours), found {tuple(arr.shape)}")
            continue
        pairs.append((path, var.replace(jnp.asarray(arr, jnp.float32))))
    unexpected = [k for k in state_dict if k not in used]
    if missing or unexpected or bad_shape:
        parts = []
        if missing:
            parts.append(f"missing keys ({len(missing)}): {_fmt(missing)}")
        if unexpected:
            parts.append(f"unexpected keys ({len(unexpected)}): {_fmt(unexpected)}")
        if bad_shape:
            parts.append(f"mis-shaped keys ({len(bad_shape)}): {'; '.join(bad_shape[:20])}")
        raise VAECheckpointError("CogVideoX VAE checkpoint does not match the config: " + " | ".join(parts))
    return nnx.from_flat_state(pairs)


def sat_to_state(state_dict: Mapping[str, Any], cfg: VAEConfig) -> nnx.State:
    """SAT ``3d-vae.pt`` state dict -> our state (renames of docs/vae.md#checkpoint-keys, then :func:`diffusers_to_state`).

    Raises:
      VAECheckpointError: as :func:`diffusers_to_state`, keys named in diffusers spelling.
    """
    return diffusers_to_state(sat_to_diffusers_keys(state_dict, len(cfg.block_out_channels)), cfg)


def load_diffusers_state_dict(path: str) -> dict[str, np.ndarray]:
    """Reads diffusers VAE safetensors: a ``.safetensors`` file or a folder holding
    ``diffusion_pytorch_model.safetensors`` (or its sharded ``.index.json``).

    Raises:
      FileNotFoundError: no safetensors file at ``path``.
    """
    from safetensors.numpy import load_file

    if os.path.isdir(path):
        single = os.path.join(path, "diffusion_pytorch_model.safetensors")
        index = single + ".index.json"
        if os.path.exists(single):
            path = single
        elif os.path.exists(index):
            import json

            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
            out = {}
            for name in files:
                out.update(load_file(os.path.join(os.path.dirname(index), name)))
            return out
        else:
            raise FileNotFoundError(f"no diffusion_pytorch_model.safetensors(.index.json) in {path}")
    return load_file(path)


def load_sat_state_dict(path: str) -> dict[str, Any]:
    """Reads a SAT VAE ``.pt`` (``torch.load(...)['state_dict']``; a bare dict or ``'module'`` also work).

    Values are returned as torch tensors (converted to float32 by :func:`diffusers_to_state`).
    """
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=True)
    for k in ("state_dict", "module"):
        if isinstance(obj, dict) and k in obj and isinstance(obj[k], dict):
            return obj[k]
    return obj


def build_vae(cfg: VAEConfig, state: nnx.State) -> CogVideoXVAE:
    """A :class:`CogVideoXVAE` holding ``state`` (no random init: the graph comes from ``eval_shape``)."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: CogVideoXVAE(cfg, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, state)


def save_state(state: nnx.State, directory: str) -> None:
    """Writes the VAE state as an orbax checkpoint (``StandardCheckpointer``) at ``directory``."""
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(paths.as_path(directory), state)


def restore_state(directory: str, cfg: VAEConfig) -> nnx.State:
    """Reads an orbax checkpoint written by :func:`save_state` into a state for ``cfg``."""
    import orbax.checkpoint as ocp

    abstract = nnx.state(nnx.eval_shape(lambda: CogVideoXVAE(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), abstract)
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(paths.as_path(directory), target)


def convert(src: str, dst: str, cfg: VAEConfig, fmt: str = "auto") -> nnx.State:
    """Converts a SAT ``.pt`` or diffusers safetensors VAE checkpoint to an orbax directory.

    Args:
      src: ``3d-vae.pt`` (fmt "sat") or a diffusers ``vae`` folder / ``.safetensors`` (fmt "diffusers").
      dst: output orbax directory.
      cfg: :class:`VAEConfig` (``VAEConfig.from_config(config.vae)``).
      fmt: "sat", "diffusers" or "auto" (by file suffix).

    Returns:
      The converted state (also written to ``dst``).
    """
    if fmt == "auto":
        fmt = "sat" if src.endswith((".pt", ".pth", ".ckpt", ".bin")) else "diffusers"
    if fmt == "sat":
        state = sat_to_state(load_sat_state_dict(src), cfg)
    elif fmt == "diffusers":
        state = diffusers_to_state(load_diffusers_state_dict(src), cfg)
    else:
        raise ValueError(f"unknown VAE checkpoint format {fmt!r}")
    save_state(state, dst)
    return state


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m animegamer_jax.convert vae SRC DST [--config configs/animegamer_2b_7b.py] [--format auto]``."""
    import argparse

    from animegamer_jax.config import load_config

    ap = argparse.ArgumentParser(description="SAT 3d-vae.pt or diffusers AutoencoderKLCogVideoX -> orbax")
    ap.add_argument("src", help="3d-vae.pt, a diffusers vae folder or a .safetensors file")
    ap.add_argument("dst", help="output orbax directory")
    ap.add_argument("--config", default="configs/animegamer_2b_7b.py", help="config whose `vae` section describes the model")
    ap.add_argument("--format", default="auto", choices=("auto", "sat", "diffusers"))
    args = ap.parse_args(argv)
    convert(args.src, args.dst, VAEConfig.from_config(load_config(args.config).vae), args.format)
    print(f"wrote {args.dst}")


if __name__ == "__main__":
    main()
