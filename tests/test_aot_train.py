"""One train step of every phase of configs/tiny.py compiles for a 4-chip v5e slice with the real TPU
compiler (deviceless), with the kernels ``auto`` must pick there: the program the train command runs."""

import jax
import pytest

from animegamer_jax.aot import programs, report
from animegamer_jax.config import load_config
from animegamer_jax.parallel import target
from tests.tpu import tpu_devices

# FSDP over the 4 chips (the paper config's layout) and a batch they divide. Phase a1 runs T5 and CLIP
# in the step, as tiny.py does; the others take precomputed features (data/extract_features) so that
# each compiles in seconds. Every decoder phase takes latents: the VAE (slow to compile for a TPU, about
# 2 min at tiny size on 2 cores) is compiled once for training and once for play, in test_aot_vae.py.
FSDP = ["mesh.shape=(1,-1,1,1)", "train.global_batch_size=4"]
LEAN = FSDP + ["train.precomputed_features=True", "train.encode_latents=False"]


def compile_tiny(program: str, overrides: list[str], layout: str = "latency") -> report.Row:
    """Compiles ``program`` of configs/tiny.py (+ ``overrides``) for v5e-4 and returns its row."""
    cfg = load_config("configs/tiny.py", overrides)
    devs = tpu_devices("v5e-4")
    prog = (programs.train_program(cfg, program, devs) if program in programs.TRAIN_PROGRAMS
            else programs.turn_programs(cfg, [program], devs, layout)[0])
    with jax.default_matmul_precision("default"):  # conftest's "highest" is for fp32 parity tests
        return report.compile_program(prog, target.of_device(devs[0]).chip)


def _kernels(row):
    return {k.split(" (")[0] for k in row.kernels}


@pytest.mark.parametrize("phase,overrides", [("a1", FSDP + ["train.encode_latents=False"]), ("a2", LEAN),
                                             ("b", LEAN), ("c", LEAN), ("d", LEAN)])
def test_train_step_compiles_on_tpu(phase, overrides):
    row = compile_tiny(phase, overrides)
    chip = target.chip_named("v5e")
    assert row.status == "ok", row.status
    assert 0 < row.peak < 0.8 * chip.hbm_bytes and row.hbm_fraction < 0.01
    assert row.flops > 0 and row.bytes_accessed > 0 and row.roofline_s > 0
    assert "global batch 4" in row.note
    # the DiT (a1/a2/c) and CLIP take the real splash kernel (the DiT's call failed to compile
    # unpartitioned); T5's biased attention and the MLLM's hybrid mask cannot, so auto gives them blockwise
    assert ("splash" in _kernels(row)) == (phase != "b")
    assert any("additive bias" in k and k.startswith("blockwise") for k in row.kernels) == (phase == "a1")
    if phase in ("b", "c"):
        assert any("bidirectional query block" in k and k.startswith("blockwise") for k in row.kernels)
    if phase in ("a1", "a2", "c", "d"):  # the DiT's layer scan: XLA's own count sees its body once
        assert row.flops > row.xla_flops
    if phase == "d":  # the student (all of it trained) next to the frozen teacher it is distilled from
        assert "shot_encoder, dit, student" in row.note
