# Set-up and the two commands of the README. Every target creates the venv if absent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast clean-venv

install: $(STAMP)

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

# The main job on the embedded default (see README).
demo: $(STAMP)
	$(PY) -m animegamer_jax.play data/games/bunny.txt --demo --overwrite  # a rerun replaces its own game

# The whole test suite (what .ci/run runs).
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

# Without the PyTorch parity and multi-process tests.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not parity and not multiprocess"

clean-venv:
	rm -rf $(VENV)
