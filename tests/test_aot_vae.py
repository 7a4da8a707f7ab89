"""The VAE's programs compile for a 4-chip v5e slice with the real TPU compiler: the "vae" phase's step
(smallest curriculum stage) and play's decode stage. Apart from the other compile tests because the
TPU compiler takes minutes over the 3D causal VAE on 2 cores (pytest-xdist runs files side by side)."""

import pytest

from animegamer_jax.parallel import target
from tests.tpu import FSDP, compile_tiny

pytestmark = pytest.mark.slow  # its tests (or the fixtures they share) take over ~10 s each on a loaded 2-core host


@pytest.mark.paper  # the VAE train step for the TPU compiler (80 s on 2 cores)
def test_vae_phase_step_compiles_on_tpu():
    row = compile_tiny("vae", FSDP + ["train.vae_curriculum=((0,1,32,48),)"])
    assert row.status == "ok", row.status
    assert not row.kernels  # no attention in the VAE
    assert 0 < row.peak < 0.01 * target.chip_named("v5e").hbm_bytes and row.roofline_s > 0
    assert "frames" in row.note and "global batch 4" in row.note


# make test-paper, for CI's time budget (80 s on 2 cores): the VAE is plain convolutions (no kernel, no
# shard_map); make test compiles play's other stages for the TPU (test_aot_turn.py) and runs this
# decode program on the CPU (test_vae.py, test_game_real_system.py).
@pytest.mark.paper
def test_vae_decode_stage_compiles_on_tpu():
    row = compile_tiny("vae_decode", [])
    assert row.status == "ok", row.status
    assert row.note.startswith("latency layout, 1 game(s)")
    assert row.flops > 0 and row.peak > 0 and row.hbm_fraction < 0.01
