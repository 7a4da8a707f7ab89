"""Training of AnimeGamer's phases (a1 warm-up, a2 joint, b MLLM, c decoder adaptation).

Modules:
  optim.py              AdamW + warm-up/cosine + global-norm clip + optax.MultiSteps accumulation
  loop.py               Trainer (jitted, sharded step; trainable filter) and fit (resume, NaN stop, logs)
  checkpoint.py         orbax CheckpointManager: model + optimizer + step + Grain iterator state
  metrics.py            clu averages, tensorboardX summaries, throughput, MFU
  phases.py             TrainModel per phase, trainable filters, losses, host batch building
  pipeline.py           run_phase / run_all: data -> loop -> system checkpoint
  (the system checkpoint layout, save_system / load_system, is animegamer_jax/system_checkpoint.py)
  __main__.py           python -m animegamer_jax.train --config=configs/tiny.py --workdir=...
"""
