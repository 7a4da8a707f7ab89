"""``python -m animegamer_jax.convert animegamer-mllm BIN DST``: the release MLLM ``.bin`` -> orbax.

The key map is :mod:`animegamer_jax.models.mistral.mllm_convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from animegamer_jax import cli, fileio, paths
from animegamer_jax.models.mistral import mllm_convert
from animegamer_jax.models.mistral.mllm import MLLMConfig
from animegamer_jax.weights import load_state_dict, save_state

_CLI_DOC = """AnimeGamer MLLM pytorch_model.bin -> orbax.

BIN is the release ``MLLM-*/pytorch_model.bin``. If it holds only the trainable subset (no base
weights), pass ``--base`` with the HF Mistral-7B-Instruct-v0.1 directory: its weights fill the
frozen base keys (the release's embeddings/lm_head, already resized to 32284, win). The sizes come
from ``--config`` (default configs/animegamer_2b_7b.py); ``--config.mllm.x=v`` overrides a field."""


def _define_flags(fv, argv: list[str]) -> None:
    config_flags.DEFINE_config_file("config", paths.resource("configs/animegamer_2b_7b.py"),
                                    "Config whose `mllm` section has the sizes; --config.a.b=v overrides a field.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("base", None, "HF Mistral dir for base weights missing from BIN.", flag_values=fv)
    flags.DEFINE_bool("merge_lora", False, "Fold the LoRA into the base weights (--nomerge_lora: keep it "
                      "separate, the default).", flag_values=fv)
    flags.DEFINE_float("lora_alpha", None, "Default: config mllm.lora_alpha (release 32).", flag_values=fv)
    flags.DEFINE_string("param_dtype", "bfloat16", "dtype of the stored parameters.", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m animegamer_jax.convert animegamer-mllm BIN DST [--config=F] [--merge_lora]``.

    Returns the exit status (2 with a one-line message on a bad command line).
    """
    return cli.run_command("python -m animegamer_jax.convert animegamer-mllm", argv, _define_flags, _CLI_DOC,
                           ("BIN", "DST"), _convert)


def _convert(f, bin_path: str, dst: str) -> int:
    cfg = MLLMConfig.from_config(f.config, param_dtype=f.param_dtype, dtype=f.param_dtype, lora_rank=0)
    sd = load_state_dict(bin_path)
    print(f"{len(sd)} keys in {bin_path}; first: {sorted(sd)[:5]}")
    if f.base:
        mllm_convert.add_base_weights(sd, load_state_dict(f.base))
    cfg, state = mllm_convert.convert_animegamer_mllm(sd, cfg, merge_lora=f.merge_lora, lora_alpha=f.lora_alpha)
    fileio.makedirs(dst)
    save_state(state, paths.join(dst, "params"))
    with paths.as_path(paths.join(dst, "mllm_config.json")).open("w") as fh:
        json.dump({"lora_rank": cfg.llm.lora_rank, "lora_alpha": cfg.llm.lora_alpha,
                   "lora_targets": list(cfg.llm.lora_targets), "merged": f.merge_lora}, fh)
    print(f"wrote {dst}/params (lora_rank={cfg.llm.lora_rank}, merged={f.merge_lora})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
