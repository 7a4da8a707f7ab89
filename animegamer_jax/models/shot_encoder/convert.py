"""Release E_a weights (SAT DiT checkpoint, ``mixins.patch_embed.*``) -> our :class:`ShotEncoder`.

Source names (docs/encoders.md#checkpoint-keys), torch Linear weights (out, in):
``{prefix}text_proj.{0,2}.{weight,bias}``, ``{prefix}ip_proj.{0,2}.{weight,bias}``,
``{prefix}{txt,ip}_mix_layer_norm.{weight,bias}``; ``{prefix}output_mix_layer_norm.*`` is skipped
on purpose (unused on this path). Keys outside ``prefix`` are ignored (the rest of the DiT belongs
to the DiT converter); inside it, anything unused (e.g. ``proj.*`` of the patch embedding) is
ignored only if listed in ``ignore_prefixes``, else the conversion fails loudly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flax import nnx

from animegamer_jax.weights import StateDictReader, fill_state
from animegamer_jax.models.shot_encoder.model import ShotEncoder, ShotEncoderConfig

#: Where E_a lives in the release's SAT checkpoint.
SAT_PREFIX = "model.diffusion_model.mixins.patch_embed."


def convert_shot_encoder(
    state_dict: Mapping[str, Any], cfg: ShotEncoderConfig, prefix: str = SAT_PREFIX,
    ignore_prefixes: Sequence[str] = ("proj.", "output_mix_layer_norm."),
) -> nnx.State:
    """Converts the E_a weights under ``prefix`` to the Param state of ``ShotEncoder(cfg)``.

    Raises:
      ConversionError: missing / unexpected (under ``prefix``) / mis-shaped keys, all listed.
    """
    sd = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    r = StateDictReader(sd, ignore=lambda k: k.startswith(tuple(ignore_prefixes)))
    values = {}
    for branch in ("text_proj", "ip_proj"):
        for idx, ours in (("0", "fc_in"), ("2", "fc_out")):
            w = r.get(f"{branch}.{idx}.weight")
            values[(branch, ours, "kernel")] = None if w is None else w.T
            values[(branch, ours, "bias")] = r.get(f"{branch}.{idx}.bias")
    for ln in ("txt_mix_layer_norm", "ip_mix_layer_norm"):
        values[(ln, "scale")] = r.get(f"{ln}.weight")
        values[(ln, "bias")] = r.get(f"{ln}.bias")
    abstract = nnx.eval_shape(lambda: ShotEncoder(cfg, rngs=nnx.Rngs(0)))
    return fill_state(abstract, values, r, f"shot encoder (prefix {prefix!r})")
