"""Deviceless XLA:GPU compiles (`make aot-gpu`: needs jax[cuda12]==0.10.2, about 5.5 GB, so CI skips
these): the chip specs in animegamer_jax/parallel/gpu_targets/ load, attention ``auto`` picks cuDNN for
a GPU mesh and the cuDNN call compiles partitioned, and tiny train / turn programs compile for 8 H100s."""

import importlib.util

import jax
import pytest

from animegamer_jax.aot import hlo_cost, programs, report
from animegamer_jax.config import load_config
from animegamer_jax.parallel import target

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None,
                                reason="XLA:GPU deviceless compiles need jax[cuda12]==0.10.2: run `make aot-gpu`")


@pytest.mark.parametrize("name,kind", [("h100-8", "NVIDIA H100 80GB HBM3"), ("h200-8", "NVIDIA H200"),
                                       ("a100-8", "NVIDIA A100-SXM4-80GB"), ("b200-8", "NVIDIA B200"),
                                       ("2xh100-8", "NVIDIA H100 80GB HBM3")])
def test_gpu_targets_load(name, kind):
    topo = target.parse_topology(name)
    devs = target.compile_devices(topo)
    assert len(devs) == topo.num_devices and devs[0].device_kind == kind
    assert target.of_device(devs[0]).chip is topo.chip


def _compile(program, overrides, layout="latency", topology="h100-8"):
    cfg = load_config("configs/tiny.py", overrides)
    devs = target.compile_devices(target.parse_topology(topology))
    prog = (programs.train_program(cfg, program, devs) if program in programs.TRAIN_PROGRAMS
            else programs.turn_programs(cfg, [program], devs, layout)[0])
    with jax.default_matmul_precision("default"):
        return report.compile_program(prog, target.chip_named("h100"))


def test_train_step_and_turn_take_cudnn_on_h100():
    # bf16 activations so that cuDNN flash attention applies (it takes bf16 / fp16)
    bf16 = ["dit.dtype=bfloat16", "mllm.dtype=bfloat16"]
    a2 = _compile("a2", ["mesh.shape=(1,-1,1,1)", "train.global_batch_size=8", "train.precomputed_features=True",
                         "train.encode_latents=False"] + bf16)
    dit = _compile("dit", bf16)
    for row in (a2, dit):
        assert row.status == "ok", row.status
        assert any(k.startswith("cudnn (GPU, bf16/fp16") for k in row.kernels), row.kernels
        assert row.flops > 0 and row.peak > 0 and row.roofline_s > 0


def test_hlo_cost_prices_cudnn_attention():
    import jax.numpy as jnp

    from animegamer_jax.models import attention

    devs = target.compile_devices(target.parse_topology("h100-8"))[:1]
    q = jax.ShapeDtypeStruct((2, 1024, 8, 64), jnp.bfloat16)
    mesh = jax.sharding.Mesh(devs, ("x",))
    with jax.set_mesh(mesh):
        c = jax.jit(lambda q, k, v: attention.dot_product_attention(q, k, v, implementation="cudnn")).lower(q, q, q).compile()
    cost = hlo_cost.program_cost(c.as_text())
    assert cost.flops == pytest.approx(4 * 2 * 1024 * 8 * 64 * 1024, rel=0.01)


def test_hlo_cost_prices_cudnn_convolutions_as_xla_cpu_convolutions():
    """XLA:GPU lowers the VAE's convolutions to cuDNN custom calls: priced as convolutions, the decode's
    FLOPs equal the same program's on XLA:CPU (plain convolution ops)."""
    overrides = ["vae.dtype=bfloat16"]
    gpu = _compile("vae_decode", overrides, topology="h100-1")  # one chip, as the CPU side
    cfg = load_config("configs/tiny.py", overrides)
    cpu = programs.turn_programs(cfg, ["vae_decode"], jax.devices("cpu")[:1], "latency")[0]
    cpu_cost = hlo_cost.program_cost(cpu.lower().compile().as_text())
    assert gpu.status == "ok" and gpu.flops == pytest.approx(cpu_cost.flops, rel=1e-6) and gpu.flops > 1e9
