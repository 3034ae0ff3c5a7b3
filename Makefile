PYTHON ?= python3

.PHONY: test

# Sets up what is missing (fast when already set up), then runs the whole test suite.
test:
	$(PYTHON) scripts/ensure_deps.py requirements-test.txt
	$(PYTHON) -m pytest
