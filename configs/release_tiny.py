"""The sizes of the tiny AnimeGamer release fixture (``../shared/fixtures/release_tiny``, its README).

Same structure as configs/animegamer_2b_7b.py; only the sizes of the fixture's randomly initialised
copy of the release modules differ. Every component keeps the paper-size code path. Numerics are
float32 everywhere (the fixture was recorded in float32 on CPU) and ``game.mode`` is ``reference``,
so ``check-release`` and ``play`` reproduce the release's inference path.

Use:
  python -m animegamer_jax.convert release ../shared/fixtures/release_tiny/release /tmp/rt \
      --config configs/release_tiny.py
  python -m animegamer_jax.convert check-release /tmp/rt \
      ../shared/fixtures/release_tiny/cases/dev_01_qiqi_railing.npz
Cost: the conversion takes a few seconds and one reference turn about ten seconds on 2 CPU cores.
"""

import ml_collections

from configs import animegamer_2b_7b


def get_config() -> ml_collections.ConfigDict:
    """Returns the tiny-release configuration (fixture README "Tiny sizes")."""
    c = animegamer_2b_7b.get_config()
    c.name = "release_tiny"
    c.mesh.shape = (-1, 1, 1, 1)

    c.rep.dim = 64  # = DiT hidden size
    c.rep.num_text_tokens = 30  # 226 tokens as released (hard-coded in the release DiT)
    c.rep.num_image_tokens = 196

    c.shot_encoder.text_dim = 32  # DiT text_hidden_size = T5 d_model
    c.shot_encoder.image_dim = 768  # ip_hidden_size stays 768 (the release branches on != 768)

    c.clip.image_size = 224
    c.clip.patch_size = 16
    c.clip.vision_width = 32
    c.clip.vision_layers = 3
    c.clip.vision_heads = 2  # head width 16
    c.clip.vision_mlp_dim = 64  # mlp ratio 2
    c.clip.text_width = 32
    c.clip.text_layers = 2
    c.clip.text_heads = 2
    c.clip.text_mlp_dim = 128  # open_clip text mlp_ratio default 4
    c.clip.text_vocab_size = 1000
    c.clip.text_context_length = 16
    c.clip.embed_dim = 24
    c.clip.dtype = "float32"

    c.t5.vocab_size = 256
    c.t5.d_model = 32
    c.t5.d_kv = 16
    c.t5.d_ff = 80
    c.t5.num_layers = 2
    c.t5.num_heads = 3

    c.mllm.hidden_size = 48
    c.mllm.intermediate_size = 128
    c.mllm.num_layers = 2
    c.mllm.num_heads = 4
    c.mllm.num_kv_heads = 2
    c.mllm.head_dim = 12
    c.mllm.dtype = "float32"
    c.mllm.param_dtype = "float32"
    c.mllm.history_window = 1
    c.mllm.readout = "last"

    c.dit.hidden_size = 64
    c.dit.num_layers = 2
    c.dit.num_heads = 2
    c.dit.head_dim = 32
    c.dit.time_embed_dim = 48
    c.dit.sample_height = 8  # 64 px / 8
    c.dit.sample_width = 12  # 96 px / 8
    c.dit.dtype = "float32"
    c.dit.remat = "none"

    c.vae.block_out_channels = (64, 32, 32, 32)  # SAT ch 32 x ch_mult (2, 1, 1, 1)
    c.vae.encoder_in_channels = 32  # SAT encoder conv_in width = ch (differs from level 0 here)
    c.vae.layers_per_block = 1
    c.vae.dtype = "float32"

    c.diffusion.cfg_schedule = "release"

    c.data.height = 64
    c.data.width = 96

    c.game.mode = "reference"
    c.game.max_instruction_tokens = 48
    c.train.remat = "none"  # toy sizes: no activation memory to save
    return c
