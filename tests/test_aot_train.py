"""One train step of every phase of configs/tiny.py compiles for a 4-chip v5e slice with the real TPU
compiler (deviceless), with the kernels ``auto`` must pick there: the program the train command runs."""

import pytest

from animegamer_jax.parallel import target
from tests.tpu import FSDP, compile_tiny

pytestmark = pytest.mark.slow  # its tests (or the fixtures they share) take over ~10 s each on a loaded 2-core host

LEAN = FSDP + ["train.precomputed_features=True", "train.encode_latents=False"]


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
