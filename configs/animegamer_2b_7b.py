"""AnimeGamer at paper size: CogVideoX-2B DiT + 3D VAE, Mistral-7B-Instruct-v0.1, ViT-B/16, T5-v1.1-XXL.

Numbers follow the paper (arXiv 2504.01014) and the released TencentARC/AnimeGamer inference code, as
written up in docs/ (docs/README.md); comments name the doc and heading of each fact.

Use:
  python -m animegamer_jax.commands.train --config=configs/animegamer_2b_7b.py --config.train.phase=b \
      --workdir=/ckpt/run1
  python -m animegamer_jax.commands.play --config=configs/animegamer_2b_7b.py --checkpoint=/ckpt/system \
      data/games/bunny.txt
Cost: one game turn is ~3 PFLOP of DiT work (50 steps x 2 CFG halves x 6976 tokens); the paper
reports 24 s/turn (hardware not stated). Training phase (b) needs an FSDP mesh of >= 8 x 80 GB.
Full-size shapes, shardings and compiled memory are checked on fake CPU devices by the tests and
``python -m animegamer_jax.commands.aot``; nothing here downloads weights (convert them with
``python -m animegamer_jax.commands.convert``).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    """Returns the paper-size configuration."""
    c = ml_collections.ConfigDict()
    c.name = "animegamer_2b_7b"  # run name, used in output folders and logs
    c.seed = 0  # global PRNG seed (init, data order, sampling noise)

    # ---- device mesh and logical sharding rules (animegamer_jax/parallel) ----
    c.mesh = ml_collections.ConfigDict()
    c.mesh.axes = ("data", "fsdp", "tensor", "context")  # physical mesh axis names
    c.mesh.shape = (1, -1, 1, 1)  # sizes per axis; -1 = the remaining devices (FSDP by default)
    # logical axis -> mesh axis (or tuple of axes, or None = replicated); see parallel/mesh.py
    c.sharding_rules = (
        ("embed", "fsdp"),
        ("mlp", "tensor"),
        ("heads", "tensor"),
        ("kv_heads", "tensor"),
        ("head_dim", None),
        ("vocab", "tensor"),
        ("layers", None),
        ("lora", None),
        ("conv_in", None),
        ("conv_out", "tensor"),
        ("norm", None),
        ("act_batch", ("data", "fsdp")),
        ("act_length", "context"),
        ("act_embed", None),
        ("act_heads", "tensor"),
        ("act_kv_heads", "tensor"),
        ("act_mlp", "tensor"),
        ("act_vocab", "tensor"),
        ("act_frames", None),
        ("act_height", None),
        ("act_width", None),
        ("act_channels", None),
    )

    # ---- action-aware representation s_a (docs/encoders.md) ----
    c.rep = ml_collections.ConfigDict()
    c.rep.dim = 1920  # width of s_a (= DiT hidden size)
    c.rep.num_text_tokens = 30  # T5 tokens of the action text (docs/encoders.md#t5-action-text, max_length 30)
    c.rep.num_image_tokens = 196  # CLIP ViT-B/16 patch tokens of the first frame (14x14)
    # total query/representation tokens = 30 + 196 = 226 (text first)

    # ---- shot encoder E_a (docs/encoders.md#shot-encoder-projection) ----
    c.shot_encoder = ml_collections.ConfigDict()
    c.shot_encoder.text_dim = 4096  # T5-v1.1-XXL width (f_md)
    c.shot_encoder.image_dim = 768  # CLIP ViT-B/16 width (f_v)
    c.shot_encoder.layer_norm_eps = 1e-5  # txt/ip_mix_layer_norm eps (nn.LayerNorm default)
    c.shot_encoder.dtype = "float32"  # E_a compute dtype (226 tokens: cheap; keeps MLLM regression targets exact)

    # ---- CLIP ViT-B/16 (OpenCLIP laion2b_s34b_b88k), frozen (docs/encoders.md#clip-image-tower) ----
    c.clip = ml_collections.ConfigDict()
    c.clip.image_size = 224  # input resolution after the no-crop bicubic resize
    c.clip.patch_size = 16  # ViT patch size
    c.clip.vision_width = 768  # vision tower width
    c.clip.vision_layers = 12  # vision blocks (features read after block 11 = penultimate)
    c.clip.vision_heads = 12  # vision attention heads
    c.clip.vision_mlp_dim = 3072  # vision MLP inner width
    c.clip.text_width = 512  # text tower width (for CLIP-T metrics)
    c.clip.text_layers = 12  # text blocks
    c.clip.text_heads = 8  # text attention heads
    c.clip.text_mlp_dim = 2048  # text MLP inner width
    c.clip.text_vocab_size = 49408  # CLIP BPE vocabulary
    c.clip.text_context_length = 77  # CLIP text length
    c.clip.embed_dim = 512  # joint image/text embedding width
    c.clip.hidden_act = "gelu"  # OpenCLIP laion2b uses exact GELU; OpenAI CLIP uses quick_gelu
    c.clip.layer_norm_eps = 1e-5  # LayerNorm eps
    c.clip.dtype = "bfloat16"  # compute dtype (release runs fp16)
    c.clip.remat = "none"  # remat policy of both towers' block scans (models/remat.py)
    # models/attention.py kernel: "auto" (cuDNN on GPU, Pallas splash on TPU, dense/blockwise by size elsewhere),
    # "reference", "dense", "xla", "blockwise", "cudnn", "splash"
    c.clip.attention_impl = "auto"

    # ---- T5-v1.1-XXL encoder, frozen (docs/encoders.md#t5-action-text) ----
    c.t5 = ml_collections.ConfigDict()
    c.t5.vocab_size = 32128  # T5 sentencepiece vocabulary (+ extra ids)
    c.t5.d_model = 4096  # width
    c.t5.d_kv = 64  # per-head width
    c.t5.d_ff = 10240  # gated-GELU inner width
    c.t5.num_layers = 24  # encoder blocks
    c.t5.num_heads = 64  # attention heads
    c.t5.relative_attention_num_buckets = 32  # relative position buckets
    c.t5.relative_attention_max_distance = 128  # relative position max distance
    c.t5.layer_norm_eps = 1e-6  # T5 RMS norm eps
    c.t5.max_length = 30  # tokens per action text (padded/truncated; docs/encoders.md#t5-action-text is_plan_3)
    c.t5.dtype = "float32"  # fp32: bf16 without a mask blows up the residual stream
    c.t5.remat = "none"  # remat policy of the block scan (models/remat.py)
    c.t5.attention_impl = "auto"  # models/attention.py kernel (see c.clip.attention_impl)
    c.t5.spiece_model = ""  # path to the user's T5 spiece.model (shipped with the T5 weights)

    # ---- MLLM: Mistral-7B-Instruct-v0.1 + LoRA + resamplers (docs/mllm.md) ----
    c.mllm = ml_collections.ConfigDict()
    # 32000 sentencepiece + 284 AnimeGamer tokens (docs/token_layout.md#tokenizer-and-special-tokens)
    c.mllm.vocab_size = 32284
    c.mllm.hidden_size = 4096  # model width
    c.mllm.intermediate_size = 14336  # SwiGLU inner width
    c.mllm.num_layers = 32  # decoder layers (scanned)
    c.mllm.num_heads = 32  # query heads
    c.mllm.num_kv_heads = 8  # key/value heads (GQA x4)
    c.mllm.head_dim = 128  # per-head width
    c.mllm.rope_theta = 10000.0  # RoPE base (v0.1)
    c.mllm.rms_norm_eps = 1e-5  # RMSNorm eps
    c.mllm.sliding_window = 4096  # Mistral sliding-window attention span (0 = none)
    c.mllm.max_position_embeddings = 32768  # RoPE table limit
    c.mllm.dtype = "bfloat16"  # activation dtype (release: bf16)
    c.mllm.param_dtype = "bfloat16"  # weight dtype at inference; training keeps fp32 masters
    c.mllm.lora_rank = 32  # LoRA rank r (docs/mllm.md#lora)
    c.mllm.lora_alpha = 32.0  # LoRA alpha (scaling alpha/r = 1)
    c.mllm.lora_dropout = 0.05  # LoRA dropout during training
    c.mllm.lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # LoRA modules
    c.mllm.history_window = 3  # W: turns the MLLM sees, current included (release: 1)
    c.mllm.history_attention = "window_recompute"  # or "turn_window": KV cache kept across turns (docs/token_layout.md)
    c.mllm.readout = "query"  # "query" = hidden states at the 226 query positions; "last" = release's [-226:]
    c.mllm.lm_loss_scale = 1.0  # CE weight (docs/mllm.md#losses)
    c.mllm.rec_loss_scale = 1.0  # MSE weight alpha (docs/mllm.md#losses)
    c.mllm.cos_loss_scale = 0.0  # cosine loss weight (ablation "w/ L_cos": 0.5 with rec 0.5)
    # state tokens after <ML>: <S_a></ML><SC><S_b>...<S_d></ST> (docs/token_layout.md#state-fields)
    c.mllm.max_new_tokens = 11
    # remat policy of the decoder-layer scan: none | full | save_dots | offload_dots (models/remat.py)
    c.mllm.remat = "none"
    c.mllm.attention_impl = "auto"  # models/attention.py kernel (see c.clip.attention_impl)
    # Mistral prefill/decode_step: "scan", "unstacked" (per-layer weights, XLA:CPU), "auto" (unstacked on CPU)
    c.mllm.decode_layers = "auto"
    # weight-only quantization of the Mistral linear weights at load: "none" (bf16) | "int8" (per-channel
    # scales; models/mistral/mllm.py quantize_weights). int8 by default at paper size: the MLLM's turn is
    # bound by reading its weights, and on one v6e chip (32 GiB) the bf16 weights leave no room for the
    # untiled VAE decode (docs/mllm.md "Weight-only int8"). game.mode=reference (the release, check-release)
    # forces "none"; --config.mllm.quantize=none plays bf16 weights.
    c.mllm.quantize = "int8"

    # ---- decoder D_a: CogVideoX-2B DiT (docs/dit.md) ----
    c.dit = ml_collections.ConfigDict()
    c.dit.hidden_size = 1920  # width (30 heads x 64)
    c.dit.num_layers = 30  # transformer blocks (scanned)
    c.dit.num_heads = 30  # attention heads
    c.dit.head_dim = 64  # per-head width
    c.dit.mlp_ratio = 4.0  # MLP inner = 7680, GELU(tanh)
    c.dit.time_embed_dim = 512  # timestep/flow embedding width
    c.dit.in_channels = 16  # latent channels in
    c.dit.out_channels = 16  # latent channels out (v-prediction)
    c.dit.patch_size = 2  # spatial patch (none in time)
    c.dit.sample_height = 60  # latent height (480 / 8)
    c.dit.sample_width = 90  # latent width (720 / 8)
    c.dit.num_latent_frames = 5  # latent frames (17 video frames)
    c.dit.spatial_interpolation_scale = 1.875  # 3-D sin-cos position scale (h, w)
    c.dit.temporal_interpolation_scale = 1.0  # 3-D sin-cos position scale (t)
    c.dit.norm_eps = 1e-5  # block / final_layernorm eps (SAT default)
    c.dit.qk_norm_eps = 1e-6  # q/k LayerNorm eps
    c.dit.final_norm_eps = 1e-6  # final-layer norm_final eps (SAT 1e-6; diffusers uses 1e-5)
    c.dit.text_length = 226  # conditioning tokens = rep.num_text_tokens + rep.num_image_tokens
    c.dit.use_flow = True  # flow embedding added to the timestep embedding (docs/dit.md#timestep-and-flow-embedding)
    c.dit.lora_rank = 64  # LoRA rank on attention (docs/dit.md#lora)
    c.dit.lora_alpha = 1.0  # SAT lora2 default alpha -> scaling 1/64 (docs/dit.md#lora, UNCERTAIN upstream)
    # reference adapter (training phase r, docs/dit.md#reference-conditioning): its own LoRA on the attention,
    # applied only when a reference image is given; scaling alpha / r
    c.dit.reference_lora_rank = 64
    c.dit.reference_lora_alpha = 64.0
    # True: a DiT call with a reference sees s_a's text tokens and E_a's unconditional image tokens (the
    # clip's / MLLM's image tokens are replaced), in phase r and at play, so the look comes from the
    # reference alone (docs/dit.md#reference-conditioning); False: s_a as it is
    c.dit.reference_drops_image = False
    c.dit.dtype = "bfloat16"  # activations (release fp16); norms/softmax in fp32
    c.dit.param_dtype = "float32"  # master weights
    c.dit.remat = "full"  # remat policy of the block scan: none | full | save_dots | offload_dots (models/remat.py)
    c.dit.attention_impl = "auto"  # models/attention.py kernel (see c.clip.attention_impl); L = 6976 at full size
    # motion level (1..5) -> flow value fed to flow_embed (docs/dit.md#motion-level-to-flow, inference_Decoder.py table)
    c.dit.flow_table = (0.5, 2.5, 10.0, 15.0, 40.0)

    # ---- 3D causal VAE (docs/vae.md) ----
    c.vae = ml_collections.ConfigDict()
    c.vae.in_channels = 3  # RGB
    c.vae.latent_channels = 16  # latent channels
    c.vae.block_out_channels = (128, 256, 256, 512)  # channels per level
    c.vae.layers_per_block = 3  # encoder resnets per level (decoder: +1)
    c.vae.norm_num_groups = 32  # GroupNorm groups
    c.vae.norm_eps = 1e-6  # GroupNorm eps
    c.vae.temporal_compression_ratio = 4  # 17 frames -> 5 latents
    c.vae.scaling_factor = 1.15258426  # latent scale (docs/diffusion.md#latent-scale)
    c.vae.decode_chunks = (3, 2)  # (first, step) latent frames per decode chunk (release plan [0:3], [3:5])
    # (first, step) frames per encode chunk; (0, 0) = whole clip (SAT training), (8, 8) ~ diffusers
    c.vae.encode_chunks = (0, 0)
    # spatial tile (latent px) for tiled decode; 0 = untiled; -1 = auto from device memory
    # (models/cogvideox/vae_tiling.py pick_decode_tiling)
    c.vae.tile_size = -1
    # auto tiling budget per device (bytes / 2**30); 0 = from jax memory_stats (a fixed fallback on CPU)
    c.vae.decode_memory_gib = 0.0
    c.vae.tile_overlap = 0.25  # tile overlap fraction when tiling
    c.vae.encoder_in_channels = 0  # encoder conv_in width (SAT ch); 0 = block_out_channels[0] (= ch at paper size)
    c.vae.dtype = "bfloat16"  # activations (release fp16)
    # 3x3x3 causal convs: "as_2d" (time taps unfolded into one 2-D conv; fast on XLA:CPU, the release
    # numerics as tested) or "3d" (native 3-D convs + SpatialNorm convs at latent resolution; same values up
    # to summation order; 12 % MORE bytes on v6e, docs/results.md#dit-and-vae-decode-bytes)
    c.vae.conv_impl = "as_2d"

    # ---- diffusion (docs/diffusion.md) ----
    c.diffusion = ml_collections.ConfigDict()
    c.diffusion.num_train_timesteps = 1000  # DDPM steps
    c.diffusion.beta_start = 0.00085  # scaled_linear start
    c.diffusion.beta_end = 0.012  # scaled_linear end
    c.diffusion.snr_shift_scale = 3.0  # SNR shift s: abar / (s + (1 - s) abar)
    c.diffusion.num_sampling_steps = 50  # DPM++ 2M steps (sampler "student": 1, 2, 4 or 8)
    # "dpmpp_2m" (release) or "ddim": the DiT with CFG; "student": the distilled few-step student
    # (training phase d; docs/training.md#phase-d-distillation), one call per step, no CFG batch
    c.diffusion.sampler = "dpmpp_2m"
    # the teacher's grid of phase d (its 50 play timesteps); the student samples N of its points
    c.diffusion.student_grid_steps = 50
    c.diffusion.cfg_scale = 6.0  # DynamicCFG max scale
    c.diffusion.cfg_exp = 5.0  # DynamicCFG exponent
    c.diffusion.cfg_schedule = "intended"  # "intended" (loop index) or "release" (docs/diffusion.md#guidance)
    c.diffusion.text_dropout = 0.05  # training CFG dropout of the text branch (batch text set to '')
    # independent per-sample T5 zeroing (conditioner ucg_rate, docs/diffusion.md#training-loss)
    c.diffusion.text_ucg_rate = 0.1
    c.diffusion.image_dropout = 0.05  # training CFG dropout of the image branch

    # ---- data pipeline (docs/data.md) ----
    c.data = ml_collections.ConfigDict()
    c.data.height = 480  # clip height (px)
    c.data.width = 720  # clip width (px)
    c.data.num_frames = 17  # frames per clip (4k+1 for the causal VAE)
    c.data.fps = 8.0  # frames sampled per second (17 frames ~ 2.1 s)
    c.data.clip_seconds = 2.0  # fixed segment length after scene cuts
    c.data.clip_stride_seconds = 0.0  # a segment starts every this many s (0 = clip_seconds: back to back)
    c.data.scene_threshold = 27.0  # PySceneDetect ContentDetector threshold
    c.data.flow_threshold = 0.2  # r: relative background filter (pixels < r * max |flow| dropped; data/motion.py)
    # Scope edges between levels 1|2|3|4|5, in px per sampled frame at 480p (DIS flow): geometric
    # midpoints of the release's per-level flow values 0.5, 2.5, 10, 15, 40 (see data/motion.py).
    c.data.motion_bins = (1.118, 5.0, 12.247, 24.495)
    c.data.max_turns = 5  # multi-turn examples have 1..max_turns consecutive clips
    c.data.dataset_dir = "data/prepared/animegamer_samples"  # prepared tfds dataset (data_dir of data.prepare)
    c.data.features_dir = ""  # precomputed f_v / f_md (data.extract_features), read when train.precomputed_features
    c.data.split = "train"  # the split training reads ("heldout": the films of heldout_films)
    c.data.heldout_films = ()  # film ids data.prepare puts in the "heldout" split instead of "train"
    c.data.num_workers = 0  # grain worker processes (0 = in-process)
    c.data.shuffle_seed = 0  # grain index-sampler seed (shuffle order, multi-turn lengths)

    # ---- training (docs/training.md#phases, Appendix C.1) ----
    c.train = ml_collections.ConfigDict()
    c.train.phase = "a2"  # "a1" warm-up, "a2" joint, "b" MLLM, "c" decoder adaptation, "d" few-step student, "vae", or "all"
    c.train.pipeline = ("a1", "a2", "b", "c")  # phases run by --config.train.phase=all, in order
    c.train.pipeline_steps = ()  # optimizer steps per pipeline phase (empty: num_steps / the paper's)
    c.train.pipeline_learning_rates = ()  # peak LR per pipeline phase (empty: learning_rate / the paper's)
    # "vae" phase (not in the paper, which uses the released VAE): L1 + w_mse MSE + w_kl KL (per-sample
    # sums, the CogVideoX / LDM weight 1e-6), on random windows of the clips sized by the curriculum
    # ((from_step, frames, height, width), ...); frames 1, 9 or 17; up to vae_windows_per_clip each.
    # 256 x 256 crops throughout: the VAE trains without remat, and 17 x 480 x 720 clips do not fit a
    # chip (per-chip memory of each stage: docs/results.md#will-it-fit-the-paper-config)
    c.train.vae_kl_weight = 1e-6
    c.train.vae_mse_weight = 1.0
    c.train.vae_curriculum = ((0, 1, 256, 256), (2000, 9, 256, 256), (6000, 17, 256, 256))
    c.train.vae_windows_per_clip = 4
    # > 1: multi-scale crops, s x the stage size (s uniform in [1, this]) resized to it (data/batches.py vae_windows)
    c.train.vae_max_crop_scale = 1.0
    c.train.vae_fit_scaling_factor = True  # after "vae": vae.scaling_factor = 1 / latent std (saved with it)
    c.train.vae_dataset_dir = ""  # "vae" phase dataset ("" = data.dataset_dir); `eval vae` holds out its gaps
    # `eval vae`'s default dataset ("" = vae_dataset_dir): the same clip segments at the model's size when
    # the VAE trains on a larger copy of them (multi-scale crops)
    c.train.vae_eval_dataset_dir = ""
    c.train.global_batch_size = 16  # examples per optimizer step across all devices
    c.train.grad_accum_steps = 1  # micro-batches per optimizer step (optax.MultiSteps)
    c.train.learning_rate = 0.0  # peak LR; 0 = the paper's per phase (a1/a2 2e-4, b/c 5e-5)
    c.train.warmup_steps = 500  # linear warm-up (optimizer steps)
    c.train.num_steps = 0  # optimizer steps; 0 = the paper's per phase (a1 10k, a2 80k, b 15k, c 10k)
    c.train.end_lr_factor = 0.0  # cosine decays to peak * this
    c.train.adam_b1 = 0.9  # AdamW beta1
    c.train.adam_b2 = 0.999  # AdamW beta2
    c.train.adam_eps = 1e-8  # AdamW epsilon
    c.train.weight_decay = 0.0  # AdamW decay
    c.train.grad_clip = 1.0  # global-norm clip (0 = off)
    c.train.log_every = 50  # steps between TensorBoard summaries
    c.train.checkpoint_every = 1000  # steps between checkpoints
    c.train.keep_checkpoints = 3  # checkpoints kept
    c.train.async_checkpoint = True  # orbax async saves (training continues while writing)
    c.train.sample_every = 5000  # steps between sample videos (0 = never)
    c.train.init_checkpoint = ""  # system checkpoint dir (converted weights or an earlier phase) to start from
    c.train.system_checkpoint = ""  # where to write the system checkpoint at the end ("" = WORKDIR/system)
    c.train.peak_tflops_per_device = 0.0  # for the MFU estimate; 0 = from the device kind (unknown: no MFU)
    # phase a2's DiT set: "paper" (LoRA + flow_embed + block adaLN) or "all" (toy DiT from scratch)
    c.train.dit_trainable = "paper"
    # phase d (few-step student): "full" (every student parameter) or "lora" (LoRA + flow/guidance
    # embeddings + block adaLN); the DynamicCFG scales w drawn per sample (the student's guidance input)
    c.train.distill_trainable = "full"
    c.train.distill_cfg_scales = (3.0, 8.0)
    c.train.encode_latents = True  # decoder phases VAE-encode frames in the step (False: batches carry latents)
    # training: remat policy of every MLLM / DiT block scan (overrides mllm.remat / dit.remat unless "none")
    c.train.remat = "full"
    # overlap the step's FSDP all-gathers / reduce-scatters with compute (XLA scheduler options of the
    # mesh's platform, parallel/xla_flags.py; docs/sharding.md#overlap); the compile tool compiles the same
    c.train.overlap_collectives = True
    c.train.precomputed_features = False  # batches carry T5/CLIP features (f_md, f_v); T5/CLIP stay out of the step
    c.train.max_seq_len = 1024  # MLLM training sequence length (W=3 turns of 1 + text + 230 + 14, + 12)
    c.train.progress = True  # tqdm progress bar with ETA on process 0
    c.train.allow_resume_mismatch = False  # resume a workdir whose checkpoint has another phase/batch/schedule
    c.train.resume_step = -1  # checkpoint step to resume from (-1 = the newest intact one; docs/training.md)

    # ---- game generation (docs/overview.md#one-turn, docs/token_layout.md) ----
    # --- Preview decoder (not in the paper: a small conv decoder distilled from the VAE decoder,
    # training phase "preview", models/cogvideox/preview.py; played with game.decoder) ---
    c.preview = ml_collections.ConfigDict()
    c.preview.channels = (256, 128, 64, 32)  # widths at latent size, then after each 2x upsampling
    # phase r's dropout of the clip's image features f_v (its share of samples conditioned on E_a's
    # unconditional image tokens); -1: diffusion.image_dropout, as phases a1 / a2
    c.train.reference_image_dropout = -1.0
    c.train.preview_real_weight = 0.0  # phase preview: weight of the MSE against the real frames too

    c.game = ml_collections.ConfigDict()
    c.game.mode = "default"  # "default" or "reference" (window 1, last-226 read-out, release CFG)
    # clip decoder: "full" (the VAE), "preview" (the preview decoder's frames are the clip), or
    # "preview_then_full" (preview frames shown first, then replaced by the VAE's; files as "full")
    c.game.decoder = "full"
    c.game.reference_max_new_tokens = 200  # reference mode: free greedy pass-A budget (release max_new_tokens)
    c.game.seed = 0  # game seed when a script gives none (turn k samples with inference/clip_sampler.py turn_key(seed, k))
    c.game.fps = 8  # output video fps
    c.game.write_gif = True  # also write a GIF per turn
    c.game.meter_start = 50  # character meters start value (app.py)
    c.game.meter_step = 5  # meter change per unit of state change
    c.game.max_instruction_tokens = 48  # per-turn instruction budget; sequences are padded to it (one compile)
    c.game.play_layout = "latency"  # play: one game on all devices (inference/layout.py apply_layout); "batch" = config.mesh
    # latency layout's weights: "sharded" over every device (least memory) or "replicated" on each (no
    # per-layer all-gathers: the DiT's 50 x 30 layer passes read local weights; needs the whole system
    # in one chip's HBM, e.g. v6e / H100, not v5e). docs/results.md compares the two.
    c.game.latency_weights = "sharded"
    c.game.checkpoint = ""  # system checkpoint directory (animegamer_jax/checkpoint layout) to play
    c.game.contact_sheet_columns = 6  # frames per turn on the contact sheet
    # (where game folders go is the commands' --out, default outputs/games: a run argument, not a config field)

    # ---- evaluation: Table 1 metrics and the benchmark runner (docs/evaluation.md; animegamer_jax/eval) ----
    c.eval = ml_collections.ConfigDict()
    c.eval.benchmark = "data/benchmark/benchmark.json"  # benchmark file (eval/table1_games.py format)
    c.eval.clip = ""  # local HF CLIPModel folder for CLIP-I/T/T^E; "" = labelled random stand-in
    c.eval.dreamsim = ""  # local DreamSim embedder folder; "" = DreamSim not computed
    c.eval.clip_frames = 8  # frames per turn scored by CLIP (evenly spaced; <= 0 = all 17)
    c.eval.write_games = True  # also write every generated game (MP4/GIF, game.json, gallery)
    # (the report folder is eval's --out, default outputs/eval)

    # ---- automatic clip labelling (paper §3.3, docs/data.md#labels; `python -m animegamer_jax.commands.data caption`) ----
    c.label = ml_collections.ConfigDict()
    c.label.num_frames = 4  # uniformly sampled frames of each clip shown to the captioner (paper: 4)
    c.label.max_references = 2  # reference images per character (CHARS/<name>/*.png, sorted) in the prompt
    c.label.batch_size = 4  # clips captioned per generate() call
    c.label.max_retries = 1  # retries with the stricter prompt before a clip is written as unlabelled
    c.label.max_new_tokens = 160  # generation budget of one answer (a JSON object of ~60-100 tokens)
    c.label.greedy = True  # greedy decoding (deterministic); False = sampling with temperature / top_p
    c.label.temperature = 0.7  # sampling only
    c.label.top_p = 0.9  # sampling only
    c.label.dtype = "bfloat16"  # VLM weights / activations: "bfloat16", "float16" or "float32"
    c.label.device = "auto"  # torch device of the VLM: "auto" (cuda if available), "cpu", "cuda", "cuda:1"
    c.label.match_threshold = 0.6  # rule-based captioner: colour-histogram intersection to count a character
    return c
