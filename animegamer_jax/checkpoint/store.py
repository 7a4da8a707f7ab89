"""Save and load a whole system: one orbax composite checkpoint, one item per component.

:func:`save_system` writes the layout of the package docstring (animegamer_jax.checkpoint) with
orbax and then ``integrity.json``; :func:`load_system` checks the files, rebuilds each component's
module abstractly from the config (``models.registry``: only ``nnx.eval_shape`` runs, nothing is
allocated), checks the stored keys and shapes against it, and restores every array straight into
its target sharding on ``mesh``, cast to the module's dtype.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from animegamer_jax import parallel

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.config import config_from_json, config_to_json, drop_removed_keys
from animegamer_jax.checkpoint.errors import CheckpointIntegrityError, SystemCheckpointError, fix_hint
from animegamer_jax.checkpoint.integrity import INTEGRITY_FILE, verify_checkpoint, write_integrity
from animegamer_jax.models.registry import COMPONENT_BUILDERS, COMPONENTS, STORED_LAYOUTS, Builder
from animegamer_jax.weights import count_params

#: ``manifest/metadata`` ``"format"``
FORMAT_VERSION = 1


def pure_dict(module_or_state: Any) -> Any:
    """The nested dict of arrays that is stored for a component: ``nnx.state(module)`` without RNG
    state, as a pure dict (a pure dict is returned as it is)."""
    state = nnx.state(module_or_state) if isinstance(module_or_state, nnx.Module) else module_or_state
    state = nnx.filter_state(state, nnx.Not(nnx.RngState)) if isinstance(state, nnx.State) else state
    return state.to_pure_dict() if isinstance(state, nnx.State) else state


def read_json(directory: str, item: str, what: str) -> Any:
    """The JSON of item ``item`` (``DIR/<item>/metadata``), or None when the file is absent.

    Raises:
      CheckpointIntegrityError: the file is not valid JSON (``what`` names it in the message).
    """
    path = paths.join(str(paths.as_path(directory)), item, "metadata")
    if not fileio.exists(path):
        return None
    try:
        return json.loads(fileio.read_bytes(path).decode("utf-8"))
    except (ValueError, OSError) as e:
        raise CheckpointIntegrityError(f"{path} ({what}) is damaged ({type(e).__name__}: "
                                       f"{str(e).splitlines()[0]}). {fix_hint(directory)}") from None


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

    After orbax commits, process 0 writes ``integrity.json`` (sizes and sha256 of every file, which
    reads every file once).
    """
    if not components:
        raise SystemCheckpointError("save_system: no components given")
    directory = str(paths.as_path(directory))
    if fileio.exists(directory) and not force:
        raise SystemCheckpointError(f"system checkpoint {directory} exists; pass force=True to overwrite")
    items: dict[str, Any] = {}
    counts = {}
    for name, comp in components.items():
        pure = pure_dict(comp)
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
        multihost_utils.sync_global_devices(f"save_system:{directory}")
    return directory


def is_complete(directory: str) -> bool:
    """True when ``directory`` holds a finished system checkpoint: ``integrity.json`` is written
    after orbax has committed every file, locally and on object stores alike."""
    return (fileio.isfile(paths.join(str(paths.as_path(directory)), "manifest", "metadata"))
            and fileio.isfile(paths.join(str(paths.as_path(directory)), INTEGRITY_FILE)))


def read_manifest(directory: str) -> dict:
    """The manifest of a system checkpoint: ``{"format", "components", "param_counts"}`` and, when
    the writer gave one, ``"description"`` (:func:`save_system`).

    Raises:
      SystemCheckpointError: no checkpoint (or no manifest) at ``directory``.
    """
    man = read_json(directory, "manifest", "the component list")
    if man is None:
        raise SystemCheckpointError(f"{directory} is not a system checkpoint (no manifest/metadata); "
                                    f"write one with save_system or `python -m animegamer_jax.commands.train ...`")
    if not isinstance(man, dict) or not isinstance(man.get("components"), list):
        raise CheckpointIntegrityError(f"{directory}/manifest/metadata is damaged (no component list). "
                                       f"{fix_hint(directory)}")
    return man


def load_config(directory: str) -> ml_collections.ConfigDict:
    """The config saved in a system checkpoint, less the keys the configs no longer have
    (config.py ``REMOVED_KEYS``: an older checkpoint's output folders).

    Raises:
      SystemCheckpointError: no ``config/metadata``; CheckpointIntegrityError: it is damaged.
    """
    cfg = read_json(directory, "config", "the saved config")
    if cfg is None:
        raise SystemCheckpointError(f"{directory}: no saved config (config/metadata)")
    if not isinstance(cfg, dict):
        raise CheckpointIntegrityError(f"{directory}/config/metadata is damaged (not a config). "
                                       f"{fix_hint(directory)}")
    return drop_removed_keys(config_from_json(cfg))


def abstract_component(
    name: str,
    config: ml_collections.ConfigDict,
    mesh: Mesh,
    rules: parallel.mesh.LogicalRules = parallel.DEFAULT_RULES,
    builders: Mapping[str, Builder] | None = None,
) -> tuple[nnx.GraphDef, nnx.State, Any]:
    """Graphdef, abstract state (ShapeDtypeStructs with target shardings) and shardings of one component.

    Nothing is allocated: the module is only evaluated with ``nnx.eval_shape``. ``builders`` add to
    or override ``models.registry.COMPONENT_BUILDERS``.

    Raises:
      SystemCheckpointError: no builder for ``name``.
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


def _flat_keys(tree: Any) -> list[str]:
    """``"a/b/kernel"`` of every leaf of ``tree``, in leaf order."""
    return ["/".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)
            for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _component_metadata(directory: str, name: str) -> Any:
    """orbax's metadata tree of component ``name`` (no array is read).

    Raises:
      CheckpointIntegrityError: the metadata cannot be read (one line naming the component).
    """
    try:
        md = ocp.PyTreeCheckpointHandler().metadata(paths.as_path(directory) / name)
    except Exception as e:  # noqa: BLE001  orbax/TensorStore/JSON errors of a damaged file
        raise CheckpointIntegrityError(f"{directory}: cannot read the metadata of component {name!r} "
                                       f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                                       f"{fix_hint(directory)}") from None
    return getattr(md, "tree", md)


def stored_shapes(directory: str, name: str) -> dict[str, tuple[int, ...]]:
    """``{"a/b/kernel": shape}`` of one stored component, read from orbax metadata (no array reads)."""
    tree = _component_metadata(directory, name)
    return {k: tuple(v.shape) for k, v in zip(_flat_keys(tree), jax.tree.leaves(tree))}


def stored_dtypes(directory: str, name: str) -> dict[str, Any]:
    """``jax.tree_util.keystr(path) -> dtype`` of every array of component ``name`` as stored in
    ``directory`` (orbax metadata; no array is read)."""
    tree = _component_metadata(directory, name)
    return {jax.tree_util.keystr(p): leaf.dtype for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


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
                    "`python -m animegamer_jax.commands.convert dit migrate SRC DST`")
        raise SystemCheckpointError(
            f"component {name!r} in {directory} does not match the module built from the config: "
            f"missing keys {missing[:10]}, unexpected keys {unexpected[:10]}, mis-shaped {misshaped[:10]}{hint}")


def _restore_arg(x: Any) -> ocp.ArrayRestoreArgs:
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        sharding = NamedSharding(parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1]), PartitionSpec())
    return ocp.ArrayRestoreArgs(sharding=sharding, global_shape=x.shape, dtype=x.dtype)


def array_restore_args(target: Any) -> Any:
    """``ocp.ArrayRestoreArgs`` for every leaf of a pure-dict restore target (ShapeDtypeStructs):
    each array is restored straight into the leaf's NamedSharding (a leaf without one: replicated
    on this process's first device), at the leaf's shape and dtype (orbax casts)."""
    return jax.tree.map(_restore_arg, target)


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

    A component stored in an older key layout (``models.registry.STORED_LAYOUTS``) is read through it.

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
    pure_targets = {n: pure_dict(targets[n]) for n in names}
    old_layout = set()
    for n in names:
        try:
            check_component(directory, n, pure_targets[n])
        except SystemCheckpointError:
            if n not in STORED_LAYOUTS:
                raise
            stored = STORED_LAYOUTS[n][0](pure_targets[n])
            try:
                check_component(directory, n, stored)
            except SystemCheckpointError:
                check_component(directory, n, pure_targets[n])  # raise naming today's keys
            pure_targets[n] = stored
            old_layout.add(n)
    args = {n: ocp.args.PyTreeRestore(item=t, restore_args=array_restore_args(t)) for n, t in pure_targets.items()}
    try:
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
            restored = ckptr.restore(directory, ocp.args.Composite(**args))
    except Exception as e:  # noqa: BLE001  TensorStore / orbax errors of a damaged file
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointIntegrityError(f"{directory}: reading component(s) {names} failed ({type(e).__name__}: "
                                       f"{first[:200]}). {fix_hint(directory)}") from None
    return {n: _restore_into(graphdefs[n], targets[n],
                             STORED_LAYOUTS[n][1](restored[n]) if n in old_layout else restored[n]) for n in names}


def _restore_into(graphdef: nnx.GraphDef, target: nnx.State, pure: dict) -> nnx.Module:
    state = nnx.State(target)
    state.replace_by_pure_dict(pure)
    return nnx.merge(graphdef, state)
