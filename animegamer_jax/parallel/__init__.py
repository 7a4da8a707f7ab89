"""Mesh, logical axis rules and multi-host start (generic: knows no model)."""

from animegamer_jax.parallel.distributed import initialize, is_multiprocess_launch
from animegamer_jax.parallel.mesh import (
    CONTEXT,
    DATA,
    DEFAULT_RULES,
    FSDP,
    MESH_AXES,
    TENSOR,
    ShardingConfigError,
    active_mesh,
    batch_mesh_axes,
    batch_sharding,
    check_global_batch,
    constrain,
    create_sharded_model,
    data_parallel_size,
    fit_spec,
    logical_to_spec,
    make_mesh,
    mesh_from_config,
    param_shardings,
    resolve_mesh_shape,
    rules_from_config,
    shard_batch,
    shard_params,
    sharding_context,
    vmap_over_batch,
)

__all__ = [
    "CONTEXT", "DATA", "DEFAULT_RULES", "FSDP", "MESH_AXES", "TENSOR", "ShardingConfigError", "active_mesh",
    "batch_sharding", "check_global_batch", "constrain", "create_sharded_model",
    "data_parallel_size", "fit_spec", "initialize", "is_multiprocess_launch", "logical_to_spec", "make_mesh",
    "mesh_from_config", "param_shardings", "resolve_mesh_shape", "rules_from_config",
    "shard_batch", "shard_params", "sharding_context", "batch_mesh_axes", "vmap_over_batch",
]
