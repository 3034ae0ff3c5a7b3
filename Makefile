PYTHON ?= python3

.PHONY: test quickstart

# Sets up what is missing (fast when already set up), then runs the whole test suite.
test:
	$(PYTHON) scripts/ensure_deps.py requirements-test.txt
	$(PYTHON) -m pytest

# Sets up what is missing, then trains and compares softmax, sparsemax and entmax-1.5 on the
# built-in dataset (offline, CPU), printing the comparison table and the report's path.
quickstart:
	$(PYTHON) scripts/ensure_deps.py requirements.txt
	$(PYTHON) scripts/compare_heads.py --config configs/quickstart_compare.yaml
