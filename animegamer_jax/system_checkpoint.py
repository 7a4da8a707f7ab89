"""One orbax checkpoint directory holding a whole AnimeGamer system (docs/design.md#one-checkpoint-directory-for-a-whole-system).

Layout (an orbax composite checkpoint, written atomically by ``ocp.Checkpointer``)::

    DIR/
      _CHECKPOINT_METADATA          orbax bookkeeping
      integrity.json                every other file's size and sha256 (written last by save_system,
                                    checked by load_system; :func:`verify_checkpoint`)
      config/metadata               the ml_collections config used to build every component (JSON)
      manifest/metadata             {"components": [...], "param_counts": {...}, "format": 1} (JSON)
      mllm/ dit/ vae/ shot_encoder/ clip/ t5/
                                    one orbax PyTree item per component: ``nnx.state(module)``
                                    as a pure nested dict of arrays (every Variable kind: params,
                                    LoRA factors, norms; no RNG state)

Components present are those passed to :func:`save_system`; any subset may be saved or loaded
(e.g. a decoder-only checkpoint after phase a2). The training pipeline writes this layout (the
converters write one orbax folder per network, to be assembled with :func:`save_system`); the game
engine reads it with :func:`load_system`, on any mesh (arrays are restored
straight into the target shardings computed from the logical annotations, so a checkpoint saved on
8 devices loads on 1 and vice versa).

Integrity: orbax 0.12.8 has no checksum of the array data (its default zarr2 / OCDBT files carry
none; only the opt-in zarr3 layout checksums the shard *index*, crc32c), so a truncated file shows
up as a raw TensorStore error and overwritten bytes load silently. :func:`save_system` therefore
writes ``integrity.json`` after orbax commits, and :func:`load_system` checks it first
(``verify="fast"``: every file present with its size, files up to :data:`FULL_HASH_BELOW` bytes
fully hashed, larger ones by :data:`SAMPLE_BLOCKS` evenly spaced blocks of :data:`SAMPLE_BLOCK`
bytes; ``verify="full"``: sha256 of every byte). A checkpoint without it (older, or copied without
it) is refused with the fix; ``python -m animegamer_jax.system_checkpoint manifest DIR`` writes one
for a checkpoint you trust, ``... verify [--full] DIR`` checks one. Any damaged, truncated or missing
file gives one :class:`CheckpointIntegrityError` line naming the file and the fix.

How a component is rebuilt: ``COMPONENT_BUILDERS[name](config, rngs) -> nnx.Module`` builds an
empty module of the right shapes from the config (only its abstract shape is ever evaluated, with
``nnx.eval_shape``); pass ``builders=`` to override or add kinds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from animegamer_jax import fileio, parallel, paths
from animegamer_jax.convert.common import count_params

COMPONENTS: tuple[str, ...] = ("mllm", "dit", "vae", "shot_encoder", "clip", "t5")
FORMAT_VERSION = 1

Builder = Callable[[ml_collections.ConfigDict, nnx.Rngs], nnx.Module]


class SystemCheckpointError(ValueError):
    """A system checkpoint that is missing, incomplete, or does not match the requested config."""


class CheckpointIntegrityError(SystemCheckpointError):
    """A file of a system checkpoint is missing, truncated or damaged (the message names it and the fix)."""


INTEGRITY_FILE = "integrity.json"
#: files up to this size are fully hashed even by the fast check (bytes)
FULL_HASH_BELOW = 8 << 20
#: the fast check of a larger file hashes this many evenly spaced blocks (first and last included) ...
SAMPLE_BLOCKS = 16
#: ... of this many bytes each
SAMPLE_BLOCK = 64 << 10


def _fix(directory: str) -> str:
    return (f"Fix: copy the whole checkpoint folder again or re-save it with save_system; check it with "
            f"`python -m animegamer_jax.system_checkpoint verify --full {directory}`")


def integrity_manifest(directory: str) -> dict:
    """Sizes and hashes of every file under ``directory`` (what ``integrity.json`` holds).

    ``{"format": 1, "sample": {...}, "files": {relpath: {"size", "sha256"[, "sampled_sha256"]}}}``;
    ``sampled_sha256`` (fileio.sha256_sampled) only for files over :data:`FULL_HASH_BELOW` bytes.
    """
    files = {}
    for rel in fileio.walk_files(directory):
        if rel == INTEGRITY_FILE:
            continue
        path = fileio.join(directory, rel)
        n = fileio.size(path)
        entry = {"size": n, "sha256": fileio.sha256_file(path)}
        if n > FULL_HASH_BELOW:
            entry["sampled_sha256"] = fileio.sha256_sampled(path, n, SAMPLE_BLOCK, SAMPLE_BLOCKS)
        files[rel] = entry
    return {"format": 1, "sample": {"full_hash_below": FULL_HASH_BELOW, "blocks": SAMPLE_BLOCKS,
                                    "block": SAMPLE_BLOCK}, "files": files}


def write_integrity(directory: str) -> str:
    """Writes ``directory/integrity.json`` for the files there now (atomic); returns its path."""
    path = fileio.join(directory, INTEGRITY_FILE)
    fileio.write_text_atomic(path, json.dumps(integrity_manifest(directory), indent=1, sort_keys=True) + "\n")
    return path


def _read_integrity(directory: str) -> dict:
    path = fileio.join(directory, INTEGRITY_FILE)
    if not fileio.isfile(path):
        raise CheckpointIntegrityError(
            f"{directory}: no {INTEGRITY_FILE}, so its files cannot be checked (saved by an older version, "
            f"copied without it, or the save did not finish). Fix: re-save it with save_system; if you "
            f"trust it, write one with `python -m animegamer_jax.system_checkpoint manifest {directory}`")
    try:
        man = json.loads(fileio.read_bytes(path).decode("utf-8"))
        files = man["files"]
        for v in files.values():
            int(v["size"]), str(v["sha256"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointIntegrityError(
            f"{path} is damaged ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'bad content'}). "
            f"{_fix(directory)}") from None
    return man


def verify_checkpoint(directory: str, mode: str = "fast") -> dict:
    """Checks every file of a system checkpoint against its ``integrity.json``; returns the latter.

    Args:
      mode: ``"fast"`` (sizes; full sha256 of files up to :data:`FULL_HASH_BELOW` bytes, sampled
        blocks of larger ones) or ``"full"`` (sha256 of every byte).

    Raises:
      CheckpointIntegrityError: no or damaged ``integrity.json``, or a file missing, of another
        size or with another hash (one line naming the file and the fix).
      ValueError: unknown ``mode``.
    """
    if mode not in ("fast", "full"):
        raise ValueError(f"verify mode must be 'fast' or 'full', got {mode!r}")
    directory = str(paths.as_path(directory))
    man = _read_integrity(directory)
    key = (directory, mode, _stamp(directory, man))
    if key in _VERIFIED:  # checked already by this process and unchanged since (play reads the config, then loads)
        return man
    sample = man.get("sample", {})
    for rel, want in sorted(man["files"].items()):
        path = fileio.join(directory, rel)
        if not fileio.isfile(path):
            raise CheckpointIntegrityError(f"{directory}: file {rel} is missing (the checkpoint is incomplete). "
                                           f"{_fix(directory)}")
        n = fileio.size(path)
        if n != want["size"]:
            what = "truncated" if n < want["size"] else "longer than saved"
            raise CheckpointIntegrityError(f"{directory}: file {rel} is {what} ({n} bytes, {want['size']} when "
                                           f"saved). {_fix(directory)}")
        if mode == "fast" and "sampled_sha256" in want:
            got = fileio.sha256_sampled(path, n, int(sample.get("block", SAMPLE_BLOCK)),
                                        int(sample.get("blocks", SAMPLE_BLOCKS)))
            ok = got == want["sampled_sha256"]
        else:
            ok = fileio.sha256_file(path) == want["sha256"]
        if not ok:
            raise CheckpointIntegrityError(f"{directory}: file {rel} is damaged (its sha256 differs from the "
                                           f"one saved in {INTEGRITY_FILE}). {_fix(directory)}")
    if mode == "full":
        _VERIFIED.add((directory, "fast", key[2]))
    _VERIFIED.add(key)
    return man


_VERIFIED: set[tuple[str, str, str]] = set()


def _stamp(directory: str, man: dict) -> str:
    """The manifest plus every listed file's size and mtime: changes when any of them changes."""
    stats = []
    for rel in sorted(man["files"]):
        try:
            stats.append((rel, *fileio.stamp(fileio.join(directory, rel))))
        except OSError:
            stats.append((rel, -1, -1))
    return json.dumps([man, stats], sort_keys=True)


def checkpoint_identity(directory: str) -> str:
    """``"sha256:<hex>"`` of a checkpoint's ``integrity.json``: names its exact content (output fingerprints).

    Raises:
      CheckpointIntegrityError: no ``integrity.json``.
    """
    _read_integrity(str(paths.as_path(directory)))
    return "sha256:" + fileio.sha256_file(fileio.join(str(paths.as_path(directory)), INTEGRITY_FILE))


def _read_json(directory: str, item: str, what: str) -> Any:
    path = fileio.join(str(paths.as_path(directory)), item, "metadata")
    if not fileio.exists(path):
        return None
    try:
        return json.loads(fileio.read_bytes(path).decode("utf-8"))
    except (ValueError, OSError) as e:
        raise CheckpointIntegrityError(f"{path} ({what}) is damaged ({type(e).__name__}: "
                                       f"{str(e).splitlines()[0]}). {_fix(directory)}") from None


def _import(path: str) -> Any:
    module, _, attr = path.partition(":")
    mod = __import__(module, fromlist=[attr])
    return getattr(mod, attr)


def _build_mllm(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    return _import("animegamer_jax.models.mistral.mllm:GameStateMLLM").from_config(config, rngs=rngs)


def _build_dit(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    dit = _import("animegamer_jax.models.cogvideox.dit:CogVideoXDiT")
    dit_cfg = _import("animegamer_jax.models.cogvideox.dit:DiTConfig").from_config(
        config.dit, text_length=int(config.rep.num_text_tokens + config.rep.num_image_tokens))
    return dit(dit_cfg, rngs=rngs)


def _build_vae(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    return _import("animegamer_jax.models.cogvideox.vae:CogVideoXVAE").from_config(config.vae, rngs=rngs)


def _build_shot_encoder(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    return _import("animegamer_jax.models.shot_encoder.model:ShotEncoder").from_config(config, rngs=rngs)


def _build_clip(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    return _import("animegamer_jax.models.clip.model:CLIP").from_config(config.clip, rngs=rngs)


def _build_t5(config: ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    return _import("animegamer_jax.models.t5.model:T5Encoder").from_config(config.t5, rngs=rngs)


#: component name -> builder(config, rngs) -> module (full config in, each builder picks its sections)
COMPONENT_BUILDERS: dict[str, Builder] = {
    "mllm": _build_mllm,
    "dit": _build_dit,
    "vae": _build_vae,
    "shot_encoder": _build_shot_encoder,
    "clip": _build_clip,
    "t5": _build_t5,
}


def config_to_json(config: ml_collections.ConfigDict) -> dict:
    """JSON-safe dict of a config; tuples become lists (restored to tuples by :func:`config_from_json`)."""
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


def _pure(module_or_state: Any) -> dict:
    state = nnx.state(module_or_state) if isinstance(module_or_state, nnx.Module) else module_or_state
    state = nnx.filter_state(state, nnx.Not(nnx.RngState)) if isinstance(state, nnx.State) else state
    return state.to_pure_dict() if isinstance(state, nnx.State) else state


def save_system(
    directory: str,
    components: Mapping[str, nnx.Module | nnx.State],
    config: ml_collections.ConfigDict,
    *,
    force: bool = False,
    description: str = "",
) -> str:
    """Writes a system checkpoint (one orbax item per component, plus the config and a manifest).

    Args:
      directory: target directory (absolute, relative or a URL such as ``gs://bucket/system``;
        created; must not exist unless ``force``).
      components: name -> module (or its ``nnx.State``); names from :data:`COMPONENTS` or any
        name that has a builder at load time. Arrays may live on any mesh; every process calls this
        (orbax writes each shard once).
      config: the config every component was built from (saved as JSON).
      force: overwrite an existing checkpoint.
      description: what the system is, in a sentence or two (what it was trained on, what it can
        show); stored in the manifest when given and shown by the game outputs (game.json
        ``system_description``, the gallery, play's summary, the web app).

    Returns:
      The absolute directory path.

    Raises:
      SystemCheckpointError: empty ``components``, or the directory exists and ``force`` is False.

    After orbax commits, process 0 writes ``integrity.json`` (sizes and sha256 of every file; on a
    full-size checkpoint this reads it once, see README "Checkpoint integrity" for timings).
    """
    if not components:
        raise SystemCheckpointError("save_system: no components given")
    directory = str(paths.as_path(directory))
    if fileio.exists(directory) and not force:
        raise SystemCheckpointError(f"system checkpoint {directory} exists; pass force=True to overwrite")
    items: dict[str, Any] = {}
    counts = {}
    for name, comp in components.items():
        pure = _pure(comp)
        counts[name] = count_params(pure)
        items[name] = ocp.args.PyTreeSave(pure)
    items["config"] = ocp.args.JsonSave(config_to_json(config))
    manifest = {"format": FORMAT_VERSION, "components": sorted(components), "param_counts": counts}
    if description:
        manifest["description"] = str(description)
    items["manifest"] = ocp.args.JsonSave(manifest)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        ckptr.save(directory, ocp.args.Composite(**items), force=force)
    # orbax has committed every file; the integrity manifest goes last (load_system requires it)
    if jax.process_index() == 0:
        write_integrity(directory)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"save_system:{directory}")
    return directory


def is_complete(directory: str) -> bool:
    """True when ``directory`` holds a finished system checkpoint: ``integrity.json`` is written
    after orbax has committed every file, locally and on object stores alike."""
    return (fileio.isfile(fileio.join(str(paths.as_path(directory)), "manifest", "metadata"))
            and fileio.isfile(fileio.join(str(paths.as_path(directory)), INTEGRITY_FILE)))


def read_manifest(directory: str) -> dict:
    """The manifest of a system checkpoint: ``{"format", "components", "param_counts"}`` and, when
    the writer gave one, ``"description"`` (:func:`save_system`).

    Raises:
      SystemCheckpointError: no checkpoint (or no manifest) at ``directory``.
    """
    man = _read_json(directory, "manifest", "the component list")
    if man is None:
        raise SystemCheckpointError(f"{directory} is not a system checkpoint (no manifest/metadata); "
                                    f"write one with save_system or `python -m animegamer_jax.train ...`")
    if not isinstance(man, dict) or not isinstance(man.get("components"), list):
        raise CheckpointIntegrityError(f"{directory}/manifest/metadata is damaged (no component list). "
                                       f"{_fix(directory)}")
    return man


def load_config(directory: str) -> ml_collections.ConfigDict:
    """The config saved in a system checkpoint."""
    cfg = _read_json(directory, "config", "the saved config")
    if cfg is None:
        raise SystemCheckpointError(f"{directory}: no saved config (config/metadata)")
    if not isinstance(cfg, dict):
        raise CheckpointIntegrityError(f"{directory}/config/metadata is damaged (not a config). {_fix(directory)}")
    return config_from_json(cfg)


def abstract_component(
    name: str,
    config: ml_collections.ConfigDict,
    mesh: Mesh,
    rules: parallel.mesh.LogicalRules = parallel.DEFAULT_RULES,
    builders: Mapping[str, Builder] | None = None,
) -> tuple[nnx.GraphDef, nnx.State, Any]:
    """Graphdef, abstract state (ShapeDtypeStructs with target shardings) and shardings of one component.

    Nothing is allocated: the module is only evaluated with ``nnx.eval_shape``.
    """
    table = dict(COMPONENT_BUILDERS, **(builders or {}))
    if name not in table:
        raise SystemCheckpointError(f"no builder for component {name!r}; known: {sorted(table)}")
    build = table[name]
    abstract = nnx.eval_shape(lambda: build(config, nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shardings = parallel.param_shardings(state, mesh, rules)
    target = jax.tree.map(
        lambda v, s: jax.ShapeDtypeStruct(v.get_raw_value().shape, v.get_raw_value().dtype, sharding=s)
        if isinstance(v, nnx.Variable) else v,
        state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return graphdef, target, shardings


def stored_shapes(directory: str, name: str) -> dict[str, tuple[int, ...]]:
    """``{"a/b/kernel": shape}`` of one stored component, read from orbax metadata (no array reads)."""
    handler = ocp.PyTreeCheckpointHandler()
    try:
        md = handler.metadata(paths.as_path(directory) / name)
    except Exception as e:  # noqa: BLE001  orbax/TensorStore/JSON errors of a damaged file
        raise CheckpointIntegrityError(f"{directory}: cannot read the metadata of component {name!r} "
                                       f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                                       f"{_fix(directory)}") from None
    tree = getattr(md, "tree", md)
    return {k: tuple(v.shape) for k, v in zip(_flat_keys(tree), jax.tree.leaves(tree))}


def check_component(directory: str, name: str, target_pure: Any) -> None:
    """Raises :class:`SystemCheckpointError` naming missing / unexpected / mis-shaped keys."""
    have = stored_shapes(directory, name)
    want = {k: tuple(v.shape) for k, v in zip(_flat_keys(target_pure), jax.tree.leaves(target_pure))}
    missing = sorted(set(want) - set(have))
    unexpected = sorted(set(have) - set(want))
    misshaped = sorted(f"{k}: stored {have[k]} vs config {want[k]}" for k in set(want) & set(have)
                       if have[k] != want[k])
    if missing or unexpected or misshaped:
        hint = ""
        if name == "dit" and "blocks/qkv_kernel" in unexpected:
            hint = (". Fix: this DiT has the old flat block layout; rewrite the checkpoint with "
                    "`python -m animegamer_jax.convert dit migrate SRC DST`")
        raise SystemCheckpointError(
            f"component {name!r} in {directory} does not match the module built from the config: "
            f"missing keys {missing[:10]}, unexpected keys {unexpected[:10]}, mis-shaped {misshaped[:10]}{hint}")


def _restore_into(graphdef: nnx.GraphDef, target: nnx.State, pure: dict, name: str) -> nnx.Module:
    state = nnx.State(target)
    state.replace_by_pure_dict(pure)
    return nnx.merge(graphdef, state)


def _flat_keys(tree: Any) -> list[str]:
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out.append("/".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path))
    return out


def load_system(
    directory: str,
    config: ml_collections.ConfigDict | None = None,
    mesh: Mesh | None = None,
    *,
    names: Iterable[str] | None = None,
    rules: parallel.mesh.LogicalRules | None = None,
    builders: Mapping[str, Builder] | None = None,
    verify: str | None = "fast",
) -> dict[str, nnx.Module]:
    """Loads components of a system checkpoint as NNX modules placed on ``mesh``.

    Args:
      directory: a directory written by :func:`save_system`.
      config: the config to build modules from; default the one saved in the checkpoint. Shapes
        must match the saved arrays (the error names mismatching keys); dtypes follow the config
        (arrays are cast on restore, e.g. fp32 training masters -> bf16 inference weights).
      mesh: target mesh; default a 1-device mesh on ``jax.devices()[0]``.
      names: components to load; default all in the manifest.
      rules: logical rules; default ``config.sharding_rules``.
      builders: extra/overriding ``name -> builder(config, rngs)``.
      verify: :func:`verify_checkpoint` mode run first (``"fast"``, ``"full"``), or None when the
        caller has just verified it.

    Returns:
      ``{name: module}`` for every requested component.

    Raises:
      CheckpointIntegrityError: a missing, truncated or damaged file (named), or no integrity.json.
      SystemCheckpointError: no checkpoint, a requested component absent from it, no builder,
        key/shape mismatch, or any read error of the array files (one line, never a TensorStore
        traceback).
    """
    directory = str(paths.as_path(directory))
    if verify is not None:
        verify_checkpoint(directory, verify)
    manifest = read_manifest(directory)
    if config is None:
        config = load_config(directory)
    names = list(manifest["components"] if names is None else names)
    absent = [n for n in names if n not in manifest["components"]]
    if absent:
        raise SystemCheckpointError(f"{directory} has no component(s) {absent}; it holds {manifest['components']}")
    if mesh is None:
        mesh = parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1])
    if rules is None:
        rules = parallel.rules_from_config(config) if "sharding_rules" in config else parallel.DEFAULT_RULES
    targets, graphdefs = {}, {}
    for name in names:
        graphdefs[name], targets[name], _ = abstract_component(name, config, mesh, rules, builders)
    for n in names:
        check_component(directory, n, _pure(targets[n]))
    args = {n: ocp.args.PyTreeRestore(item=_pure(targets[n]),
                                      restore_args=jax.tree.map(_restore_arg, _pure(targets[n])))
            for n in names}
    try:
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
            restored = ckptr.restore(directory, ocp.args.Composite(**args))
    except Exception as e:  # noqa: BLE001  TensorStore / orbax errors of a damaged file
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointIntegrityError(f"{directory}: reading component(s) {names} failed ({type(e).__name__}: "
                                       f"{first[:200]}). {_fix(directory)}") from None
    return {n: _restore_into(graphdefs[n], targets[n], restored[n], n) for n in names}


def _restore_arg(x: Any) -> ocp.ArrayRestoreArgs:
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        sharding = NamedSharding(parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1]), PartitionSpec())
    return ocp.ArrayRestoreArgs(sharding=sharding, global_shape=x.shape, dtype=x.dtype)


class SystemWriter:
    """Writes a system checkpoint (the :func:`save_system` layout) leaf by leaf, or layer by layer.

    For conversions whose weights do not fit in memory. Each component is an orbax PyTree item
    stored without OCDBT: one zarr array per leaf (named by its key path, zstd, as orbax writes a
    ``np.ndarray`` leaf) plus ``_METADATA``; :func:`load_system` restores it like any other item
    (orbax detects the format). A stacked ``[L, ...]`` leaf can be written one layer at a time, so
    memory is bounded by one layer of one leaf. Nothing is final until :meth:`finish`::

        w = SystemWriter(tmp_dir, config)
        w.add("vae", ("decoder", "conv_in", "conv", "kernel"), array)     # a whole leaf
        put = w.stacked("dit", ("blocks", "attn1", "to_q", "kernel"), (30, 1920, 30, 64), "float32")
        for l in range(30): put(l, layer_l)                              # one layer at a time
        w.finish()                                                       # then rename tmp_dir

    Args:
      directory: new directory (must not exist), normally a temporary sibling of the target; or a
        URL (``gs://bucket/system``: tensorstore's ``gcs`` kvstore, other schemes as tensorstore
        URLs), written in place since object stores cannot rename a folder; ``integrity.json``,
        written last by :meth:`finish`, marks it complete (:func:`is_complete`).
      config: the config every component was built from (saved as JSON).

    Raises:
      SystemCheckpointError: ``directory`` exists, a leaf path given twice, a write after
        :meth:`finish`.
    """

    CHUNK_BYTES = 64 << 20

    def __init__(self, directory: str, config: ml_collections.ConfigDict):
        self.directory = str(paths.as_path(directory))
        if fileio.exists(self.directory):
            raise SystemCheckpointError(f"{self.directory} exists; SystemWriter writes a new directory")
        fileio.makedirs(self.directory)
        self.config = config
        self._tree: dict[str, dict[str, Any]] = {}
        self.counts: dict[str, int] = {}
        self._pending: list[tuple[Any, Any]] = []  # (write future, source array kept alive)
        self._pending_bytes = 0
        self._done = False

    def _open(self, name: str, path: tuple, shape: tuple[int, ...], dtype: Any, chunks: tuple[int, ...]):
        import tensorstore as ts

        if self._done:
            raise SystemCheckpointError("SystemWriter: write after finish")
        keys = tuple(str(k) for k in path)
        tree = self._tree.setdefault(name, {})
        if str(keys) in tree:
            raise SystemCheckpointError(f"component {name!r}: leaf {'/'.join(keys)} written twice")
        tree[str(keys)] = {"key_metadata": [{"key": k, "key_type": 2} for k in keys],
                           "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}}
        self.counts[name] = self.counts.get(name, 0) + int(np.prod(shape))
        dt = np.dtype(dtype)
        spec = {"driver": "zarr", "kvstore": _kvstore(fileio.join(self.directory, name, ".".join(keys))),
                "metadata": {"shape": list(shape), "chunks": list(chunks), "dtype": "bfloat16" if dt.name == "bfloat16" else dt.str,
                             "compressor": {"id": "zstd", "level": 1}, "dimension_separator": "."},
                "create": True}
        return ts.open(spec).result(), dt

    def _chunks(self, shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
        if len(shape) < 2:
            return tuple(shape) or ()
        row = int(np.prod(shape[1:])) * itemsize
        return (max(1, min(shape[0], self.CHUNK_BYTES // max(row, 1))),) + tuple(shape[1:])

    def add(self, name: str, path: tuple, array: Any) -> None:
        """Writes one whole leaf of component ``name`` (numpy / jax array, stored in its dtype)."""
        arr = np.asarray(array, order="C")  # (ascontiguousarray would make a 0-d leaf 1-d)
        store, _ = self._open(name, path, arr.shape, arr.dtype, self._chunks(arr.shape, arr.dtype.itemsize))
        self._pending.append((store.write(arr), arr))
        self._pending_bytes += arr.nbytes
        if self._pending_bytes > self.CHUNK_BYTES * 4:
            self.wait()

    def wait(self) -> None:
        """Waits for every pending write (bounded: :meth:`add` waits past 256 MiB in flight)."""
        for fut, _ in self._pending:
            fut.result()
        self._pending, self._pending_bytes = [], 0

    def stacked(self, name: str, path: tuple, shape: tuple[int, ...], dtype: Any) -> Callable[[int, Any], None]:
        """Opens a ``[L, ...]`` leaf; returns ``put(l, value)`` writing layer ``l`` (cast to ``dtype``)."""
        dt = np.dtype(dtype)
        store, dt = self._open(name, path, tuple(shape), dt, (1,) + tuple(shape[1:]))

        def put(l: int, value: Any) -> None:
            store[l].write(np.asarray(value).astype(dt, copy=False)).result()

        return put

    def add_state(self, name: str, state: Any) -> None:
        """Writes every leaf of an ``nnx.State`` / module / pure dict."""
        pure = _pure(state)
        for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]:
            self.add(name, tuple(getattr(p, "key", getattr(p, "idx", p)) for p in path), leaf)

    def finish(self) -> str:
        """Writes each item's ``_METADATA``, the config, the manifest and orbax's checkpoint metadata."""
        import time

        self.wait()
        handlers = {}
        pytree = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
        json_h = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"
        d = self.directory
        for n, tree in self._tree.items():
            fileio.write_text_atomic(fileio.join(d, n, "_METADATA"), json.dumps(
                {"tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False,
                 "store_array_data_equal_to_fill_value": True, "custom_metadata": None}))
            _commit(fileio.join(d, n))
            handlers[n] = pytree
        manifest = {"format": FORMAT_VERSION, "components": sorted(self._tree), "param_counts": self.counts}
        for n, payload in (("config", config_to_json(self.config)), ("manifest", manifest)):
            fileio.makedirs(fileio.join(d, n))
            fileio.write_text_atomic(fileio.join(d, n, "metadata"), json.dumps(payload))
            _commit(fileio.join(d, n))
            handlers[n] = json_h
        now = time.time_ns()
        fileio.write_text_atomic(fileio.join(d, "_CHECKPOINT_METADATA"), json.dumps(
            {"item_handlers": handlers, "metrics": {}, "performance_metrics": {},
             "init_timestamp_nsecs": now, "commit_timestamp_nsecs": now, "custom_metadata": {}}))
        _commit(d)
        write_integrity(self.directory)  # last, as save_system does (load_system requires it)
        self._done = True
        return self.directory


def _commit(directory: str) -> None:
    fileio.write_text_atomic(fileio.join(directory, "commit_success.txt"),
                             f"Checkpoint commit was successful to {directory}")


def _kvstore(path: str) -> dict | str:
    """tensorstore kvstore spec of a local path or a URL (``gs://b/p``: the ``gcs`` driver, which
    honours ``TENSORSTORE_GCS_HTTP_URL``, paths.configure_gcs_emulator; else a tensorstore URL)."""
    if not paths.is_url(path):
        return {"driver": "file", "path": path}
    if path.startswith("gs://"):
        bucket, _, key = path[len("gs://"):].partition("/")
        return {"driver": "gcs", "bucket": bucket, "path": key.rstrip("/") + "/"}
    return path.rstrip("/") + "/"


def _stored_dtypes(directory: str, name: str) -> dict[str, Any]:
    """keystr(path) -> dtype of every array of component ``name`` as stored in ``directory`` (orbax
    metadata; no array is read)."""
    from etils import epath

    meta = ocp.PyTreeCheckpointHandler().metadata(epath.Path(str(paths.as_path(directory))) / name)
    tree = getattr(meta, "tree", meta)
    return {jax.tree_util.keystr(p): leaf.dtype for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def cast_system(src: str, dst: str, components: Iterable[str], dtype: str = "bfloat16",
                description: str | None = None) -> str:
    """Copies the system checkpoint ``src`` to the new directory ``dst`` with the float32 arrays of
    ``components`` stored as ``dtype`` (smaller files; :func:`load_system` casts them back to each
    module's own dtype, so only the rounding changes). Every other array keeps the dtype it is stored
    with in ``src`` (values and dtypes unchanged). Loads the whole system on this process's first
    device: meant for toy and mid-size systems such as checkpoints/tiny_system. ``description``
    replaces ``src``'s manifest description (:func:`save_system`); None keeps it.

    Returns the absolute ``dst``.

    Raises:
      SystemCheckpointError: ``src`` is damaged or lacks a named component, or ``dst`` exists (a
        user's folder is never overwritten); ValueError: ``dtype`` is not a floating dtype narrower
        than float32 (bfloat16, float16).
    """
    import jax.numpy as jnp

    target = jnp.dtype(dtype)
    if not jnp.issubdtype(target, jnp.floating) or target.itemsize >= 4:
        raise ValueError(f"cast dtype {dtype!r}: use a floating dtype narrower than float32 (bfloat16, float16)")
    names = list(components)
    src_manifest = read_manifest(src)
    held = src_manifest["components"]
    missing = [n for n in names if n not in held]
    if missing:
        raise SystemCheckpointError(f"{src} has no component(s) {missing}; it holds {held}")
    if fileio.exists(str(paths.as_path(dst))):
        raise SystemCheckpointError(f"{dst} exists; cast writes a new checkpoint (pick another folder)")
    config = load_config(src)
    out = {}
    for name, module in load_system(src, config).items():
        # load_system casts to the config's dtypes: decide from the dtypes src stores
        stored = _stored_dtypes(src, name)
        flat, treedef = jax.tree_util.tree_flatten_with_path(_pure(module))
        kinds = [stored.get(jax.tree_util.keystr(p), a.dtype) for p, a in flat]
        leaves = [a.astype(target if name in names and k == jnp.float32 else k) for (_, a), k in zip(flat, kinds)]
        out[name] = jax.tree_util.tree_unflatten(treedef, leaves)
    if description is None:
        description = str(src_manifest.get("description", ""))
    return save_system(dst, out, config, description=description)


_CLI_DOC = """Check a system checkpoint's files, write their integrity.json, or store components smaller.

Usage: python -m animegamer_jax.system_checkpoint {verify [--full] | manifest} DIR
       python -m animegamer_jax.system_checkpoint cast SRC DST --components=mllm [--dtype=bfloat16]
           [--description="what the system is"]

verify: check every file against integrity.json; manifest: write integrity.json for the files
there now (only for a checkpoint you trust); cast: copy SRC to the new folder DST with the float32
arrays of --components stored as --dtype (loading casts them back); --description replaces the
manifest's description of the system (shown in game outputs)."""


def _define_flags(fv, argv: list[str]) -> None:
    from absl import flags

    flags.DEFINE_bool("full", False, "verify: sha256 of every byte (default --nofull: the fast check, sizes and "
                      "sampled hashes)", flag_values=fv)
    flags.DEFINE_list("components", [], "cast: the components whose float32 arrays to store as --dtype",
                      flag_values=fv)
    flags.DEFINE_string("dtype", "bfloat16", "cast: the stored dtype", flag_values=fv)
    flags.DEFINE_string("description", None, "cast: what the system is (trained on what, what it can show), "
                        "stored in DST's manifest and shown in game outputs (default: SRC's; --description= clears it)", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """``python -m animegamer_jax.system_checkpoint {verify [--full] | manifest} DIR`` or
    ``... cast SRC DST --components=...``.

    verify: check every file against integrity.json; manifest: write integrity.json for the files
    there now (only for a checkpoint you trust); cast: :func:`cast_system`. Returns the exit status
    (2 with a one-line message).
    """
    from animegamer_jax import cli

    try:
        f, rest = cli.parse_flags(["python -m animegamer_jax.system_checkpoint",
                                   *(sys.argv[1:] if argv is None else argv)], _define_flags, _CLI_DOC)
        if rest[:1] == ["cast"]:
            if len(rest) != 3 or not f.components:
                raise cli.UsageError(f"expected 'cast SRC DST --components=NAME[,NAME]', got {rest}")
        elif len(rest) != 2 or rest[0] not in ("verify", "manifest"):
            raise cli.UsageError(f"expected 'verify DIR', 'manifest DIR' or 'cast SRC DST', got {rest}")
    except cli.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if rest[0] == "cast":
        t0 = time.perf_counter()
        try:
            out = cast_system(rest[1], rest[2], f.components, f.dtype, f.description)
        except (SystemCheckpointError, ValueError, TypeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {out} ({', '.join(f.components)} stored as {f.dtype}) in {time.perf_counter() - t0:.1f}s")
        return 0
    command, directory = rest
    if not fileio.isdir(directory):
        print(f"error: {directory}: no such checkpoint folder", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if command == "manifest":
        path = write_integrity(str(paths.as_path(directory)))
        print(f"wrote {path} in {time.perf_counter() - t0:.2f}s")
        return 0
    try:
        man = verify_checkpoint(directory, "full" if f.full else "fast")
    except SystemCheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    total = sum(v["size"] for v in man["files"].values())
    print(f"ok: {len(man['files'])} files, {total / 2**20:.1f} MiB, {'full' if f.full else 'fast'} check "
          f"in {time.perf_counter() - t0:.2f}s")
    return 0


def cli() -> None:
    """Console script ``animegamer-system-checkpoint`` (pyproject.toml)."""
    raise SystemExit(main())


if __name__ == "__main__":
    cli()
