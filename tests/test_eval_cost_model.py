"""The analytic cost model (benchmarks/cost_model.py) on hand-computed small cases and at paper size."""

import pytest

from animegamer_jax.config import load_config
from benchmarks import cost_model

SMALL_DIT = dict(hidden_size=8, num_layers=1, num_heads=2, head_dim=4, mlp_ratio=4.0, time_embed_dim=4,
                 in_channels=1, out_channels=1, patch_size=2, sample_height=4, sample_width=4,
                 num_latent_frames=1, lora_rank=0)


def test_dit_forward_small_hand_computed():
    parts = cost_model.dit_forward_flops(SMALL_DIT, text_tokens=2)
    # n = 2 text + 1 x 2 x 2 video = 6 tokens, D = 8
    # qkv 2*6*8*24=2304, out 2*6*8*8=768, mlp 2*(2*6*8*32)=6144, adaLN 2*1*4*96=768
    assert parts["blocks_linear"] == 9984
    assert parts["blocks_attention"] == 4 * 6 * 6 * 8
    # patch 2*4*4*8=256, proj_out 2*4*8*4=256, time+flow 2*(2*8*4+2*4*4)=192, final adaLN 2*4*16=128
    assert parts["embed_out"] == 832
    assert parts["lora"] == 0
    with_lora = cost_model.dit_forward_flops({**SMALL_DIT, "lora_rank": 2}, text_tokens=2)
    assert with_lora["lora"] == 4 * (2 * 6 * 8 * 2 + 2 * 6 * 2 * 8)


def test_mistral_prefill_and_decode_small_hand_computed():
    m = dict(hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4, intermediate_size=16, num_layers=1,
             vocab_size=10, lora_rank=0, sliding_window=0)
    pre = cost_model.mistral_forward_flops(m, 3)
    assert pre["linear"] == 384 + 384 + 384 + 2304
    assert pre["attention"] == 4 * (3 * 4 / 2) * 8  # causal: 1 + 2 + 3 visible keys
    assert pre["lm_head"] == 480
    dec = cost_model.mistral_forward_flops(m, 1, context=3)
    assert dec["linear"] == 1152
    assert dec["attention"] == 4 * 4 * 8
    assert dec["lm_head"] == 160
    full = cost_model.mistral_forward_flops(m, 3, causal=False)
    assert full["attention"] == 4 * 9 * 8


def test_vae_decode_small_hand_computed():
    vae = dict(block_out_channels=(4, 8), latent_channels=2, layers_per_block=0, temporal_compression_ratio=2,
               in_channels=3)
    # latent 3x2x2 = 12 positions. conv_in 2*12*8*2*27 = 10368.
    # resnet 8->8 at 12: two 3x3x3 convs 2*(2*12*64*27) = 82944 + SpatialNorm 4*(2*12*2*8) = 1536 -> 84480;
    # mid = 2 x 84480, level 8 = 1 x 84480; upsample to 5x4x4 = 80 positions, conv 2*80*64*9 = 92160.
    # resnet 8->4 at 80: 138240 + 69120 + shortcut 5120 + SpatialNorm 5120 + 2560 = 220160.
    # norm_out 2*(2*80*2*4) = 2560; conv_out 2*80*12*27 = 51840.
    assert cost_model.vae_decode_flops(vae, 3, 2, 2) == 630528


def test_paper_size_turn_is_about_three_pflop_of_dit():
    cfg = load_config("configs/animegamer_2b_7b.py")
    video, total = cost_model.dit_tokens(cfg.dit, 226)
    assert (video, total) == (6750, 6976)
    turn = cost_model.turn_flops(cfg)
    one = sum(cost_model.dit_forward_flops(cfg.dit, 226).values())
    assert turn["dit"] == pytest.approx(50 * 2 * one)
    assert 2.9e15 < turn["dit"] < 3.1e15
    # the DiT dominates a turn; the MLLM is well under 1 %
    assert turn["dit"] / sum(turn.values()) > 0.9
    assert cost_model.turn_sequence_length(cfg, 25) == (1 + 2 * 270 + 257, 226)
    a2 = cost_model.train_step_flops(cfg, "a2")
    assert a2["dit"] == pytest.approx(3 * 16 * one)
    with pytest.raises(ValueError, match="unknown phase"):
        cost_model.train_step_flops(cfg, "z")


def test_mfu():
    assert cost_model.mfu(1e15, 2.0, 1e15) == pytest.approx(0.5)
    assert cost_model.mfu(1e15, 1.0, 1e15, chips=4) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        cost_model.mfu(1.0, 0.0, 1.0)
