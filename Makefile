# Set-up and the two commands of the README. Every target creates the venv if absent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install tpu-compiler aot-gpu browser demo toy-world test test-fast test-paper clean-venv

install: $(STAMP)

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

# The TPU compiler for deviceless TPU compiles (python -m animegamer_jax.commands.aot, tests/test_aot_*.py):
# libtpu as jax[tpu]==0.10.2 pins it, installed beside the venv rather than on its import path, so
# ordinary CPU runs do not probe for a TPU (parallel/target.py finds it there).
TPU_COMPILER := $(VENV)/tpu-compiler/libtpu/libtpu.so

tpu-compiler: $(TPU_COMPILER)

$(TPU_COMPILER): $(STAMP)
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/tpu-compiler libtpu==0.0.42.1
	touch $(TPU_COMPILER)

# XLA:GPU deviceless compiles: a second venv with jax[cuda12]==0.10.2 (about 7 GB with the
# requirements; too large for CI, which skips tests/test_aot_gpu.py), then those tests.
CUDA_VENV ?= .venv-cuda
aot-gpu:
	test -x $(CUDA_VENV)/bin/python || $(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -m pip install --quiet -r requirements.txt "jax[cuda12]==0.10.2"
	JAX_PLATFORMS=cpu $(CUDA_VENV)/bin/python -m pytest -q tests/test_aot_gpu.py

# The main job on the embedded default (see README).
demo: $(STAMP)
	$(PY) -m animegamer_jax.commands.play data/games/bunny.txt --demo --overwrite  # a rerun replaces its own game
	$(PY) -m animegamer_jax.commands.play data/games/sample_tour.txt --demo --overwrite  # the three sample films

# The toy world, end to end: generate it, prepare train/ and heldout/, train configs/toy_world.py's
# pipeline (hours on 2 CPU cores). Rerunning resumes where it stopped (docs/training.md#train-the-toy-world).
TOY_DATA ?= data/prepared
TOY_WORKDIR ?= outputs/toy_world
toy-world: $(STAMP)
	$(PY) -m animegamer_jax.commands.train toy-world --data_dir=$(TOY_DATA) --workdir=$(TOY_WORKDIR) $(TOY_FLAGS)

# Headless Chromium + chromedriver from Debian's packages for the browser test of the web app
# (tests/test_web.py). Needs root (CI runs as root); where it cannot install, the browser test is
# skipped and says why.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    chromium chromium-driver >/dev/null) || echo "browser: apt-get install failed; the browser test will be skipped"; \
	else echo "browser: not root or no apt-get; install chromium + chromedriver to run the browser test"; fi

# The whole test suite (what .ci/run runs), but for the paper-width checks (`make test-paper`).
test: $(STAMP) $(TPU_COMPILER) browser
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not paper" --durations=25  # the slowest, for the 15-minute budget

# Paper-width layers on the CPU (jump-forward ids, int8 error), second variants of slow tests (the VAE's
# TPU compiles, phase b in two processes, ...) and the end-to-end `eval identity` command: minutes.
test-paper: $(STAMP) $(TPU_COMPILER)
	$(PY) -m pytest -q -m paper

# The suite without the tests marked `slow` (each over ~10 s on a loaded 2-core host: compiles of the tiny
# system, TPU compiles, the browser, subprocess commands, several processes) and the paper-width ones:
# within 3 minutes on 2 cores. `make test` (and CI) runs the slow tests too.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not paper"

# Kill-anywhere table (issue 31; tests/faults.py, docs/faults.md): every long command (play, generate,
# serve, each training phase, prepare, label, extract_features, convert release) killed FAULTS_N times
# at seeded random moments (SIGKILL, SIGINT, SIGTERM), plus training with its newest checkpoint damaged
# after the kill (train-damaged), rerun and checked; prints command | kills |
# reruns | invariant failures, exits 1 on any failure. About 40 minutes on 2 CPU cores at N=10.
# FAULTS_ARGS: e.g. --cases=prepare,label --system=standin --workdir=/tmp/faults --keep (--help lists them).
FAULTS_N ?= 10
FAULTS_ARGS ?=
.PHONY: faults
faults: $(STAMP)
	$(PY) -m tests.faults --n $(FAULTS_N) $(FAULTS_ARGS)

clean-venv:
	rm -rf $(VENV)
