"""``python -m animegamer_jax.convert mistral SRC DST``: an HF Mistral folder -> orbax.

The key map is :mod:`animegamer_jax.models.mistral.convert` (beside the model); this is its CLI.
"""

from __future__ import annotations

from typing import Any

from absl import flags

from animegamer_jax import cli
from animegamer_jax.models.mistral import convert as mistral_convert

_CLI_DOC = """HF Mistral checkpoint -> orbax (animegamer-jax layout).

SRC: HF model directory (config.json + safetensors / pytorch_model.bin), local or a URL;
DST: output directory (orbax state in DST/params), local or gs://."""


def _define_flags(fv, argv: list[str]) -> None:
    flags.DEFINE_string("param_dtype", "bfloat16", "dtype of the stored parameters (and of compute).", flag_values=fv)
    flags.DEFINE_integer("vocab_size", None, "Only for an already resized checkpoint (default: config.json's).",
                         flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m animegamer_jax.convert mistral SRC_HF_DIR DST [--param_dtype=bfloat16] [--vocab_size=N]``.

    Returns the exit status (2 with a one-line message on a bad command line).
    """
    return cli.run_command("python -m animegamer_jax.convert mistral", argv, _define_flags, _CLI_DOC,
                           ("SRC", "DST"), _convert)


def _convert(f, src: str, dst: str) -> int:
    over: dict[str, Any] = {"param_dtype": f.param_dtype, "dtype": f.param_dtype}
    if f.vocab_size:
        over["vocab_size"] = f.vocab_size
    cfg, _ = mistral_convert.convert_hf_checkpoint(src, dst, **over)
    print(f"wrote {dst}/params: {cfg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
