#!/usr/bin/env bash
# Plain multi-node GPU launch (no scheduler): run this on every node with its own NODE_RANK.
#
#   # node 0 (coordinator)            # node 1
#   NODE_RANK=0 NUM_NODES=2 \         NODE_RANK=1 NUM_NODES=2 \
#   COORDINATOR=10.0.0.1:1234 \       COORDINATOR=10.0.0.1:1234 \
#   launch/multinode_gpu.sh --config=configs/animegamer_2b_7b.py --config.train.phase=b --workdir=/shared/b
#
# Sets the standard JAX variables read by animegamer_jax.parallel.initialize().
# A single node (NUM_NODES=1) needs none of this: python -m animegamer_jax.train ... uses all local GPUs.
set -euo pipefail
: "${NODE_RANK:?set NODE_RANK (0..NUM_NODES-1)}"
: "${NUM_NODES:?set NUM_NODES}"
: "${COORDINATOR:?set COORDINATOR=host:port of node 0}"
PYTHON=${PYTHON:-python3}
export JAX_COORDINATOR_ADDRESS="$COORDINATOR"
export JAX_NUM_PROCESSES="$NUM_NODES"
export JAX_PROCESS_ID="$NODE_RANK"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
exec "$PYTHON" -m animegamer_jax.train "$@"
