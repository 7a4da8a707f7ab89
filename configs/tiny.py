"""Every AnimeGamer component at a size that trains and plays on 2 CPU cores.

Same structure as configs/animegamer_2b_7b.py (which documents every field); only sizes differ.
The tokenizer and vocabulary stay real (Mistral v0.1 sentencepiece + the 284 AnimeGamer tokens),
so token layouts match the paper model except for the number of query tokens (8 + 16 = 24).

Use:
  make demo                      # plays data/games/bunny.txt on the shipped tiny checkpoint
  python -m animegamer_jax.commands.train --config=configs/tiny.py --config.train.phase=a2 --workdir=/tmp/tiny
  python -m animegamer_jax.commands.train --config=configs/tiny.py --config.train.phase=all --workdir=/tmp/tiny_all
      # vae -> a1 -> a2 -> b -> c (train.pipeline / pipeline_steps / pipeline_learning_rates below)
Cost: seconds per step / per turn on this 2-core CPU.
"""

import ml_collections

from configs import animegamer_2b_7b


def toy_sizes(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Sets, in place, the toy sizes this config shares with configs/release_tiny.py (float32, one
    data-parallel mesh axis, 2-layer stacks); each config then sets the sizes where they differ."""
    c.mesh.shape = (-1, 1, 1, 1)  # pure data parallelism over whatever devices exist
    c.rep.dim = 64
    c.shot_encoder.text_dim = 32  # = t5.d_model
    c.clip.update(vision_width=32, vision_layers=3, vision_heads=2, vision_mlp_dim=64,  # penultimate = after block 2
                  text_width=32, text_layers=2, text_heads=2, text_vocab_size=1000, text_context_length=16,
                  dtype="float32")
    c.t5.update(d_model=32, d_kv=16, num_layers=2)
    # float32 weights, no int8: the paper config's int8 is for reading its 13.6 GiB of MLLM weights
    # from HBM; the toy configs keep the release's numerics (the demo and the release check)
    c.mllm.update(intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, dtype="float32",
                  param_dtype="float32", quantize="none")
    c.dit.update(hidden_size=64, num_layers=2, num_heads=2, head_dim=32, dtype="float32", remat="none",
                 sample_height=8, sample_width=12)  # 64 x 96 px / 8
    c.vae.update(layers_per_block=1, dtype="float32")
    c.data.update(height=64, width=96)
    c.train.remat = "none"  # toy sizes: no activation memory to save
    return c


def get_config() -> ml_collections.ConfigDict:
    """Returns the tiny configuration (full structure, toy sizes)."""
    c = toy_sizes(animegamer_2b_7b.get_config())
    c.name = "tiny"

    c.rep.update(num_text_tokens=8, num_image_tokens=16)  # 32 px / patch 8 = 4x4 image tokens
    c.shot_encoder.image_dim = 32  # = clip.vision_width
    c.clip.update(image_size=32, patch_size=8, text_mlp_dim=64, embed_dim=32)
    # spiece_model: a 384-piece BPE of generic phrases and every sample action text (python -m
    # animegamer_jax.commands.data tiny-t5-spiece): each sample action is at most 6 whole-word pieces, so
    # max_length 8 holds it and its EOS
    c.t5.update(vocab_size=1000, d_ff=64, num_heads=2, max_length=8, spiece_model="data/tiny_t5_spiece.model")
    c.mllm.update(hidden_size=64, head_dim=16, sliding_window=0, max_position_embeddings=4096, lora_rank=4,
                  lora_alpha=4.0, history_window=3)

    # The DiT is wider and deeper than toy_sizes' (release_tiny keeps those): a 2-layer, 64-wide DiT
    # plateaus in phase a2 and draws blocky latents even for its training clips; 4 layers of 4 x 32 heads
    # reproduce the footage (python -m animegamer_jax.commands.eval decoder; docs/results.md).
    # s_a enters the DiT unprojected, so rep.dim = dit.hidden_size (1920 at full size).
    c.rep.dim = 128
    c.dit.update(hidden_size=128, num_layers=4, num_heads=4, head_dim=32)
    c.dit.time_embed_dim = 32
    c.dit.in_channels = 16  # = vae.latent_channels
    c.dit.out_channels = 16
    c.dit.lora_rank = 4
    c.dit.reference_lora_rank = 4
    c.dit.reference_lora_alpha = 4.0
    c.dit.text_length = 24  # rep.num_text_tokens + rep.num_image_tokens

    # CogVideoX's 16 latent channels (8x spatial, 4x temporal compression: 64x96 -> 8x12x16 latents),
    # the shape of the shipped checkpoints/tiny_system, whose VAE the "vae" phase trained. The two
    # low-resolution levels are wider than the full-resolution one, which does most of the FLOPs
    # (held-out reconstruction PSNR: python -m animegamer_jax.commands.eval vae; docs/results.md).
    c.vae.latent_channels = 16
    c.preview.channels = (8, 8, 8, 8)  # ~10 k parameters (phase preview)
    c.vae.block_out_channels = (8, 16, 32, 64)
    c.vae.norm_num_groups = 4

    c.diffusion.num_sampling_steps = 8
    # DynamicCFG scale 1 (s = 1 + scale (1 - cos(pi (i/8)^5)) / 2 rises to 1.5 by the 8th step), not the
    # paper's 6 (s up to 4.1 here), which oversaturates the tiny system's samples
    # (python -m animegamer_jax.commands.eval decoder --config.diffusion.cfg_scale=S; docs/results.md).
    c.diffusion.cfg_scale = 1.0
    # phase d distils the teacher on the paper's 50-step grid (the teacher plays 8 steps here for speed);
    # the student learns the scales around the tiny system's 1.0
    c.diffusion.student_grid_steps = 50

    c.data.dataset_dir = "data/prepared/tiny"  # the sample variants, 2 s windows every 1 s (data/README.md)

    c.train.global_batch_size = 2
    c.train.learning_rate = 1e-3
    c.train.warmup_steps = 10
    c.train.num_steps = 200
    # No converted CogVideoX VAE exists at toy size: the pipeline first trains the tiny VAE as an
    # autoencoder on the sample clips (phase "vae"): single frames at 64x96, then 9-frame clips on
    # 32x48 crops, then single frames and 9-frame 64x96 clips interleaved (vae_curriculum below; each
    # shape compiles its step once).
    c.train.pipeline = ("vae", "a1", "a2", "b", "c")
    # the from-scratch recipe of the pipeline's phases, in order (steps, learning rates)
    c.train.pipeline_steps = (4700, 200, 20000, 8000, 500)
    c.train.pipeline_learning_rates = (5e-4, 1e-3, 1e-3, 1e-3, 1e-3)
    # Clip steps alone pull the single-frame path down (held-out frame PSNR, docs/results.md), so the
    # last stage interleaves: every 100 steps, 30 on single frames then 70 on 9-frame 64x96 clips (each
    # shape compiles once; the phase ends on clips).
    c.train.vae_curriculum = ((0, 1, 64, 96), (2500, 9, 32, 48)) + tuple(
        st for s in range(3500, 4700, 100) for st in ((s, 1, 64, 96), (s + 30, 9, 64, 96)))
    c.train.vae_windows_per_clip = 4
    # The VAE trains on the 7 back-to-back 2 s clips of the sample film (data/README.md), stored at
    # 128x192 (tiny_vae_hr) and cut into multi-scale crops: 1x-2x the stage size, resized to it (the
    # 119 frames alone are few enough for the VAE to memorise). The film frames between those clips are
    # its held-out set, scored at 64x96 on the same clips at the model's size (tiny_vae;
    # python -m animegamer_jax.commands.eval vae).
    c.train.vae_dataset_dir = "data/prepared/tiny_vae_hr"
    c.train.vae_eval_dataset_dir = "data/prepared/tiny_vae"
    c.train.vae_max_crop_scale = 2.0
    # No pretrained CogVideoX exists at toy size either: phase a2 trains every DiT parameter (a LoRA on a
    # random DiT draws noise); a1 and c keep the paper's sets.
    c.train.dit_trainable = "all"
    c.train.distill_cfg_scales = (0.0, 2.0)
    c.train.log_every = 10
    c.train.checkpoint_every = 50
    c.train.sample_every = 0
    c.train.max_seq_len = 256  # 3 turns of 1 + text + 28 + 14 tokens at 24 queries

    c.game.checkpoint = "checkpoints/tiny_system"  # the shipped tiny system (save_system layout)

    c.eval.clip_frames = 4  # fewer CLIP calls per turn on CPU

    c.label.dtype = "float32"  # CPU
    c.label.device = "cpu"
    return c
