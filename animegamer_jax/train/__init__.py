"""Training of AnimeGamer's phases (vae, a1 warm-up, a2 joint, b MLLM, c decoder adaptation, d student,
r reference adapter, preview decoder).

Modules:
  phases/               one module per phase (components, trainable set, batch kind, loss, schedule)
                        and the table PHASES the train command and the compile tool read
  model.py              TrainModel per phase, the one trainable_filter, phase_spec
  losses.py             the phases' losses (v-MSE, MLLM CE + MSE, VAE L1 + MSE + KL), latent scale fit
  samples.py            sample videos during training (play's DiT sampler, inference/clip_sampler.py)
  optim.py              AdamW + warm-up/cosine + global-norm clip + optax.MultiSteps accumulation
  loop.py               Trainer (jitted, sharded step; trainable filter) and fit (resume, NaN stop, logs)
  checkpoint.py         orbax CheckpointManager: model + optimizer + step + Grain iterator state
  metrics.py            clu averages, tensorboardX summaries, throughput, MFU
  pipeline.py           run_phase / run_all: data -> loop -> system checkpoint (animegamer_jax.checkpoint)
The command: python -m animegamer_jax.commands.train --config=configs/tiny.py --workdir=... (commands/train.py).
"""
