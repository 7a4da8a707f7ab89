"""XLA options that overlap a sharded step's collectives with its compute (docs/sharding.md#overlap).

FSDP all-gathers a scanned layer's weights inside the scan and reduce-scatters its gradients; by default
XLA may run those collectives between the layers' matmuls instead of under them. These options make the
scheduler start the next layer's all-gather (and the previous layer's reduce-scatter) while the current
layer computes. They are passed as compile options of the train step (``train.loop.Trainer``), so the
train command and the compile tool (``animegamer-aot --program=<phase>``) compile the same program;
``train.overlap_collectives=False`` leaves XLA's defaults.

Sources: TPU, maxtext's XLA flags library (continuation fusion for all-gather, data-parallel
all-reduce optimisation); GPU, NVIDIA JAX-Toolbox (rosetta, "GPU performance") (latency-hiding
scheduler, pipelined all-gather / reduce-scatter / all-reduce, while-loop double buffering).
"""

from __future__ import annotations

from typing import Any

#: libtpu options (strings: libtpu parses its own flags).
TPU = {
    "xla_tpu_enable_async_collective_fusion": "true",
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": "true",
    "xla_tpu_enable_async_collective_fusion_multiple_steps": "true",
    "xla_tpu_overlap_compute_collective_tc": "true",
    "xla_enable_async_all_gather": "true",
    "xla_tpu_enable_data_parallel_all_reduce_opt": "true",
    "xla_tpu_data_parallel_opt_different_sized_ops": "true",
}

#: XLA:GPU ``DebugOptions`` fields (booleans).
GPU = {
    "xla_gpu_enable_latency_hiding_scheduler": True,
    "xla_gpu_enable_pipelined_all_gather": True,
    "xla_gpu_enable_pipelined_reduce_scatter": True,
    "xla_gpu_enable_pipelined_all_reduce": True,
    "xla_gpu_enable_while_loop_double_buffering": True,
}


def overlap_options(platform: str) -> dict[str, Any]:
    """The overlap options of ``platform`` ("tpu"; "gpu" or "cuda"; anything else, e.g. "cpu": none)."""
    return dict(TPU if platform == "tpu" else GPU if platform in ("gpu", "cuda", "rocm") else {})


def train_compile_options(config: Any, mesh: Any, extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Compile options of a train step on ``mesh``: :func:`overlap_options` of its devices' platform when
    ``config.train.overlap_collectives`` (default on), then ``extra`` (e.g. the train command's
    ``--fast_compile``); None when there are none."""
    opts = {}
    if bool(config.train.get("overlap_collectives", True)):
        opts.update(overlap_options(mesh.devices.flat[0].platform))
    opts.update(extra or {})
    return opts or None
