"""``python -m animegamer_jax.convert mistral SRC DST``: an HF Mistral folder -> orbax.

The key map is :mod:`animegamer_jax.models.mistral.convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

from typing import Any

from animegamer_jax.convert.common import cli_parser
from animegamer_jax.models.mistral import convert as cm


def main(argv: list[str] | None = None) -> None:
    """CLI: ``SRC_HF_DIR DST [--param_dtype bfloat16] [--vocab_size N]``; writes ``DST/params``
    (orbax) and ``DST/mistral_config.json``."""
    p = cli_parser("mistral", "HF Mistral checkpoint -> orbax (animegamer-jax layout)")
    p.add_argument("src", help="HF model directory (config.json + safetensors / pytorch_model.bin)")
    p.add_argument("dst", help="output directory (orbax state in DST/params)")
    p.add_argument("--param_dtype", default="bfloat16")
    p.add_argument("--vocab_size", type=int, default=None, help="only for an already resized checkpoint")
    a = p.parse_args(argv)
    over: dict[str, Any] = {"param_dtype": a.param_dtype, "dtype": a.param_dtype}
    if a.vocab_size:
        over["vocab_size"] = a.vocab_size
    cfg, _ = cm.convert_hf_checkpoint(a.src, a.dst, **over)
    print(f"wrote {a.dst}/params: {cfg}")


if __name__ == "__main__":
    main()
