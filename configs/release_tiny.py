"""The sizes of the tiny AnimeGamer release fixture (``../shared/fixtures/release_tiny``, its README).

Same structure as configs/animegamer_2b_7b.py; only the sizes of the fixture's randomly initialised
copy of the release modules differ. Every component keeps the paper-size code path. Numerics are
float32 everywhere (the fixture was recorded in float32 on CPU) and ``game.mode`` is ``reference``,
so ``check-release`` and ``play`` reproduce the release's inference path.

Use:
  python -m animegamer_jax.commands.convert release ../shared/fixtures/release_tiny/release /tmp/rt \
      --config configs/release_tiny.py
  python -m animegamer_jax.commands.convert check-release /tmp/rt \
      ../shared/fixtures/release_tiny/cases/dev_01_qiqi_railing.npz
Cost: the conversion takes a few seconds and one reference turn about ten seconds on 2 CPU cores.
"""

import ml_collections

from configs import animegamer_2b_7b, tiny


def get_config() -> ml_collections.ConfigDict:
    """Returns the tiny-release configuration (fixture README "Tiny sizes")."""
    c = tiny.toy_sizes(animegamer_2b_7b.get_config())  # rep.dim 64 = DiT hidden size
    c.name = "release_tiny"

    c.rep.update(num_text_tokens=30, num_image_tokens=196)  # 226 tokens as released (hard-coded in the release DiT)
    c.shot_encoder.image_dim = 768  # ip_hidden_size stays 768 (the release branches on != 768)
    # patch 16: vision head width 16, mlp ratio 2; text_mlp_dim 128: open_clip's text mlp_ratio default 4
    c.clip.update(image_size=224, patch_size=16, text_mlp_dim=128, embed_dim=24)
    c.t5.update(vocab_size=256, d_ff=80, num_heads=3)
    c.mllm.update(hidden_size=48, head_dim=12, history_window=1, readout="last")

    c.dit.time_embed_dim = 48

    c.vae.block_out_channels = (64, 32, 32, 32)  # SAT ch 32 x ch_mult (2, 1, 1, 1)
    c.vae.encoder_in_channels = 32  # SAT encoder conv_in width = ch (differs from level 0 here)

    c.diffusion.cfg_schedule = "release"
    c.game.mode = "reference"
    c.game.max_instruction_tokens = 48
    return c
