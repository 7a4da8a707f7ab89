"""Config loading for entry points and scripts.

Entry points use absl + ``ml_collections.config_flags`` (flax-examples style), which gives
``--config=configs/tiny.py --config.train.phase=b``. :func:`load_config` is the same for code:
a config file path plus ``"a.b=value"`` overrides, each checked against the existing fields.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Sequence

import ml_collections

from animegamer_jax import paths


class ConfigError(ValueError):
    """An unknown config file or key, or a value of the wrong type."""


def load_config(path: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Loads ``get_config()`` from a config file and applies ``key=value`` overrides.

    Args:
      path: e.g. ``configs/tiny.py``.
      overrides: strings like ``"train.phase=b"`` or ``"mesh.shape=(2,-1,1,1)"``; values are
        Python literals, or plain strings.

    Raises:
      ConfigError: missing file, a file without ``get_config``, an unknown key (the message names
        it and the closest section), or a value of the wrong type.
    """
    path = paths.resource(path)  # configs/tiny.py works from any directory
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} not found; use e.g. configs/tiny.py")
    spec = importlib.util.spec_from_file_location(f"_agj_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} defines no get_config()")
    return apply_overrides(module.get_config(), overrides, path)


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str] = (),
                    source: str = "config") -> ml_collections.ConfigDict:
    """Applies ``"a.b=value"`` overrides to ``config`` in place (see :func:`load_config`).

    Raises:
      ConfigError: an unknown key (named, with ``source``) or a value of the wrong type.
    """
    path = source
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip().removeprefix("config.")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        parent = config
        parts = key.split(".")
        for p in parts[:-1]:
            if p not in parent:
                raise ConfigError(f"unknown config key {key!r} in {path} (no section {p!r})")
            parent = parent[p]
        if parts[-1] not in parent:
            raise ConfigError(f"unknown config key {key!r} in {path}; fields here: {sorted(parent.keys())}")
        old = parent[parts[-1]]
        if isinstance(old, tuple) and isinstance(value, list):
            value = tuple(value)
        if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if old is not None and type(old) is not type(value):
            raise ConfigError(f"config key {key!r} expects {type(old).__name__}, got {value!r}")
        parent[parts[-1]] = value
    return config
