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


def test_student_adds_one_embedding_mlp_small_hand_computed():
    # the guidance MLP: Linear(D=8 -> E=4) + Linear(4 -> 4) on one row, 2*8*4 + 2*4*4 = 96 FLOPs
    parts = cost_model.dit_forward_flops(SMALL_DIT, text_tokens=2, guidance=True)
    assert parts["embed_out"] == 832 + 96 and parts["blocks_linear"] == 9984


def test_paper_size_student_dit_flops_per_turn():
    """Teacher 50 steps x CFG 2 = 100 DiT calls; the student at N steps makes N calls (each 2.49 MFLOP
    more for its guidance MLP), so student-4 needs 25x fewer DiT FLOPs (acceptance: >= 20x)."""
    cfg = load_config("configs/animegamer_2b_7b.py")
    rows = {r["label"]: r for r in cost_model.student_table_rows(cfg)}
    assert list(rows) == ["teacher (50 steps x CFG 2)", "student (1 step)", "student (2 steps)",
                          "student (4 steps)", "student (8 steps)"]
    one = 29732107780096.0  # one merged-LoRA teacher forward, B = 1: 29.73 TFLOP
    assert sum(cost_model.dit_forward_flops(cfg.dit, 226, lora=False).values()) == one
    assert rows["teacher (50 steps x CFG 2)"]["calls"] == 100
    assert rows["teacher (50 steps x CFG 2)"]["dit"] == 100 * one == 2973210778009600.0
    guidance_mlp = 2 * (1920 * 512 + 512 * 512)  # 2,490,368 FLOPs
    for n in (1, 2, 4, 8):
        r = rows[f"student ({n} step{'s' if n > 1 else ''})"]
        assert r["calls"] == n and r["dit"] == n * (one + guidance_mlp)
        assert r["ratio"] == pytest.approx(100 / n, rel=1e-6)
        # the rest of the turn (MLLM, resamplers, VAE decode: 132.8 TFLOP) is the same for both
        assert r["turn"] - r["dit"] == pytest.approx(rows["teacher (50 steps x CFG 2)"]["turn"] - 100 * one)
    s4 = rows["student (4 steps)"]
    assert s4["dit"] == 118928441081856.0 and 24.99 < s4["ratio"] < 25.0
    assert s4["turn"] == 251736038277120.0
    # play's student config: turn_flops counts 4 student calls; the teacher it compares with is the
    # 50-step grid the student was distilled on
    student = load_config("configs/animegamer_2b_7b.py",
                          ["diffusion.sampler=student", "diffusion.num_sampling_steps=4"])
    assert cost_model.turn_flops(student, lora=False)["dit"] == s4["dit"]
    assert cost_model.teacher_steps(student) == 50
    assert [r["dit"] for r in cost_model.student_table_rows(student)] == [r["dit"] for r in rows.values()]
    with pytest.raises(ValueError, match="unknown sampler kind"):
        cost_model.dit_sampling_flops(cfg, 226, "ddim", 4)


def test_phase_d_train_step_counts_teacher_and_student():
    cfg = load_config("configs/animegamer_2b_7b.py")
    d, a2 = cost_model.train_step_flops(cfg, "d"), cost_model.train_step_flops(cfg, "a2")
    one = sum(cost_model.dit_forward_flops(cfg.dit, 226).values())
    assert d["teacher"] == 2 * 16 * one  # the frozen teacher's CFG batch of 2
    assert d["student"] == pytest.approx(4 * 16 * one, rel=1e-6)  # target forward + 3x trained forward
    assert d["vae_encode"] == a2["vae_encode"] and d["shot_encoder"] == a2["shot_encoder"] / 3


def test_cli_prints_teacher_and_student_turns(capsys):
    cost_model.main(["--chip=tpu-v6e"])
    out = capsys.readouterr().out
    assert "| teacher (50 steps x CFG 2) | 100 |    2.973 PFLOP | 1.00x |    3.106 PFLOP | 3.383 / 8.459 |" in out
    assert "| student (4 steps) | 4 |  118.928 TFLOP | 25.00x |  251.736 TFLOP | 0.274 / 0.686 |" in out
    assert "### Train step, phase d (global batch 16)" in out
