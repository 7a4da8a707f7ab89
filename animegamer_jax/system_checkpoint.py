"""Deprecated alias of animegamer_jax.checkpoint (removed next release).

``python -m animegamer_jax.system_checkpoint ...`` runs ``python -m animegamer_jax.checkpoint ...``.
"""

from animegamer_jax import parallel  # noqa: F401  (``system_checkpoint.parallel.make_mesh`` callers)
from animegamer_jax.checkpoint import *  # noqa: F401,F403
from animegamer_jax.checkpoint import (COMPONENT_BUILDERS, COMPONENTS, FORMAT_VERSION, FULL_HASH_BELOW,  # noqa: F401
                                       INTEGRITY_FILE, SAMPLE_BLOCK, SAMPLE_BLOCKS, Builder,
                                       CheckpointIntegrityError, SystemCheckpointError, SystemWriter,
                                       abstract_component, cast_system, check_component, checkpoint_identity,
                                       config_from_json, config_to_json, integrity_manifest, is_complete,
                                       load_config, load_system, read_manifest, save_system, stored_shapes,
                                       verify_checkpoint, write_integrity)
from animegamer_jax.checkpoint.__main__ import cli, main  # noqa: F401
from animegamer_jax.checkpoint.integrity import _VERIFIED  # noqa: F401
from animegamer_jax.checkpoint.store import pure_dict as _pure  # noqa: F401
from animegamer_jax.checkpoint.store import stored_dtypes as _stored_dtypes  # noqa: F401

if __name__ == "__main__":
    cli()
