# make test   - set up (idempotent), lint (ruff) and run the whole test suite
# make setup  - only the set-up
SHELL := /bin/bash
ENV := . scripts/env.sh &&

.PHONY: setup test test-fast lint clean
setup:
	bash scripts/setup.sh

test: setup lint
	$(ENV) OMP_NUM_THREADS=1 python -m pytest test

# ruff.toml: pyflakes, syntax errors and bugbear's likely bugs (part of make test, so of CI)
lint: setup
	$(ENV) ruff check .

test-fast: setup
	$(ENV) OMP_NUM_THREADS=1 python -m pytest test -x -q -m "not slow"

clean:
	rm -rf build install .venv

# the main job: the demo model drives the planner node over DDS on a held-out bag (MODEL= FRAMES= RATE=)
.PHONY: demo
demo: setup
	$(ENV) bash scripts/demo.sh

# the demo models' whole recipe (CPU: about 3.5 h on 2 cores); writes runs/demo/ and models/
.PHONY: train-demo
train-demo: setup
	$(ENV) bash scripts/train_demo.sh
