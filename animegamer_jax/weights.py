"""Foreign weights in, our parameters out: what every checkpoint converter shares.

Reading a source state dict (safetensors, torch ``.bin`` / ``.pt``, HF / diffusers / SAT folders)
into numpy, the key checks that name every missing, unexpected or mis-shaped key
(:class:`ConversionError`), filling an NNX state from a key table, and the orbax writer / reader of
one converted network's parameters (a pure dict of arrays).

The key tables live beside each model (``animegamer_jax/models/<family>/*convert.py``);
``python -m animegamer_jax.commands.convert <kind>`` (commands/convert.py) is their one command-line front.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from safetensors.numpy import load_file as load_safetensors

from animegamer_jax.io import paths


class ConversionError(ValueError):
    """A checkpoint that does not fit the target model; the message lists every missing, unexpected
    or mis-shaped key (one class for every converter in ``animegamer_jax.convert``)."""


def count_params(state: Any) -> int:
    """Number of scalars in every array leaf of an NNX module, ``nnx.State`` (abstract or concrete)
    or pure dict; a module counts its ``nnx.Param`` variables."""
    if isinstance(state, nnx.Module):
        state = nnx.state(state, nnx.Param)
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state) if hasattr(x, "shape")))


# ---------------------------------------------------------------------------------------------
# Reading source state dicts


def to_numpy(x: Any) -> np.ndarray:
    """A torch tensor (any dtype, bf16 included) or array -> numpy; floating values become float32,
    integer ones keep their dtype."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()
        x = x.numpy()
    x = np.asarray(x)
    return x.astype(np.float32) if np.issubdtype(x.dtype, np.floating) else x


#: HF / diffusers shard indices, looked for in this order inside a folder
_INDEX_FILES = ("model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json",
                "pytorch_model.bin.index.json")
#: single-file weights inside a folder, in this order
_SINGLE_FILES = ("model.safetensors", "diffusion_pytorch_model.safetensors", "pytorch_model.bin")


def load_state_dict(path: str | os.PathLike, *, weights_only: bool = True) -> dict[str, Any]:
    """Reads one source checkpoint into ``{name: tensor or array}`` (values as stored; see :func:`to_numpy`).

    Accepts a ``.safetensors`` file (numpy; bf16 files through torch), a torch ``.bin`` / ``.pt`` /
    ``.pth`` file, or a folder: a SAT folder (``latest`` names ``<it>/mp_rank_00_model_states.pt``),
    an HF / diffusers shard index (``*.index.json``), one of the usual single files, else the union
    of its ``*.safetensors`` files (else of its ``*.bin`` files). A torch file holding
    ``{"state_dict": ...}`` is unwrapped; a SAT / DeepSpeed ``{"module": ...}`` is returned whole
    (its converter reads ``module``).

    Args:
      weights_only: passed to ``torch.load``; SAT engine files also pickle their training arguments
        and need ``False`` (only for files you trust).

    Raises:
      FileNotFoundError: a folder holding none of these.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        latest = os.path.join(path, "latest")
        if os.path.exists(latest):
            with open(latest) as f:
                it = f.read().strip()
            return load_state_dict(os.path.join(path, it, "mp_rank_00_model_states.pt"), weights_only=weights_only)
        names = sorted(os.listdir(path))
        files: list[str] = []
        for index in _INDEX_FILES:
            if index in names:
                with open(os.path.join(path, index)) as f:
                    files = sorted(set(json.load(f)["weight_map"].values()))
                break
        else:
            files = ([n for n in _SINGLE_FILES if n in names][:1] or [n for n in names if n.endswith(".safetensors")]
                     or [n for n in names if n.endswith(".bin")])
        if not files:
            raise FileNotFoundError(f"no weight files (*.safetensors, *.bin, a shard index or a SAT `latest`) "
                                    f"in {path}")
        out: dict[str, Any] = {}
        for n in files:
            out.update(load_state_dict(os.path.join(path, n), weights_only=weights_only))
        return out
    if path.endswith(".safetensors"):
        try:
            return dict(load_safetensors(path))
        except TypeError:  # numpy has no bfloat16: such files are read through torch
            from safetensors.torch import load_file as load_torch  # optional

            return dict(load_torch(path))
    import torch  # optional

    sd = torch.load(path, map_location="cpu", weights_only=weights_only)
    if isinstance(sd, Mapping) and isinstance(sd.get("state_dict"), Mapping):
        sd = sd["state_dict"]
    return dict(sd)


#: Buffers some checkpoints carry that hold no learned parameter.
_BUFFERS = re.compile(r"(^|\.)(position_ids|attn_mask)$")


class StateDictReader:
    """Reads source keys once each and records missing ones (for strict conversion)."""

    def __init__(self, state_dict: Mapping[str, Any], ignore: Callable[[str], bool] = lambda k: False):
        self.sd = dict(state_dict)
        self.used: set[str] = set()
        self.missing: list[str] = []
        self.ignore = ignore

    def get(self, key: str) -> np.ndarray | None:
        if key not in self.sd:
            self.missing.append(key)
            return None
        self.used.add(key)
        return to_numpy(self.sd[key])

    def stack(self, fmt: str, n: int, fn: Callable[[np.ndarray], np.ndarray] = lambda a: a) -> np.ndarray | None:
        """Reads ``fmt.format(i)`` for i < n, applies ``fn`` and stacks on a new leading axis."""
        arrs = [self.get(fmt.format(i)) for i in range(n)]
        if any(a is None for a in arrs):
            return None
        return np.stack([fn(a) for a in arrs])

    def unexpected(self) -> list[str]:
        return sorted(k for k in self.sd if k not in self.used and not _BUFFERS.search(k) and not self.ignore(k))


def raise_key_problems(what: str, limit: int | None = None, sep: str = "\n", **problems: Iterable[str]) -> None:
    """Raises one :class:`ConversionError` naming every problem, or returns when there is none.

    ``problems`` maps a label (``missing_keys``, ``unexpected_keys``, ``mis_shaped_keys``, ...;
    ``mis_`` reads ``mis-``, other underscores spaces) to the offending keys; each non-empty list
    becomes one part ``"<label> (<count>): [...]"`` (at most ``limit`` keys shown), joined with
    ``sep`` after ``what``.
    """
    parts = []
    for label, items in problems.items():
        items = sorted(items)
        if items:
            shown = items if limit is None or len(items) <= limit else [*items[:limit],
                                                                        f"... (+{len(items) - limit} more)"]
            parts.append(f"{label.replace('mis_', 'mis-').replace('_', ' ')} ({len(items)}): {shown}")
    if parts:
        raise ConversionError(sep.join([what] + parts))


def check_keys(sd: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], what: str,
               ignore: Callable[[str], bool] = lambda k: False, limit: int | None = None) -> None:
    """Raises :class:`ConversionError` listing the missing, unexpected (not ``ignore``-d) and
    mis-shaped keys of ``sd`` against ``expected`` (key -> shape); at most ``limit`` of each."""
    raise_key_problems(
        f"{what}: checkpoint does not match the model", limit,
        missing_keys=[k for k in expected if k not in sd],
        unexpected_keys=[k for k in sd if k not in expected and not ignore(k)],
        mis_shaped_keys=[f"{k}: got {tuple(np.shape(sd[k]))}, expected {tuple(expected[k])}"
                         for k in expected if k in sd and tuple(np.shape(sd[k])) != tuple(expected[k])])


def fill_state(abstract_module: nnx.Module, values: Mapping[tuple, np.ndarray | None], reader: StateDictReader,
               what: str) -> nnx.State:
    """Checks ``values`` (our param path -> array) against an abstract module and returns its State.

    Raises:
      ConversionError: listing target params with no value, source keys that were expected but
        absent, source keys not consumed, and values whose shape differs from the target.
    """
    state = nnx.state(abstract_module, nnx.Param)
    target = nnx.traversals.flatten_mapping(nnx.to_pure_dict(state))
    dotted = lambda p: ".".join(map(str, p))  # noqa: E731
    raise_key_problems(
        f"{what}:", sep=" | ",
        missing_source_keys=set(reader.missing),
        target_params_with_no_mapping=[dotted(p) for p in target if p not in values],
        mapped_to_unknown_target_params=[dotted(p) for p in values if p not in target],
        unexpected_source_keys=reader.unexpected(),
        shape_mismatches=[f"{dotted(p)}: source gives {tuple(v.shape)}, model expects {tuple(target[p].shape)}"
                          for p, v in values.items()
                          if v is not None and p in target and tuple(v.shape) != tuple(target[p].shape)])
    pure = nnx.traversals.unflatten_mapping({p: np.asarray(v, dtype=target[p].dtype) for p, v in values.items()})
    nnx.replace_by_pure_dict(state, pure)
    return state


# ---------------------------------------------------------------------------------------------
# One network's parameters on disk (orbax, a pure dict of arrays)


def save_state(state: nnx.State, directory: str | os.PathLike) -> None:
    """Writes an NNX state as an orbax checkpoint (its pure dict) at ``directory`` (local, made
    absolute, or a URL; must not exist)."""
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(paths.as_path(directory), nnx.to_pure_dict(state))


def restore_state(abstract: nnx.Module | nnx.State, directory: str | os.PathLike) -> nnx.State:
    """Reads a checkpoint written by :func:`save_state` into the layout of ``abstract`` (a module,
    e.g. ``nnx.eval_shape(lambda: CLIP(cfg, rngs=nnx.Rngs(0)))``, whose Params are read, or a state).

    Raises:
      ConversionError: the checkpoint's arrays do not match ``abstract`` (paths or shapes, listed).
    """
    state = nnx.state(abstract, nnx.Param) if isinstance(abstract, nnx.Module) else abstract
    with ocp.StandardCheckpointer() as ckptr:
        pure = ckptr.restore(paths.as_path(directory))
    flat = nnx.traversals.flatten_mapping(pure)
    if flat and all(k[-1] == "value" for k in flat):  # a whole nnx.State saved: each leaf is {"value": array}
        pure = nnx.traversals.unflatten_mapping({k[:-1]: v for k, v in flat.items()})
    return state_from_pure_dict(state, pure, str(paths.as_path(directory)))


def state_from_pure_dict(abstract: nnx.State, pure: Mapping[str, Any], what: str = "state") -> nnx.State:
    """Puts the arrays of a nested pure dict into an (abstract) NNX state, cast to its dtypes.

    Raises:
      ConversionError: a path of the state absent from ``pure``, an extra path, or a shape mismatch.
    """
    key = lambda p: tuple(map(str, p))  # noqa: E731 (orbax gives list indices back as strings)
    want = {key(k): v for k, v in nnx.to_flat_state(abstract)}
    got = {key(k): v for k, v in nnx.traversals.flatten_mapping(dict(pure)).items()}
    dotted = ".".join
    raise_key_problems(
        f"{what} does not match the model:", 20, "; ",
        missing=[dotted(k) for k in want if k not in got], unexpected=[dotted(k) for k in got if k not in want],
        mis_shaped=[f"{dotted(k)}: got {np.shape(got[k])}, expected {tuple(v.shape)}"
                    for k, v in want.items() if k in got and tuple(np.shape(got[k])) != tuple(v.shape)])
    return nnx.from_flat_state([(k, _replace(v, jnp.asarray(got[key(k)], dtype=v.dtype)))
                                for k, v in nnx.to_flat_state(abstract)])


def _replace(var: Any, value: jax.Array) -> Any:
    return var.replace(value) if isinstance(var, nnx.Variable) else value
