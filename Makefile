# The Python the targets use: the project's virtual environment .venv, made on first use and reused
# (scripts/ensure_venv.py; PEP 668-safe: nothing goes into the system Python; it keeps the torch the
# making Python already has), or an environment of your own: make test PYTHON=/path/to/python.
# Either way scripts/ensure_deps.py installs only what is missing, saying first what and how much.
# A missing torch is PyTorch's CPU-only build where no NVIDIA GPU is visible: TORCH_BUILD=cuda (or cpu) decides.
VENV ?= .venv
BASE_PYTHON ?= python3
ifeq ($(origin PYTHON),undefined)
PYTHON := $(VENV)/bin/python
MAKE_VENV := $(BASE_PYTHON) scripts/ensure_venv.py $(VENV)
else
MAKE_VENV := @true
endif

.PHONY: test quickstart fashion venv

venv:
	$(MAKE_VENV)

# Sets up what is missing (fast when already set up), checks the code with ruff (pyproject.toml), then
# runs the whole test suite, one pytest worker per core (pytest-xdist). loadfile: each worker takes the next whole test file when it is
# free, longest files first (tests/conftest.py), so module fixtures are built once and the long
# multi-process tests spread over the workers (the default `load` sent them all in one worker's
# first batch, which ran 70 s past the rest).
test: venv
	$(PYTHON) scripts/ensure_deps.py requirements-test.txt
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -n auto --dist loadfile

# Sets up what is missing, then trains and compares softmax, sparsemax and entmax-1.5 over 3 seeds
# on the built-in dataset (offline, CPU); the comparison ends with what it found, in plain words.
# QUICKSTART_JOBS runs train at once (one CPU thread each on a CPU machine, one GPU each on a GPU
# machine): 3 spreads the 9 runs evenly over 2 cores (2 would leave one core idle for the last
# run); set it to your core count on a bigger machine.
QUICKSTART_JOBS ?= 3
quickstart: venv
	$(PYTHON) scripts/ensure_deps.py requirements.txt
	$(PYTHON) scripts/compare_heads.py --config configs/quickstart_compare.yaml --seeds 0 1 2 \
		--jobs $(QUICKSTART_JOBS)

# The real-data quick start, on Fashion-MNIST's 70,000 photos (docs/results.md): a short run of the recipe
# (configs/fashion_mnist.yaml: FASHION_EPOCHS of its schedule, 2 min (AVX-512) to 5 min (AVX2) each on 2
# cores), that model's features, then softmax, sparsemax and entmax-1.5 on them until each verdict is
# settled, ending with the plain-words summary. The data: Debian's dataset-fashion-mnist where installed, else datasets/ (downloaded
# there when the machine is online; offline, one line says where to put the four files). Each step resumes
# where a kill left it: run the same command again.
FASHION_EPOCHS ?= 5
# the probes on the features: no pixel augmentation (features have none), no label smoothing (it keeps every
# class in a sparse head's support), 10 epochs (each probe trains in seconds)
FASHION_PROBE ?= data.hflip=0 data.crop_padding=0 data.reprob=0 data.label_smoothing=0 optim.epochs=10
FASHION_RUN ?= runs/fashion_mnist_e$(FASHION_EPOCHS)
fashion: venv
	$(PYTHON) scripts/ensure_deps.py requirements.txt
	$(PYTHON) train.py --config configs/fashion_mnist.yaml optim.epochs=$(FASHION_EPOCHS) \
		train.output_dir=$(FASHION_RUN) --resume auto
	$(PYTHON) scripts/extract_features.py --checkpoint $(FASHION_RUN) --output features/fashion_mnist_e$(FASHION_EPOCHS)
	$(PYTHON) scripts/compare_heads.py --config configs/fashion_mnist.yaml --features features/fashion_mnist_e$(FASHION_EPOCHS) \
		--heads softmax sparsemax entmax15 --until-settled --runs-dir runs/compare/fashion_mnist_e$(FASHION_EPOCHS) \
		$(FASHION_PROBE)
