#!/usr/bin/env bash
# Multi-node GPU training under SLURM: one task per node, each task sees all GPUs of its node.
# JAX reads SLURM_* (coordinator = first node, process id = SLURM_PROCID) when
# animegamer_jax.parallel.initialize() calls jax.distributed.initialize().
#
#   sbatch --nodes=2 launch/slurm_gpu.sh --config=configs/animegamer_2b_7b.py \
#       --config.train.phase=a2 --workdir=gs://bucket/runs/a2
#   launch/slurm_gpu.sh --dry_run ...      prints the environment and the srun command, runs nothing
#
# The checkout must be on a filesystem every node sees (the usual SLURM set-up), with its
# environment installed once: `python3 -m venv .venv && .venv/bin/pip install -e .[cuda12]`
# (then PYTHON=.venv/bin/python). Env: PYTHON (default python3), MODULE (default animegamer_jax.commands.train).
#
#SBATCH --job-name=animegamer-train
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --exclusive
set -euo pipefail
# under sbatch the script runs from a spool copy: find _common.sh from the submit directory
HERE=$(dirname "${BASH_SOURCE[0]}")
[[ -f "$HERE/_common.sh" ]] || HERE="${SLURM_SUBMIT_DIR:-.}/launch"
source "$HERE/_common.sh"
parse_common "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
PYTHON=${PYTHON:-python3}
# One process per node owning every local GPU; XLA may take most of the GPU memory.
setenv XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
run srun --ntasks-per-node=1 "$PYTHON" -m "$MODULE" "$@"
