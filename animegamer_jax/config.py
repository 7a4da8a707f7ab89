"""Config loading for entry points and scripts.

Entry points use absl + ``ml_collections.config_flags`` (flax-examples style), which gives
``--config=configs/tiny.py --config.train.phase=b``. :func:`load_config` is the same for code: it
hands a config file path and ``"a.b=value"`` overrides to ``config_flags`` on a private
``FlagValues``, so a library call and a command line parse each value by the same rules (the field's
type: ``int``, ``float``, ``bool``, ``str``, tuple ...).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import ml_collections
from absl import flags
from ml_collections import config_flags

from animegamer_jax.io import paths


#: the module name config_flags loads the file of a flag named ``config`` as
_CONFIG_MODULE = "config_config"


class ConfigError(ValueError):
    """An unknown config file or key, or a value of the wrong type."""


class SavedConfigError(Exception):
    """The config saved in a ``--checkpoint`` cannot be used (the message names the folder and the fix).

    Raised while a command's flags are defined (commands/game_flags.py ``game_flags``, eval/decoder.py), so
    deliberately not a ValueError: ``cli.parse_flags`` reports a ValueError raised there as a bad
    config override; this one is reported as it is.
    """


def load_config(path: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Loads ``get_config()`` from a config file and applies ``key=value`` overrides.

    The file is read by ``config_flags.DEFINE_config_file`` (``file.py`` or ``file.py:arg``) and the
    overrides are applied by :func:`apply_overrides`, both as ``--config=PATH --config.a.b=v`` would.

    Args:
      path: e.g. ``configs/tiny.py``.
      overrides: strings like ``"train.phase=b"`` or ``"mesh.shape=(2,-1,1,1)"``, each parsed by
        config_flags as the type of the field it replaces.

    Raises:
      ConfigError: missing file, a file without ``get_config``, an unknown key (the message names
        it and the closest section), or a value of the wrong type.
    """
    path = paths.resource(path)  # configs/tiny.py works from any directory
    if not os.path.exists(path if os.path.exists(path) else path.split(":", 1)[0]):
        raise ConfigError(f"config file {path!r} not found; use e.g. configs/tiny.py")
    fv = flags.FlagValues()
    argv = ["load_config", f"--config={path}"]
    config_flags.DEFINE_config_file("config", None, flag_values=fv, lock_config=False, sys_argv=argv)
    # config_flags executes the file in sys.modules["config_config"], reusing a module left there:
    # dropped before and after, so no name of an earlier config file leaks into this one
    sys.modules.pop(_CONFIG_MODULE, None)
    try:
        fv(argv)
        config = fv.config
    except AttributeError as e:
        if "get_config" not in str(e):
            raise
        raise ConfigError(f"config file {path!r} defines no get_config()") from None
    finally:
        sys.modules.pop(_CONFIG_MODULE, None)
    return apply_overrides(config, overrides, path)


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str] = (),
                    source: str = "config") -> ml_collections.ConfigDict:
    """Applies ``"a.b=value"`` overrides to ``config`` in place and returns it: each becomes
    ``--config.a.b=value`` of a ``config_flags.DEFINE_config_dict`` flag (see :func:`load_config`).

    Raises:
      ConfigError: an unknown key (named, with ``source``) or a value of the wrong type.
    """
    argv = ["apply_overrides"]
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        argv.append(f"--config.{key.strip().removeprefix('config.')}={raw}")
    if len(argv) == 1:
        return config
    fv = flags.FlagValues()
    try:  # the overrides of sys_argv are parsed while the flag is defined
        config_flags.DEFINE_config_dict("config", config, flag_values=fv, lock_config=False, sys_argv=argv)
        fv(argv)
    except (KeyError, AttributeError):
        raise _unknown_key(config, argv[1:], source) from None
    except (flags.Error, ValueError, TypeError) as e:
        raise _bad_value(config, e) from None
    return config


def _unknown_key(config, args: Sequence[str], source: str) -> ConfigError:
    """The error for the first ``--config.KEY=v`` of ``args`` whose KEY ``config`` lacks."""
    for arg in args:
        key = arg.removeprefix("--config.").split("=", 1)[0]
        node, parts = config, key.split(".")
        for i, part in enumerate(parts):
            if not hasattr(node, "keys") or part not in node:
                if i < len(parts) - 1:
                    return ConfigError(f"unknown config key {key!r} in {source} (no section {part!r})")
                return ConfigError(f"unknown config key {key!r} in {source}; fields here: {sorted(node.keys())}")
            node = node[part]
    return ConfigError(f"unknown config key in {source}: {' '.join(args)}")


def _bad_value(config, e: Exception) -> ConfigError:
    """config_flags' ``flag --config.KEY=VALUE: why`` as "config key KEY expects TYPE, got VALUE"."""
    m = re.match(r"flag --config\.([^=\s]+)=(.*?): ", str(e))
    if m is None:
        return ConfigError(f"bad config override: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    old = _get(config, m.group(1))
    kind = type(old).__name__ if old is not _MISSING else "another value"
    return ConfigError(f"config key {m.group(1)!r} expects {kind}, got {m.group(2)!r}")


#: the training phases (``train.phase``, ``train.pipeline``; train/model.py builds each); "all" runs the pipeline
TRAIN_PHASES: tuple[str, ...] = ("vae", "a1", "a2", "b", "c", "d", "r", "preview")
#: game modes (``game.mode``)
GAME_MODES = ("default", "reference")
#: clip decoders of play / generate / web (``game.decoder``): the VAE, the preview decoder alone, or the
#: preview's frames first and then the VAE's
GAME_DECODERS = ("full", "preview", "preview_then_full")
#: weight-only quantization of the MLLM (``mllm.quantize``)
MLLM_QUANTIZE = ("none", "int8")
#: what a seed may be: a signed 64-bit integer
SEED_RANGE = (-2**63, 2**63 - 1)

# (key, lowest value allowed, what the value is): numbers checked by :func:`validate` when present
_AT_LEAST = (
    ("game.fps", 1, "output video frames per second"),
    ("game.max_instruction_tokens", 1, "tokens an instruction may take"),
    ("game.contact_sheet_columns", 1, "frames per turn on the contact sheet"),
    ("game.meter_step", 0, "meter change per state step"),
    ("game.reference_max_new_tokens", 1, "the reference mode's token budget"),
    ("diffusion.num_sampling_steps", 1, "sampling steps"),
    ("diffusion.num_train_timesteps", 1, "DDPM steps"),
    ("diffusion.student_grid_steps", 1, "steps of the teacher's grid"),
    ("data.fps", 1e-9, "frames sampled per second"),
    ("data.height", 1, "clip height (px)"),
    ("data.width", 1, "clip width (px)"),
    ("data.num_frames", 1, "frames per clip"),
    ("data.clip_seconds", 1e-9, "clip length (s)"),
    ("data.clip_stride_seconds", 0, "seconds between clip starts"),
    ("data.max_turns", 1, "turns per multi-turn example"),
    ("data.num_workers", 0, "grain worker processes"),
    ("train.global_batch_size", 1, "examples per optimizer step"),
    ("train.grad_accum_steps", 1, "micro-batches per optimizer step"),
    ("train.num_steps", 0, "optimizer steps (0 = the paper's)"),
    ("train.warmup_steps", 0, "warm-up steps"),
    ("train.learning_rate", 0, "peak learning rate (0 = the paper's)"),
    ("train.log_every", 1, "steps between summaries"),
    ("train.checkpoint_every", 1, "steps between checkpoints"),
    ("train.keep_checkpoints", 1, "checkpoints kept"),
    ("train.sample_every", 0, "steps between sample videos (0 = never)"),
    ("train.max_seq_len", 1, "MLLM training sequence length"),
    ("mllm.history_window", 1, "turns in the MLLM's window"),
)


class KeyChange(NamedTuple):
    """One key the configs gained or lost after checkpoints were saved and games were fingerprinted.

    Attributes:
      key: ``"section.name"``.
      added: True: the configs gained it; False: they lost it.
      before: added: the value that behaves as before it; removed: the value configs had (a dict
        ``{config name: value}`` with ``""`` for any other config).
      checkpoints: a checkpoint's saved config is brought up to date: an added key filled in with
        ``before`` (:func:`fill_added_keys`), a removed one dropped (:func:`drop_removed_keys`).
      fingerprints: games' fingerprints stay as they were (game/folder/fingerprint.py): an added key
        is left out while it equals ``before``, a removed one is put back as ``before``.
    """

    key: str
    added: bool
    before: Any
    checkpoints: bool
    fingerprints: bool


#: the one table of config keys gained and lost over time (what checkpoints and game fingerprints
#: made before each change need)
KEY_CHANGES = (
    KeyChange("mllm.quantize", True, "none", checkpoints=True, fingerprints=False),
    KeyChange("game.decoder", True, "full", checkpoints=True, fingerprints=True),
    KeyChange("train.preview_real_weight", True, 0.0, checkpoints=False, fingerprints=True),
    KeyChange("dit.reference_drops_image", True, False, checkpoints=False, fingerprints=True),
    KeyChange("train.reference_image_dropout", True, -1.0, checkpoints=False, fingerprints=True),
    # output folders, now the commands' --out (a run argument); game.out_dir was never fingerprinted
    KeyChange("game.out_dir", False, {"": "outputs/games"}, checkpoints=True, fingerprints=False),
    KeyChange("eval.out_dir", False, {"tiny": "outputs/eval_tiny", "toy_world": "outputs/eval_toy_world",
                                      "": "outputs/eval"}, checkpoints=True, fingerprints=True),
)

#: keys the configs gained after checkpoints were saved without them, with the value that behaves as before
ADDED_KEYS = tuple((c.key, c.before) for c in KEY_CHANGES if c.added and c.checkpoints)


def fill_added_keys(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Adds, in place, each :data:`ADDED_KEYS` key that ``config`` (a checkpoint's saved config) lacks,
    with its as-before value, so ``--config.mllm.quantize=int8`` overrides an older checkpoint's config
    too; returns ``config``. A section that is missing altogether is left missing."""
    for key, value in ADDED_KEYS:
        *parents, last = key.split(".")
        node = _get(config, ".".join(parents))
        if node is not _MISSING and hasattr(node, "keys") and last not in node:
            node[last] = value
    return config


#: keys the configs lost after checkpoints were saved with them: :func:`drop_removed_keys` takes them
#: out of a saved config.
REMOVED_KEYS = tuple(c.key for c in KEY_CHANGES if not c.added and c.checkpoints)


def drop_removed_keys(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Removes, in place, each :data:`REMOVED_KEYS` key that ``config`` (a checkpoint's saved config)
    still holds, so it reads as a config of today (``--config.game.out_dir=...`` is an unknown key for
    it too); returns ``config``."""
    for key in REMOVED_KEYS:
        *parents, last = key.split(".")
        node = _get(config, ".".join(parents))
        if node is not _MISSING and hasattr(node, "keys") and last in node:
            del node[last]
    return config


def config_to_json(config: ml_collections.ConfigDict) -> dict:
    """JSON-safe dict of a config (the one config-to-JSON: a checkpoint's stored config, a game's
    fingerprint, the saved executables' config hash); tuples become lists (restored to tuples by
    :func:`config_from_json`)."""
    return json.loads(config.to_json_best_effort())


def config_from_json(d: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """Inverse of :func:`config_to_json`: lists become tuples again (every list field of ours is a tuple)."""

    def fix(v: Any) -> Any:
        if isinstance(v, Mapping):
            return ml_collections.ConfigDict({k: fix(x) for k, x in v.items()})
        if isinstance(v, list):
            return tuple(fix(x) for x in v)
        return v

    return fix(dict(d))


def _get(config, key: str):
    node = config
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            return _MISSING
        node = node[part]
    return node


_MISSING = object()


def _seeds(config, prefix: str = ""):
    """(key, value) of every field of ``config`` named ``seed`` or ``*_seed``, nested sections included."""
    for k in config.keys():
        v = config[k]
        if hasattr(v, "keys"):
            yield from _seeds(v, f"{prefix}{k}.")
        elif k == "seed" or k.endswith("_seed"):
            yield prefix + k, v


def validate(config) -> None:
    """Checks the values of a parsed config (after ``--config.a.b=value`` overrides) before any work.

    Checked when present: the numbers of :data:`_AT_LEAST` (a count, size, rate or step that must be
    at least 1, or at least 0: ``game.fps=0`` is refused here, not after a game was computed), every
    ``seed`` / ``*_seed`` field (an integer that fits a signed 64 bits), ``train.phase`` (one of
    :data:`TRAIN_PHASES` or ``"all"``), ``train.pipeline`` (phases), ``mllm.quantize`` (one of
    :data:`MLLM_QUANTIZE`), ``game.mode`` and ``game.decoder`` (one of :data:`GAME_DECODERS`).

    Raises:
      ConfigError: the first bad value, named with its key, what it is and the fix.
    """
    for key, low, what in _AT_LEAST:
        v = _get(config, key)
        if v is _MISSING or v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= low) or v != v or v == float("inf"):
            bound = "greater than 0" if 0 < low < 1 else f"at least {low}"
            raise ConfigError(f"config value {key}={v!r} is out of range: {what} must be a finite number "
                              f"{bound}. Fix: --config.{key}=<a value {bound}>")
    for key, v in _seeds(config):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not SEED_RANGE[0] <= v <= SEED_RANGE[1]:
            raise ConfigError(f"config value {key}={v!r} is not a seed: seeds are integers from -2**63 to "
                              f"2**63 - 1. Fix: --config.{key}=0 (or another integer in that range)")
    _check_choice(config, "train.phase", (*TRAIN_PHASES, "all"), "a training phase",
                  f"= one of {', '.join(TRAIN_PHASES)} or all")
    pipeline = _get(config, "train.pipeline")
    if pipeline is not _MISSING:
        bad = [p for p in (pipeline or ()) if p not in TRAIN_PHASES]
        if bad or isinstance(pipeline, str):
            raise ConfigError(f"config value train.pipeline={pipeline!r} holds no training phase {bad or pipeline!r}. "
                              f"Fix: a tuple of {', '.join(TRAIN_PHASES)}, e.g. --config.train.pipeline=\"('a1','a2')\"")
    _check_choice(config, "mllm.quantize", MLLM_QUANTIZE, "a quantization", "=none or =int8")
    _check_choice(config, "game.mode", GAME_MODES, "a game mode", "=default or =reference")
    _check_choice(config, "game.decoder", GAME_DECODERS, "a clip decoder", f"= one of {', '.join(GAME_DECODERS)}")


def _check_choice(config, key: str, choices, what: str, fix: str) -> None:
    """Raises ConfigError "config value KEY=V is not WHAT. Fix: --config.KEY<fix>" when ``config`` has ``key``
    (dotted) and its value is not one of ``choices``."""
    value = _get(config, key)
    if value is not _MISSING and value not in choices:
        raise ConfigError(f"config value {key}={value!r} is not {what}. Fix: --config.{key}{fix}")


def check_config_file(path: str) -> None:
    """Checks that the config file ``path`` (``file.py`` or ``file.py:arg``, config_flags' form) is a
    readable Python text file before it is imported (a URL is left to the loader).

    Raises:
      ConfigError: no such file, a folder, a file that is binary (NUL bytes, not UTF-8), or one that never
        mentions ``get_config``: not a config file.
    """
    local = path if os.path.exists(path) else path.split(":", 1)[0]
    if "://" in path:
        return
    if not os.path.exists(local):
        raise ConfigError(f"config file {local!r} not found. Fix: give an existing config file, e.g. "
                          f"--config=configs/tiny.py")
    if os.path.isdir(local):
        raise ConfigError(f"config file {local!r} is a folder. Fix: pass a config file, e.g. --config=configs/tiny.py")
    try:
        with open(local, "rb") as fh:
            head = fh.read(1 << 20)
        head.decode("utf-8") if len(head) < 1 << 20 else head[: 1 << 19].decode("utf-8", "ignore")
    except UnicodeDecodeError:
        head = b"\0"
    except OSError as e:
        raise ConfigError(f"config file {local!r} cannot be read ({e.strerror or e}). Fix: pass a readable "
                          f"config file") from None
    if b"\0" in head:
        raise ConfigError(f"config file {local!r} is binary, not a Python config file. Fix: pass a config file "
                          f"with a get_config(), e.g. --config=configs/tiny.py")
    if b"get_config" not in head:
        raise ConfigError(f"config file {local!r} defines no get_config(). Fix: pass a config file with a "
                          f"get_config(), e.g. --config=configs/tiny.py")
