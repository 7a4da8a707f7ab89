#!/usr/bin/env bash
# Multi-node GPU training under SLURM: one task per node, each task sees all GPUs of its node.
# JAX reads SLURM_* (coordinator = first node, process id = SLURM_PROCID) when
# animegamer_jax.parallel.initialize() calls jax.distributed.initialize().
#
#   sbatch --nodes=2 launch/slurm_gpu.sh --config=configs/animegamer_2b_7b.py \
#       --config.train.phase=a2 --workdir=/shared/runs/a2
#
#SBATCH --job-name=animegamer-train
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --exclusive
set -euo pipefail
PYTHON=${PYTHON:-python3}
# One process per node owning every local GPU; XLA may take most of the GPU memory.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
srun --ntasks-per-node=1 "$PYTHON" -m animegamer_jax.train "$@"
