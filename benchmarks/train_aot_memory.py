"""Full-size train steps of phases (a2) and (b) lowered and compiled for an 8-device mesh of fake CPU
devices, with abstract parameters and inputs (nothing full-size is allocated); prints XLA's compiled
per-device memory analysis and FLOPs.

  python -m benchmarks.train_aot_memory                      # both phases, mesh (1, 8, 1, 1) = FSDP 8
  python -m benchmarks.train_aot_memory --phases=b --mesh=2,2,2,1 --batch=8

Batches use precomputed T5 / CLIP features and latents (``train.precomputed_features``,
``train.encode_latents=False``: the frozen encoders run once offline, data/extract_features), so
the step holds: a2 = E_a + DiT (LoRA r64, flow, adaLN trained); b = MLLM (LoRA r32, norms,
embeddings, resamplers trained) + frozen E_a. bf16 activations, fp32 master weights and AdamW
moments, remat per block. CPU memory figures approximate what XLA would plan on an accelerator
(layouts and fusion differ; treat them as +-20%).
"""

from __future__ import annotations

import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from animegamer_jax import parallel  # noqa: E402
from animegamer_jax.train import loop, metrics, optim, phases  # noqa: E402
from configs import animegamer_2b_7b  # noqa: E402


def abstract_batch(cfg, phase: str, batch: int, mesh, rules) -> dict:
    lt, dt = cfg.rep.num_text_tokens, cfg.t5.d_model
    p, dv = cfg.rep.num_image_tokens, cfg.clip.vision_width
    lat = (cfg.dit.num_latent_frames, cfg.dit.in_channels, cfg.dit.sample_height, cfg.dit.sample_width)
    f32, i32 = jnp.float32, jnp.int32
    if phase in ("a1", "a2"):
        shapes = {"f_md": ((batch, lt, dt), f32), "f_v": ((batch, p, dv), f32), "latents": ((batch,) + lat, f32),
                  "flow": ((batch,), f32)}
    else:
        L, m, w = int(cfg.train.max_seq_len), 3, int(cfg.mllm.history_window)
        shapes = {"input_ids": ((batch, L), i32), "cmp_mask": ((batch, L), jnp.bool_),
                  "gen_mask": ((batch, L), jnp.bool_), "labels": ((batch, L), i32),
                  "padding_mask": ((batch, L), jnp.bool_), "turn_f_md": ((batch, m, lt, dt), f32),
                  "turn_f_v": ((batch, m, p, dv), f32), "target_turn": ((batch,), i32),
                  "history_turns": ((batch, max(w - 1, 1)), i32)}
    return {k: jax.ShapeDtypeStruct(s, d, sharding=parallel.batch_sharding(mesh, len(s), rules))
            for k, (s, d) in shapes.items()}


def run(phase: str, mesh_shape: tuple[int, ...], batch: int) -> dict:
    cfg = animegamer_2b_7b.get_config()
    cfg.train.phase = phase
    cfg.train.precomputed_features = True
    cfg.train.encode_latents = False
    cfg.mesh.shape = mesh_shape
    mesh, rules = parallel.mesh_from_config(cfg), parallel.rules_from_config(cfg)
    parallel.check_global_batch(batch, mesh, rules)
    spec = phases.phase_spec(cfg)
    tx, sched = optim.make_optimizer(cfg.train)
    t0 = time.time()
    tr = loop.Trainer(spec.model_fn, spec.loss_fn, tx, spec.trainable, mesh, rules, schedule=sched)
    trained, total = tr.num_trainable()
    lowered = tr.lower(tr.abstract_state(), abstract_batch(cfg, phase, batch, mesh, rules))
    t_lower = time.time() - t0
    compiled = lowered.compile()
    t_compile = time.time() - t0 - t_lower
    ma = compiled.memory_analysis()
    gib = 1024 ** 3
    out = {
        "phase": phase, "mesh": dict(mesh.shape), "global_batch": batch, "components": spec.components,
        "params_total": total, "params_trained": trained,
        "per_device_GiB": {
            "arguments (params + optimizer + batch)": ma.argument_size_in_bytes / gib,
            "outputs": ma.output_size_in_bytes / gib,
            "aliased (donated)": ma.alias_size_in_bytes / gib,
            "temporaries (activations, grads)": ma.temp_size_in_bytes / gib,
            "peak estimate (args + temps + outputs - aliased)":
                (ma.argument_size_in_bytes + ma.temp_size_in_bytes + ma.output_size_in_bytes
                 - ma.alias_size_in_bytes) / gib,
        },
        "flops_per_device_per_step": metrics.compiled_flops(compiled),
        "lower_s": round(t_lower, 1), "compile_s": round(t_compile, 1),
    }
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default="a2,b")
    ap.add_argument("--mesh", default="1,8,1,1", help="data,fsdp,tensor,context")
    ap.add_argument("--batch", type=int, default=8, help="global micro-batch")
    args = ap.parse_args(argv)
    mesh_shape = tuple(int(x) for x in args.mesh.split(","))
    print(f"{jax.device_count()} {jax.devices()[0].platform} devices", flush=True)
    for phase in args.phases.split(","):
        print(json.dumps(run(phase, mesh_shape, args.batch), indent=1), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
