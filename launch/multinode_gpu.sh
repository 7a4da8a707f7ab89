#!/usr/bin/env bash
# Plain multi-node GPU launch (no scheduler): run this on every node with its own NODE_RANK.
#
#   # node 0 (coordinator)            # node 1
#   NODE_RANK=0 NUM_NODES=2 \         NODE_RANK=1 NUM_NODES=2 \
#   COORDINATOR=10.0.0.1:1234 \       COORDINATOR=10.0.0.1:1234 \
#   launch/multinode_gpu.sh --config=configs/animegamer_2b_7b.py --config.train.phase=b --workdir=gs://bucket/b
#
#   launch/multinode_gpu.sh --dry_run ...     prints the environment and the command, runs nothing
#
# Sets the standard JAX variables read by animegamer_jax.parallel.initialize(). The code and the
# environment must exist on every node (a shared filesystem checkout, or `pip install -e .[cuda12]`
# on each; see launch/README.md). A single node (NUM_NODES=1) needs none of this:
# `python -m animegamer_jax.commands.train ...` uses all local GPUs.
# Env: PYTHON (default python3), MODULE (default animegamer_jax.commands.train).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
parse_common "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
: "${NODE_RANK:?set NODE_RANK (0..NUM_NODES-1)}"
: "${NUM_NODES:?set NUM_NODES}"
: "${COORDINATOR:?set COORDINATOR=host:port of node 0}"
PYTHON=${PYTHON:-python3}
setenv JAX_COORDINATOR_ADDRESS="$COORDINATOR"
setenv JAX_NUM_PROCESSES="$NUM_NODES"
setenv JAX_PROCESS_ID="$NODE_RANK"
setenv XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
run "$PYTHON" -m "$MODULE" "$@"
