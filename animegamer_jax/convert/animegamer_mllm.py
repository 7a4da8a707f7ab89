"""``python -m animegamer_jax.convert animegamer-mllm BIN DST``: the release MLLM ``.bin`` -> orbax.

The key map is :mod:`animegamer_jax.models.mistral.mllm_convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

import json

from animegamer_jax import paths
from animegamer_jax.convert.common import cli_parser, load_state_dict, save_state, section_config
from animegamer_jax.models.mistral import mllm_convert as am
from animegamer_jax.models.mistral.mllm import MLLMConfig


def main(argv: list[str] | None = None) -> None:
    """CLI: ``BIN DST [--config F] [--base MISTRAL_DIR] [--merge_lora]``.

    BIN is the release ``MLLM-*/pytorch_model.bin``. If it holds only the trainable subset (no
    base weights), pass ``--base`` with the HF Mistral-7B-Instruct-v0.1 directory: its weights fill
    the frozen base keys (the release's embeddings/lm_head, already resized to 32284, win).
    """
    p = cli_parser("animegamer-mllm", main.__doc__)
    p.add_argument("bin")
    p.add_argument("dst")
    p.add_argument("--base", default=None, help="HF Mistral dir for base weights missing from BIN")
    p.add_argument("--merge_lora", action="store_true")
    p.add_argument("--lora_alpha", type=float, default=None, help="default: config mllm.lora_alpha (release 32)")
    p.add_argument("--param_dtype", default="bfloat16")
    a = p.parse_args(argv)
    cfg = section_config(a, "", lambda c: MLLMConfig.from_config(c, param_dtype=a.param_dtype, dtype=a.param_dtype,
                                                                 lora_rank=0))
    sd = load_state_dict(a.bin)
    print(f"{len(sd)} keys in {a.bin}; first: {sorted(sd)[:5]}")
    if a.base:
        am.add_base_weights(sd, load_state_dict(a.base))
    cfg, state = am.convert_animegamer_mllm(sd, cfg, merge_lora=a.merge_lora, lora_alpha=a.lora_alpha)
    paths.makedirs(a.dst)
    save_state(state, paths.join(a.dst, "params"))
    with paths.as_path(paths.join(a.dst, "mllm_config.json")).open("w") as f:
        json.dump({"lora_rank": cfg.llm.lora_rank, "lora_alpha": cfg.llm.lora_alpha,
                   "lora_targets": list(cfg.llm.lora_targets), "merged": a.merge_lora}, f)
    print(f"wrote {a.dst}/params (lora_rank={cfg.llm.lora_rank}, merged={a.merge_lora})")


if __name__ == "__main__":
    main()
