PYTHON ?= python3

.PHONY: test quickstart

# Sets up what is missing (fast when already set up), then runs the whole test suite.
test:
	$(PYTHON) scripts/ensure_deps.py requirements-test.txt
	$(PYTHON) -m pytest

# Sets up what is missing, then trains and compares softmax, sparsemax and entmax-1.5 over 3 seeds
# on the built-in dataset (offline, CPU), printing the comparison table, the paired statistics and
# the report's path. QUICKSTART_JOBS runs train at once (one CPU thread each on a CPU machine, one
# GPU each on a GPU machine): 3 spreads the 9 runs evenly over 2 cores (2 would leave one core
# idle for the last run); set it to your core count on a bigger machine.
QUICKSTART_JOBS ?= 3
quickstart:
	$(PYTHON) scripts/ensure_deps.py requirements.txt
	$(PYTHON) scripts/compare_heads.py --config configs/quickstart_compare.yaml --seeds 0 1 2 \
		--jobs $(QUICKSTART_JOBS)
