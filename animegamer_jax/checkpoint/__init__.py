"""One orbax checkpoint directory holding a whole AnimeGamer system.

Why one directory: docs/design.md, "One checkpoint directory for a whole system".

Layout (an orbax composite checkpoint, written atomically by ``ocp.Checkpointer``)::

    DIR/
      _CHECKPOINT_METADATA          orbax bookkeeping
      integrity.json                every other file's size and sha256 (written last by save_system,
                                    checked by load_system; integrity.py)
      config/metadata               the ml_collections config used to build every component (JSON)
      manifest/metadata             {"components": [...], "param_counts": {...}, "format": 1} (JSON)
      mllm/ dit/ vae/ shot_encoder/ clip/ t5/
                                    one orbax PyTree item per component: ``nnx.state(module)``
                                    as a pure nested dict of arrays (every Variable kind: params,
                                    LoRA factors, norms; no RNG state)

Components present are those passed to :func:`save_system`; any subset may be saved or loaded
(e.g. a decoder-only checkpoint after phase a2). Training writes this layout, ``convert release``
writes it with :class:`SystemWriter`, and the game engine and eval read it with
:func:`load_system` on any mesh (arrays are restored straight into the target shardings computed
from the logical annotations, so a checkpoint saved on 8 devices loads on 1 and vice versa).

A component is rebuilt by ``models.registry.COMPONENT_BUILDERS[name](config, rngs)`` (only its
abstract shape is evaluated, with ``nnx.eval_shape``); pass ``builders=`` to override or add kinds.

Modules: ``errors`` (the two error classes), ``integrity`` (integrity.json: write, verify, identity),
``config_json`` (the stored config), ``store`` (save_system, load_system, manifest, shapes),
``writer`` (SystemWriter), ``cast`` (cast_system), ``add`` (add_components), ``train_state`` (one
component out of a training run's checkpoint, read-only). The command is commands/checkpoint.py:
``python -m animegamer_jax.commands.checkpoint {verify [--full] | manifest} DIR``, ``cast SRC DST`` or ``add BASE DST``.
"""

from animegamer_jax.checkpoint.cast import cast_system
from animegamer_jax.checkpoint.config_json import config_from_json, config_to_json
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
