"""Saved compiled programs: a folder of serialized XLA executables that a command loads instead of compiling.

``python -m animegamer_jax.commands.aot --save=DIR`` records the game engine's stage programs there
(:func:`recording`); ``play`` / ``generate`` / ``web`` with ``--executables=DIR`` load them
(:func:`use`). Every jitted stage goes through one wrapper, :class:`StageJit`: with no folder in use
it is ``jax.jit``; with one, a call whose program (stage name and input signature) the folder holds
runs the loaded executable, anything else compiles as usual.

The folder (``DIR/manifest.json`` + one ``<stage>_<hash>.xla.pkl`` per program):

* ``format``: :data:`FORMAT`; ``jax`` / ``jaxlib``: versions that compiled them; ``commit``: the
  checkout's (``head[+dirty]``, or ``unknown``); ``target``: platform, device kind and count, and the
  JAX options that change programs (``jax_threefry_partitionable``);
* ``programs``: ``[{"stage", "config", "signature", "file"}]`` with ``config`` the sha256 (16 hex) of
  the engine's config (:func:`config_hash`) and ``signature`` the input tree, shapes, dtypes and
  shardings (:func:`signature`).

A folder made for another jax / jaxlib / commit / target / config is not used: the command prints ONE
line saying why (``executables: DIR was saved for jax 0.10.1, compiling``) and compiles.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jaxlib
from jax._src import compilation_cache as jax_cache  # reset_cache: no public equivalent
from jax.experimental import serialize_executable

from animegamer_jax.config import config_to_json
from animegamer_jax.io import fileio

from animegamer_jax.io import paths

FORMAT = "animegamer-executables-1"
MANIFEST = "manifest.json"


class ExecutablesError(ValueError):
    """``--executables`` names something that is not a folder of saved executables (one line, the fix)."""


def config_hash(config: Any) -> str:
    """sha256 (first 16 hex digits) of ``config``'s JSON (keys sorted)."""
    text = json.dumps(config_to_json(config) if hasattr(config, "to_json_best_effort") else config,
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _commit() -> str:
    head, dirty = paths.checkout_commit()
    return "unknown" if dirty is None else head[:12] + ("+dirty" if dirty else "")


def target(devices: Sequence[Any] | None = None) -> dict:
    """What a saved executable is bound to: platform, device kind, device count and the JAX options
    that change the compiled program."""
    devices = list(devices if devices is not None else jax.devices())
    return {"platform": devices[0].platform, "device_kind": str(getattr(devices[0], "device_kind", "")),
            "num_devices": len(devices),
            "jax_threefry_partitionable": bool(jax.config.jax_threefry_partitionable)}


def signature(args: tuple) -> str:
    """The inputs as a program sees them: tree structure, then per leaf ``dtype[shape]{weak}`` and its
    sharding (``host`` for a host value)."""
    leaves, tree = jax.tree.flatten(args)
    parts = [str(tree)]
    for x in leaves:
        aval = jax.typeof(x) if isinstance(x, jax.Array) else None
        sharding = getattr(x, "sharding", None) if isinstance(x, jax.Array) else None
        parts.append(f"{aval.str_short() if aval is not None else type(x).__name__}"
                     f"{'{weak}' if aval is not None and aval.weak_type else ''} {sharding if sharding else 'host'}")
    return "\n".join(parts)


def _sig_hash(sig: str) -> str:
    return hashlib.sha256(sig.encode()).hexdigest()[:12]


class _Store:
    """One folder: its manifest, and the executables loaded or recorded so far."""

    def __init__(self, folder: str, record: bool):
        self.folder, self.record = folder, record
        self.manifest: dict = {"format": FORMAT, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
                               "commit": _commit(), "target": None, "programs": []}
        self.config: str | None = None  # the engine's config hash (select)
        self.why_not: str | None = None  # set: the folder does not fit; everything compiles
        self.said: set[str] = set()
        self.loaded = 0
        self.saved = 0

    def say(self, line: str) -> None:
        if line not in self.said:
            self.said.add(line)
            print(f"executables: {line}", file=sys.stderr, flush=True)

    def select(self, config: str, devices: Sequence[Any]) -> None:
        """Binds the store to the engine's config hash and devices; a saved folder that does not fit
        them is switched off with one line saying why."""
        self.config = config
        here = target(devices)
        if self.record:
            self.manifest["target"] = here
            return
        m, why = self.manifest, None
        if m.get("jax") != jax.__version__ or m.get("jaxlib") != jaxlib.__version__:
            why = f"{self.folder} was saved for jax {m.get('jax')} / jaxlib {m.get('jaxlib')} (this is " \
                  f"{jax.__version__} / {jaxlib.__version__})"
        elif m.get("commit") != _commit():
            why = f"{self.folder} was saved by commit {m.get('commit')} (this is {_commit()})"
        elif m.get("target") != here:
            saved = m.get("target") or {}
            diff = ", ".join(f"{k} {saved.get(k)!r} (here {v!r})" for k, v in here.items() if saved.get(k) != v)
            why = f"{self.folder} was saved for another target: {diff}"
        elif not any(p.get("config") == config for p in m.get("programs", [])):
            why = f"{self.folder} was saved for another config (hash {', '.join(sorted({p.get('config', '?') for p in m.get('programs', [])}))}; this run's is {config})"
        if why:
            self.why_not = why
            self.say(f"{why}, compiling")

    def find(self, stage: str, sig: str) -> dict | None:
        for p in self.manifest["programs"]:
            if p["stage"] == stage and p["config"] == self.config and p["signature"] == sig:
                return p
        return None

    def load(self, stage: str, sig: str) -> Any:
        """The saved executable of ``stage`` for inputs ``sig``, or None (then the caller compiles)."""
        if self.why_not is not None or self.record:
            return None
        p = self.find(stage, sig)
        if p is None:
            self.say(f"{self.folder} has no {stage} program for these inputs, compiling it")
            return None
        payload, in_tree, out_tree = pickle.loads(fileio.read_bytes(paths.join(self.folder, p["file"])))
        self.loaded += 1
        return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)

    def save(self, stage: str, sig: str, compiled: Any) -> None:
        if self.find(stage, sig) is not None:
            return
        name = f"{stage}_{_sig_hash(self.config + sig)}.xla.pkl"
        fileio.write_bytes_atomic(paths.join(self.folder, name), pickle.dumps(serialize_executable.serialize(compiled)))
        self.manifest["programs"].append({"stage": stage, "config": self.config, "signature": sig, "file": name})
        fileio.write_text_atomic(paths.join(self.folder, MANIFEST), json.dumps(self.manifest, indent=1))
        self.saved += 1


_active: dict[str, _Store | None] = {"store": None}


def read_folder(folder: str) -> _Store:
    """The store of a folder ``aot --save`` wrote.

    Raises:
      ExecutablesError: no such folder, or no readable manifest in it."""
    if not fileio.isdir(folder):
        raise ExecutablesError(f"--executables={folder} is not a folder; make one with "
                               f"python -m animegamer_jax.commands.aot --save={folder} --topology=... --program=turn")
    path = paths.join(folder, MANIFEST)
    try:
        manifest = json.loads(fileio.read_bytes(path))
    except FileNotFoundError:
        raise ExecutablesError(f"--executables={folder} has no {MANIFEST}; make one with python -m "
                               f"animegamer_jax.commands.aot --save={folder} --topology=... --program=turn") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ExecutablesError(f"{path} is not a manifest ({e}); remake the folder with aot --save") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ExecutablesError(f"{path} is not a {FORMAT} manifest; remake the folder with "
                               f"python -m animegamer_jax.commands.aot --save={folder}")
    store = _Store(folder, record=False)
    store.manifest = manifest
    return store


@contextlib.contextmanager
def use(folder: str):
    """Within: stages load the programs of ``folder`` (``""``: none; everything compiles).

    Raises:
      ExecutablesError: as :func:`read_folder`."""
    store = read_folder(folder) if folder else None
    before, _active["store"] = _active["store"], store
    try:
        yield store
    finally:
        _active["store"] = before


@contextlib.contextmanager
def recording(folder: str):
    """Within: every stage program compiled is also serialized into ``folder`` (created; a manifest
    already there from another jax / commit / target is replaced, its files are not).

    JAX's persistent compilation cache is off within (restored on exit): XLA:CPU cannot serialize
    again an executable it loaded from that cache (the saved copy then fails to run with
    ``NOT_FOUND: Function wrapped_slice not found``), so every recorded program is compiled afresh."""
    fileio.makedirs(folder)
    store = _Store(folder, record=True)
    try:  # add to a folder of this jax, commit and target (another config's or layout's programs)
        old = read_folder(folder).manifest
        if all(old.get(k) == store.manifest[k] for k in ("jax", "jaxlib", "commit")):
            store.manifest["programs"] = list(old.get("programs", []))
            store.manifest["target"] = old.get("target")
    except ExecutablesError:
        pass
    before, _active["store"] = _active["store"], store
    cache_on = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    jax_cache.reset_cache()
    try:
        yield store
    finally:
        _active["store"] = before
        jax.config.update("jax_enable_compilation_cache", cache_on)
        jax_cache.reset_cache()


def select(config: Any, devices: Sequence[Any]) -> None:
    """Binds the folder in use (if any) to an engine's ``config`` and ``devices`` (:meth:`_Store.select`)."""
    store = _active["store"]
    if store is not None:
        store.select(config_hash(config), devices)


class StageJit:
    """``jax.jit(fn)`` named ``stage`` that, while a folder is in use (:func:`use`, :func:`recording`),
    runs the folder's executable for its inputs (loading) or saves what it compiles (recording).

    ``compiled(args)`` is looked up per input :func:`signature`; without a folder a call is exactly the
    jit's."""

    def __init__(self, stage: str, fn: Callable, **jit_kwargs: Any):
        self.stage = stage
        self.jit = jax.jit(fn, **jit_kwargs)
        self._exe: dict[str, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        store = _active["store"]
        if store is None or store.config is None or kwargs:  # keyword inputs (a turn's reference): the jit's
            return self.jit(*args, **kwargs)
        sig = signature(args)
        exe = self._exe.get(sig)
        if exe is None:
            if store.record:
                exe = self.jit.lower(*args).compile()
                store.save(self.stage, sig, exe)
            else:
                exe = store.load(self.stage, sig)
                if exe is None:
                    return self.jit(*args)
            self._exe[sig] = exe
        return exe(*args)

    def _cache_size(self) -> int:
        """Executables held: the jit's compiled ones plus loaded / recorded ones."""
        return self.jit._cache_size() + len(self._exe)


__all__ = ["ExecutablesError", "FORMAT", "MANIFEST", "StageJit", "config_hash", "read_folder", "recording",
           "select", "signature", "target", "use"]
