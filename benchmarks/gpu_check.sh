#!/usr/bin/env bash
# One short GPU check: full-size AnimeGamer game turns exactly as `play` runs them (play's GameEngine,
# latency layout, on the demo's randomly initialised system: benchmarks/gpu_bench.py) and a few train steps.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]        # default OUT_DIR: $OUT or ./gpu_check_out
#
# Needs: one NVIDIA GPU (>= 80 GB for the train steps; the turn alone needs ~25 GB), Python >= 3.11.
# Installs jax[cuda12]==0.10.2 (+ the pinned flax/optax/... from requirements.txt) only when the
# current interpreter lacks them or JAX sees no GPU. Whole run is capped at 570 s so it fits a
# 10-minute slot; benchmarks/gpu_bench.py stops starting new pieces when its budget is used and still
# writes its report. Prints a table (compile s, run s, implied MFU per piece; s/turn) and writes
# OUT_DIR/gpu_check.json + OUT_DIR/gpu_check.log. Exit status: 0 all self-checks passed, 1 a check
# failed (named in the last line), 2 set-up failed (no GPU / install failed).
# GPU_CHECK_DRY_RUN=1 runs the same flow on CPU with configs/tiny.py and no install (tests the script).
set -uo pipefail

START=$(date +%s)
TOTAL_BUDGET=${GPU_CHECK_BUDGET_S:-570}
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu_check_out}}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
: > "$LOG"
say() { echo "[gpu_check $(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
left() { echo $(( TOTAL_BUDGET - ($(date +%s) - START) )); }

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
else
  say "nvidia-smi not found: no NVIDIA driver visible"
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in .venv/bin/python python3 python; do
    if command -v "$c" >/dev/null 2>&1; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { say "no python found"; exit 2; }
say "python: $($PY --version 2>&1) ($PY)"

pin() {  # version pinned in requirements.txt for a package name (empty if absent)
  grep -iE "^$1==" requirements.txt 2>/dev/null | head -1
}

gpu_ok() {
  "$PY" - <<'EOF' >>"$LOG" 2>&1
import jax, flax, optax, ml_collections, sentencepiece  # noqa: F401
assert jax.__version__ == "0.10.2", jax.__version__
d = jax.devices()[0]
assert d.platform == "gpu", f"JAX backend is {d.platform}, not gpu"
import jax.numpy as jnp
x = jnp.ones((1024, 1024), jnp.bfloat16)
assert float((x @ x)[0, 0]) == 1024.0
print("jax", jax.__version__, "on", d.device_kind)
EOF
}

EXTRA=()
if [ "${GPU_CHECK_DRY_RUN:-0}" = "1" ]; then
  say "dry run: CPU, configs/tiny.py, no install"
  EXTRA=(--config configs/tiny.py --allow_cpu --repeats 1 --turns 2)
elif gpu_ok; then
  say "JAX GPU stack present"
else
  say "installing jax[cuda12]==0.10.2 and the pinned runtime packages (log: $LOG)"
  PKGS=("jax[cuda12]==0.10.2")
  for p in flax optax orbax-checkpoint ml_collections ml-collections einops numpy sentencepiece mistral-common \
           safetensors pillow av opencv-python-headless absl-py; do
    v=$(pin "$p"); [ -n "$v" ] && PKGS+=("$v")
  done
  if ! timeout $(( $(left) - 300 > 60 ? $(left) - 300 : 60 )) "$PY" -m pip install -q "${PKGS[@]}" >>"$LOG" 2>&1; then
    say "pip install failed or timed out; see $LOG"; tail -5 "$LOG"; exit 2
  fi
  gpu_ok || { say "JAX still sees no working GPU after install; see $LOG"; tail -5 "$LOG"; exit 2; }
  say "install done"
fi

# GPU-friendly XLA settings: no preallocation cap fights, latency-hiding scheduler.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
export TF_CPP_MIN_LOG_LEVEL=3

BUDGET=$(( $(left) - 45 ))
[ "$BUDGET" -gt 60 ] || { say "no time left for the benchmark"; exit 2; }
say "running benchmarks/gpu_bench.py with a ${BUDGET}s budget"
timeout $(( BUDGET + 30 )) "$PY" benchmarks/gpu_bench.py --out "$OUT_DIR" --budget_s "$BUDGET" "${EXTRA[@]}" "${@:2}" 2>&1 | tee -a "$LOG"
RC=${PIPESTATUS[0]}
if [ "$RC" -eq 124 ]; then
  say "gpu_bench.py hit the hard timeout; partial output above"
  RC=1
fi
[ -f "$OUT_DIR/gpu_check.json" ] || { say "no gpu_check.json written"; RC=1; }
say "done (exit $RC); analytic cost model for reference:"
"$PY" benchmarks/cost_model.py --chip h100 2>/dev/null | sed -n '/One game turn/,/turn time/p' | tee -a "$LOG"
exit "$RC"
