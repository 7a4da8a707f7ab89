"""Device mesh, logical axis rules and sharding helpers.

One code path for 1 CPU, 8 GPUs and a TPU pod (maxtext / big_vision habit): networks annotate
parameters with *logical* axis names (``nnx.with_partitioning(init, ("embed", "mlp"))``) and
activations with :func:`constrain`; the config maps logical names to the physical mesh axes
``data``, ``fsdp``, ``tensor`` and ``context`` (``config.sharding_rules``).

Logical axis names used across the models (parameters):
  ``embed`` model width, ``mlp`` MLP inner width, ``heads`` / ``kv_heads`` attention heads,
  ``head_dim``, ``vocab``, ``layers`` (stacked scan axis), ``lora`` (LoRA rank),
  ``conv_in`` / ``conv_out`` (conv channels), ``norm`` (norm scales/biases).
Activations use the ``act_*`` names: ``act_batch``, ``act_length`` (sequence, context
parallelism), ``act_embed``, ``act_heads``, ``act_kv_heads``, ``act_mlp``, ``act_vocab``,
``act_frames``, ``act_height``, ``act_width``, ``act_channels``.
A logical name missing from the rules is replicated.

Nothing here knows any model.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.core import spmd as core_spmd
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA = "data"
FSDP = "fsdp"
TENSOR = "tensor"
CONTEXT = "context"
MESH_AXES: tuple[str, ...] = (DATA, FSDP, TENSOR, CONTEXT)

LogicalRules = Sequence[tuple[str, Any]]

#: Default logical -> mesh rules (maxtext-style FSDP + tensor + context parallelism).
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    # parameters
    ("embed", FSDP),
    ("mlp", TENSOR),
    ("heads", TENSOR),
    ("kv_heads", TENSOR),
    ("head_dim", None),
    ("vocab", TENSOR),
    ("layers", None),
    ("lora", None),
    ("conv_in", None),
    ("conv_out", TENSOR),
    ("norm", None),
    # activations
    ("act_batch", (DATA, FSDP)),
    ("act_length", CONTEXT),
    ("act_embed", None),
    ("act_heads", TENSOR),
    ("act_kv_heads", TENSOR),
    ("act_mlp", TENSOR),
    ("act_vocab", TENSOR),
    ("act_frames", None),
    ("act_height", None),
    ("act_width", None),
    ("act_channels", None),
)


class ShardingConfigError(ValueError):
    """A mesh or batch setting that cannot work on the devices at hand."""


def resolve_mesh_shape(
    shape: Sequence[int], num_devices: int, axes: Sequence[str] = MESH_AXES
) -> tuple[int, ...]:
    """Resolves one ``-1`` entry of a mesh shape to "the rest of the devices".

    Args:
      shape: one int per mesh axis; at most one may be -1.
      num_devices: devices available (``jax.device_count()``).
      axes: axis names, only for error messages.

    Returns:
      The concrete shape, whose product equals ``num_devices``.

    Raises:
      ShardingConfigError: more than one -1, a non-positive size, or sizes whose product does
        not divide / equal the device count (the message names the axes and both numbers).
    """
    shape = [int(s) for s in shape]
    if len(shape) != len(axes):
        raise ShardingConfigError(
            f"mesh shape {tuple(shape)} has {len(shape)} entries but the mesh has axes {tuple(axes)}"
        )
    if shape.count(-1) > 1:
        raise ShardingConfigError(f"mesh shape {tuple(shape)}: at most one axis may be -1")
    for a, s in zip(axes, shape):
        if s == 0 or s < -1:
            raise ShardingConfigError(f"mesh axis {a!r} has size {s}; use a positive size or -1")
    fixed = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % fixed:
            raise ShardingConfigError(
                f"mesh shape {dict(zip(axes, shape))}: fixed axes use {fixed} devices, which does "
                f"not divide the {num_devices} devices available"
            )
        shape[shape.index(-1)] = num_devices // fixed
    elif fixed != num_devices:
        raise ShardingConfigError(
            f"mesh shape {dict(zip(axes, shape))} needs {fixed} devices but {num_devices} are "
            f"available; set one axis to -1 to use the rest"
        )
    return tuple(shape)


def make_mesh(
    shape: Sequence[int] = (-1, 1, 1, 1),
    axes: Sequence[str] = MESH_AXES,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """Builds a named device mesh (Auto axis types, so plain ``jax.jit`` propagates shardings).

    Args:
      shape: sizes of ``axes``; one may be -1 (the rest of the devices).
      axes: mesh axis names, default ``("data", "fsdp", "tensor", "context")``.
      devices: devices to use, default all of ``jax.devices()`` (all processes). Devices of several
        TPU slices (``slice_index``) get a hybrid mesh: the first axis over the data-center network
        (it must be a multiple of the slice count: ShardingConfigError otherwise), the others within
        each slice.

    Returns:
      A ``jax.sharding.Mesh``.
    """
    devices = list(jax.devices() if devices is None else devices)
    concrete = resolve_mesh_shape(shape, len(devices), axes)
    slices = len({getattr(d, "slice_index", 0) for d in devices})
    if slices > 1 and concrete[0] % slices:
        raise ShardingConfigError(
            f"mesh shape {dict(zip(axes, concrete))} on {slices} TPU slices: the first axis ({axes[0]}) spans the "
            f"slices over the data-center network and must be a multiple of {slices}, e.g. "
            f"config.mesh.shape=({slices}, -1, 1, 1)")
    try:
        if slices > 1:
            # TPU multislice: the first axis (data) spans the slices over DCN, the rest stays in a slice (ICI)
            dcn = (slices,) + (1,) * (len(concrete) - 1)
            ici = (concrete[0] // slices,) + tuple(concrete[1:])
            dev_array = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
        else:
            dev_array = mesh_utils.create_device_mesh(concrete, devices=devices)
    except Exception:  # non-TPU topologies the helper does not know: plain reshape
        dev_array = np.asarray(devices, dtype=object).reshape(concrete)
    return Mesh(dev_array, tuple(axes))


def mesh_from_config(config: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds the mesh named by ``config.mesh.shape`` / ``config.mesh.axes``."""
    return make_mesh(tuple(config.mesh.shape), tuple(config.mesh.axes), devices)


def rules_from_config(config: Any) -> tuple[tuple[str, Any], ...]:
    """Returns ``config.sharding_rules`` as a tuple of (logical, mesh axes) pairs."""
    return tuple((str(k), _as_mesh_axes(v)) for k, v in config.sharding_rules)


def _as_mesh_axes(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    return tuple(v)


@contextlib.contextmanager
def sharding_context(mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> Iterator[Mesh]:
    """Activates ``mesh`` (``jax.set_mesh``) and the logical axis ``rules`` together.

    Inside it, :func:`constrain` applies sharding constraints and ``nnx.get_partition_spec``
    resolves logical names to mesh axes.
    """
    with jax.set_mesh(mesh), core_spmd.logical_axis_rules(tuple(rules)):
        yield mesh


#: mesh axes that an enclosing ``jax.vmap(..., spmd_axis_name=...)`` already splits its vmapped
#: dimension over (:func:`vmap_over_batch`): activation specs traced inside leave them out
_RESERVED: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("reserved_mesh_axes", default=())


def batch_mesh_axes(n: int) -> tuple[str, ...]:
    """Mesh axes of ``act_batch`` (active mesh and rules) whose sizes divide ``n``; () without a mesh."""
    mesh = active_mesh()
    if mesh is None or not core_spmd.get_logical_axis_rules():
        return ()
    entry = fit_spec(logical_to_spec(("act_batch",), shape=(n,), mesh=mesh), (n,), mesh)[0]
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return tuple(a for a in axes if sizes[a] > 1)


def vmap_over_batch(fn: Callable[..., Any], n: int) -> Callable[..., Any]:
    """``jax.vmap(fn)`` for a leading dimension of ``n`` independent rows whose inputs are split
    over the ``act_batch`` mesh axes: the vmapped dimension stays split over them
    (``spmd_axis_name``), also through the ``shard_map``s inside ``fn`` (attention kernels), and
    activation specs traced inside ``fn`` leave those axes to it. Plain ``jax.vmap`` without such axes."""
    axes = batch_mesh_axes(n)
    if not axes:
        return jax.vmap(fn)
    mapped = jax.vmap(fn, spmd_axis_name=axes[0] if len(axes) == 1 else axes)

    def call(*args: Any) -> Any:
        token = _RESERVED.set(_RESERVED.get() + axes)
        try:
            return mapped(*args)
        finally:
            _RESERVED.reset(token)

    return call


def logical_to_spec(logical_axes: Sequence[str | None], rules: LogicalRules | None = None,
                    shape: Sequence[int] | None = None, mesh: Any = None) -> PartitionSpec:
    """Maps logical axis names to a ``PartitionSpec`` with the given (or the active) rules.

    A mesh axis already used by an earlier dimension is dropped (replicated) for later ones,
    so e.g. ``("act_batch", "act_length")`` stays valid when both map to overlapping axes.
    With ``shape`` and ``mesh``, a mesh axis that does not divide its dimension (what
    :func:`fit_spec` drops) is not counted as used, so a later dimension can take it: a batch of
    1 leaves ``data`` free for ``act_width``.
    """
    rules = core_spmd.get_logical_axis_rules() if rules is None else rules
    table = {k: v for k, v in rules}
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes)) if shape is not None and mesh is not None else None
    used: set[str] = set()
    out = []
    for i, name in enumerate(logical_axes):
        mesh_axes = table.get(name) if name is not None else None
        if mesh_axes is None:
            out.append(None)
            continue
        axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
        axes = tuple(a for a in axes if a not in used and a not in _RESERVED.get())
        if sizes is not None:
            kept, prod = [], 1
            for a in axes:
                if shape[i] % (prod * sizes[a]) == 0:
                    kept.append(a)
                    prod *= sizes[a]
            axes = tuple(kept)
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


def active_mesh() -> Any:
    """The abstract mesh of the enclosing ``jax.set_mesh`` / :func:`sharding_context`, or None."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh is None or mesh.empty else mesh


def fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Any) -> PartitionSpec:
    """Drops mesh axes from dimensions they do not divide (e.g. a batch of 1 on 8 devices)."""
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    reserved = _RESERVED.get()
    out = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        if entry is None:
            out.append(None)
            continue
        axes = tuple(a for a in ((entry,) if isinstance(entry, str) else tuple(entry)) if a not in reserved)
        kept, prod = [], 1
        for a in axes:
            if dim % (prod * sizes[a]) == 0:
                kept.append(a)
                prod *= sizes[a]
        out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*out)


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """Sharding constraint on an activation by logical axis names; a no-op without a mesh.

    Args:
      x: any array of rank ``len(logical_axes)``.
      logical_axes: one logical name (or None) per dimension, e.g.
        ``("act_batch", "act_length", "act_embed")`` for [B, L, D].

    Returns:
      ``x`` with ``jax.lax.with_sharding_constraint`` applied when a mesh is active
      (:func:`sharding_context`); mesh axes that do not divide a dimension are dropped.
    """
    if len(logical_axes) != x.ndim:
        raise ValueError(f"constrain: {len(logical_axes)} logical axes {tuple(logical_axes)} for an array of "
                         f"rank {x.ndim}")
    mesh = active_mesh()
    if mesh is None or not core_spmd.get_logical_axis_rules():
        return x
    spec = fit_spec(logical_to_spec(logical_axes, shape=x.shape, mesh=mesh), x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def param_shardings(state: Any, mesh: Mesh, rules: LogicalRules | None = None) -> Any:
    """NamedShardings for every Variable of an NNX state (or module), from its logical names.

    Mesh axes that do not divide a dimension are dropped for that dimension, so tiny configs
    run on any mesh while full-size parameters shard as annotated.
    """
    if isinstance(state, nnx.Module):
        state = nnx.state(state)
    rules = (core_spmd.get_logical_axis_rules() or DEFAULT_RULES) if rules is None else rules

    def to_sharding(x: Any) -> Any:
        if isinstance(x, nnx.Variable):
            with core_spmd.logical_axis_rules(tuple(rules)):
                spec = nnx.spmd.get_var_pspec(x) or PartitionSpec()
            shape = x.get_raw_value().shape
        else:
            spec, shape = PartitionSpec(), np.shape(x)
        return NamedSharding(mesh, fit_spec(spec, shape, mesh))

    return jax.tree.map(to_sharding, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def create_sharded_model(
    model_fn: Callable[[], nnx.Module], mesh: Mesh, rules: LogicalRules = DEFAULT_RULES
) -> nnx.Module:
    """Creates an NNX module with every parameter born sharded (no host-side full copy).

    ``model_fn`` builds the module (e.g. ``lambda: Mistral(cfg, rngs=nnx.Rngs(0))``); it is run
    once abstractly to read the logical annotations, then under ``jax.jit`` with the resolved
    ``out_shardings``, which is how 7B parameters are initialized across an FSDP mesh.
    """
    abstract = nnx.eval_shape(model_fn)
    graphdef, abs_state = nnx.split(abstract)
    shardings = param_shardings(abs_state, mesh, rules)

    init_state = jax.jit(lambda: nnx.state(model_fn()), out_shardings=shardings)
    with sharding_context(mesh, rules):
        state = init_state()
    return nnx.merge(graphdef, state)


def shard_params(model: nnx.Module, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> nnx.Module:
    """Moves an existing module's state onto ``mesh`` by its logical annotations (in place)."""
    state = nnx.state(model)
    shardings = param_shardings(state, mesh, rules)
    nnx.update(model, jax.device_put(state, shardings))
    return model


def batch_sharding(
    mesh: Mesh, ndim: int, rules: LogicalRules = DEFAULT_RULES, batch_axis: str = "act_batch",
    shape: Sequence[int] | None = None,
) -> NamedSharding:
    """NamedSharding that splits dimension 0 of an ``ndim``-rank batch array over the data axes.

    With ``shape``, data axes that do not divide the batch are dropped (e.g. a batch of one on a
    mesh whose data axis splits another dimension)."""
    spec = logical_to_spec((batch_axis,) + (None,) * (ndim - 1), rules)
    if shape is not None:
        spec = fit_spec(spec, shape, mesh)
    return NamedSharding(mesh, spec)


def data_parallel_size(mesh: Mesh, rules: LogicalRules = DEFAULT_RULES, batch_axis: str = "act_batch") -> int:
    """Number of shards the batch dimension is split into on ``mesh``."""
    entry = logical_to_spec((batch_axis,), rules)[0]
    if entry is None:
        return 1
    axes = (entry,) if isinstance(entry, str) else entry
    return math.prod(mesh.shape[a] for a in axes)


def check_global_batch(global_batch: int, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> None:
    """Raises a config error naming both numbers when the batch does not divide the data axes."""
    n = data_parallel_size(mesh, rules)
    if global_batch % n:
        raise ShardingConfigError(
            f"global batch size {global_batch} does not divide the {n} data-parallel shards of mesh "
            f"{dict(mesh.shape)}; use a multiple of {n} (e.g. {max(n, (global_batch // n + 1) * n)}) "
            f"or change config.mesh.shape"
        )


def shard_batch(batch: Any, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> Any:
    """Places a pytree of host arrays (global batch on every process) split over the data axes.

    Raises:
      ShardingConfigError: a leading dimension that does not divide the data-parallel shards.
    """
    def put(x: Any) -> jax.Array:
        x = np.asarray(x)
        if x.ndim == 0:
            return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))
        check_global_batch(x.shape[0], mesh, rules)
        sharding = batch_sharding(mesh, x.ndim, rules)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, batch)
