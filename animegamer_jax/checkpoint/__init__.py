"""One orbax directory holding a whole AnimeGamer system, and a training run's checkpoints (docs/checkpoints.md)."""

from animegamer_jax.checkpoint.cast import cast_system
from animegamer_jax.config import config_from_json, config_to_json
from animegamer_jax.checkpoint.errors import CheckpointIntegrityError, SystemCheckpointError
from animegamer_jax.checkpoint.integrity import (FULL_HASH_BELOW, INTEGRITY_FILE, SAMPLE_BLOCK, SAMPLE_BLOCKS,
                                                 checkpoint_identity, integrity_manifest, read_integrity,
                                                 verify_checkpoint, write_integrity)
from animegamer_jax.checkpoint.store import (COMPONENTS, FORMAT_VERSION, Builder, abstract_component,
                                             array_restore_args, check_component, is_complete, load_config,
                                             load_system, pure_dict, read_manifest, save_system, stored_dtypes,
                                             stored_shapes)
from animegamer_jax.checkpoint.writer import SystemWriter
from animegamer_jax.models.registry import COMPONENT_BUILDERS

__all__ = [
    "COMPONENTS", "COMPONENT_BUILDERS", "FORMAT_VERSION", "FULL_HASH_BELOW", "INTEGRITY_FILE", "SAMPLE_BLOCK",
    "SAMPLE_BLOCKS", "Builder", "CheckpointIntegrityError", "SystemCheckpointError", "SystemWriter",
    "abstract_component", "array_restore_args", "cast_system", "check_component", "checkpoint_identity",
    "config_from_json", "config_to_json", "integrity_manifest", "is_complete", "load_config", "load_system",
    "pure_dict", "read_integrity", "read_manifest", "save_system", "stored_dtypes", "stored_shapes",
    "verify_checkpoint", "write_integrity",
]
