#!/usr/bin/env bash
# Cloud TPU VM pod slice: ship the code to every worker, set up its environment, run the same
# command on all of them. JAX finds the peers itself on TPU VMs (jax.distributed.initialize() with
# no arguments), which animegamer_jax.parallel.initialize() calls when TPU_WORKER_HOSTNAMES lists
# several hosts.
#
#   launch/tpu_pod.sh [--dry_run] [--mode=copy|wheel|xpk] TPU_NAME ZONE [training flags...]
#   e.g. launch/tpu_pod.sh my-v5p-64 us-east5-a --config=configs/animegamer_2b_7b.py \
#        --config.train.phase=b --workdir=gs://bucket/runs/b
#
# Modes (what maxtext's multihost_runner / xpk do):
#   copy  (default) tar the checkout (tracked + untracked, not ignored files), `tpu-vm scp` it to
#         every worker, unpack into REPO_DIR, create REPO_DIR/.venv and `pip install -e .[tpu]`
#         there (skipped with SETUP=0), then `tpu-vm ssh --worker=all` runs MODULE from the venv.
#   wheel build a wheel (`pip wheel --no-deps`), scp it, `pip install 'WHEEL[tpu]'` into ~/agj-venv,
#         and run from there (no checkout on the workers; configs travel inside the wheel).
#   xpk   TPU_NAME is the GKE cluster: `docker build` launch/Dockerfile, `docker push` IMAGE, then
#         `xpk workload create --docker-image IMAGE --tpu-type TPU_TYPE --command "python -m MODULE ..."`.
#
# --dry_run prints every command, exactly, and runs none.
# Env: PROJECT (gcloud project, optional), REPO_DIR (default ~/animegamer-jax), SETUP (1),
#      STAGE_DIR (local folder for the tarball / wheel, default ${TMPDIR:-/tmp}),
#      MODULE (default animegamer_jax.commands.train); xpk: IMAGE (required), TPU_TYPE (default v5p-64),
#      NUM_SLICES (1), WORKLOAD (default animegamer-<date>).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
source "$HERE/_common.sh"
MODE=copy
REST=()
for a in "$@"; do
  case "$a" in
    --mode=*) MODE=${a#--mode=} ;;
    *) REST+=("$a") ;;
  esac
done
parse_common ${REST[@]+"${REST[@]}"}
set -- ${ARGS[@]+"${ARGS[@]}"}
usage="usage: tpu_pod.sh [--dry_run] [--mode=copy|wheel|xpk] TPU_NAME ZONE [training flags...]"
TPU_NAME=${1:?$usage}
ZONE=${2:?$usage}
shift 2
REPO_DIR=${REPO_DIR:-'~/animegamer-jax'}
STAGE_DIR=${STAGE_DIR:-${TMPDIR:-/tmp}}
SETUP=${SETUP:-1}
CMD_ARGS=$(quote "$@")
GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$ZONE" ${PROJECT:+--project="$PROJECT"} --worker=all)

case "$MODE" in
  copy)
    TAR="$STAGE_DIR/animegamer-jax-code.tar.gz"
    run_sh "cd $(quote1 "$ROOT") && git ls-files -z --cached --others --exclude-standard | tar -czf $(quote1 "$TAR") --null -T -"
    run "${GCLOUD[@]}" scp "$TAR" "$TPU_NAME:~/animegamer-jax-code.tar.gz" "${WHERE[@]}"
    if [[ "$SETUP" == 1 ]]; then
      run "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --command="set -e; mkdir -p $REPO_DIR && tar -xzf ~/animegamer-jax-code.tar.gz -C $REPO_DIR && cd $REPO_DIR && (test -x .venv/bin/python || python3 -m venv .venv) && .venv/bin/pip install -q -e '.[tpu]'"
    else
      run "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --command="set -e; mkdir -p $REPO_DIR && tar -xzf ~/animegamer-jax-code.tar.gz -C $REPO_DIR"
    fi
    run "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --command="cd $REPO_DIR && .venv/bin/python -m $MODULE $CMD_ARGS"
    ;;
  wheel)
    VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -1)
    WHEEL="animegamer_jax-$VERSION-py3-none-any.whl"
    run python3 -m pip wheel --no-deps --quiet -w "$STAGE_DIR" "$ROOT"
    run "${GCLOUD[@]}" scp "$STAGE_DIR/$WHEEL" "$TPU_NAME:~/$WHEEL" "${WHERE[@]}"
    if [[ "$SETUP" == 1 ]]; then
      run "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --command="set -e; cd ~ && (test -x agj-venv/bin/python || python3 -m venv agj-venv) && agj-venv/bin/pip install -q './$WHEEL[tpu]' && agj-venv/bin/pip install -q --force-reinstall --no-deps './$WHEEL'"
    fi
    run "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --command="~/agj-venv/bin/python -m $MODULE $CMD_ARGS"
    ;;
  xpk)
    : "${IMAGE:?set IMAGE (e.g. gcr.io/PROJECT/animegamer-jax:TAG) for --mode=xpk}"
    TPU_TYPE=${TPU_TYPE:-v5p-64}
    WORKLOAD=${WORKLOAD:-animegamer-$(date +%Y%m%d-%H%M%S)}
    run docker build -f "$HERE/Dockerfile" -t "$IMAGE" "$ROOT"
    run docker push "$IMAGE"
    run xpk workload create --cluster="$TPU_NAME" --zone="$ZONE" ${PROJECT:+--project="$PROJECT"} \
      --workload="$WORKLOAD" --docker-image="$IMAGE" --tpu-type="$TPU_TYPE" --num-slices="${NUM_SLICES:-1}" \
      --command="python -m $MODULE $CMD_ARGS"
    ;;
  *) echo "unknown --mode=$MODE (copy, wheel or xpk)" >&2; exit 2 ;;
esac
