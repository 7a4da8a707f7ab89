#!/usr/bin/env bash
# Cloud TPU VM pod slice: run the same training command on every worker.
# JAX finds the peers itself on TPU VMs (jax.distributed.initialize() with no arguments),
# which animegamer_jax.parallel.initialize() calls when TPU_WORKER_HOSTNAMES lists several hosts.
#
#   launch/tpu_pod.sh TPU_NAME ZONE [extra training flags...]
#   e.g. launch/tpu_pod.sh my-v5p-64 us-east5-a --config=configs/animegamer_2b_7b.py \
#        --config.train.phase=b --workdir=gs://bucket/runs/b
#
# Env: REPO_DIR (checkout on the workers, default ~/animegamer-jax), PYTHON (default python3),
#      PROJECT (gcloud project, optional).
set -euo pipefail
TPU_NAME=${1:?usage: tpu_pod.sh TPU_NAME ZONE [training flags...]}
ZONE=${2:?usage: tpu_pod.sh TPU_NAME ZONE [training flags...]}
shift 2
REPO_DIR=${REPO_DIR:-'~/animegamer-jax'}
PYTHON=${PYTHON:-python3}
ARGS=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" ${PROJECT:+--project="$PROJECT"} --worker=all \
  --command="cd $REPO_DIR && $PYTHON -m animegamer_jax.train$ARGS"
