# Two commands do all the set-up on a fresh machine:
#   make demo   export the built-in TinyGPT, run it in ONNX Runtime, verify it against eager
#   make test   run the test suite
# Both create .venv and install fx2onnx with its pinned torch on first use.
# `make test-torch-latest` runs the suite in a second venv with the newest torch release (see README).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-nightly test-torch-latest lint bench

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# torchvision for the detection tests (tests/test_detection.py), outside the venv's site-packages: PyPI's wheel
# is built against the CUDA torch and its compiled operators do not load beside the CPU torch, so it goes,
# without its dependencies (it would replace torch), into a folder that only those tests put on sys.path, and
# tests/torchvision_cpu_ops.py defines its operators in PyTorch (README, "Detection models").
TORCHVISION_DIR := $(VENV)/torchvision-cpu
TORCHVISION_STAMP := $(TORCHVISION_DIR)/.installed

$(TORCHVISION_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps --target $(TORCHVISION_DIR) torchvision==0.28.0 pillow==11.3.0
	touch $(TORCHVISION_STAMP)

# timm for the benchmark's timm models (benchmarks/models.py), the same way: pinned, without its dependencies (torch,
# torchvision, huggingface_hub, safetensors and pyyaml are already there), in a folder of its own.
TIMM_DIR := $(VENV)/timm
TIMM_STAMP := $(TIMM_DIR)/.installed

$(TIMM_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps --target $(TIMM_DIR) timm==1.0.31
	touch $(TIMM_STAMP)

# diffusers for tests/test_diffusers.py and the benchmark zoo's diffusers group (benchmarks/zoo.py), the same way:
# pinned, without dependencies, in a folder of its own; with it the few of its dependencies the venv lacks
# (requests and its own, importlib_metadata, Pillow: huggingface_hub, safetensors, regex, filelock and numpy are
# there), each pinned and without theirs, so that nothing replaces torch or a pinned package of the venv.
DIFFUSERS_DIR := $(VENV)/diffusers
DIFFUSERS_STAMP := $(DIFFUSERS_DIR)/.installed

$(DIFFUSERS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps --target $(DIFFUSERS_DIR) diffusers==0.42.1 requests==2.34.2 \
		urllib3==2.8.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3 importlib-metadata==10.2.0 zipp==4.1.2 \
		pillow==11.3.0
	touch $(DIFFUSERS_STAMP)

demo: $(STAMP)
	$(BIN)/fx2onnx demo

test: $(STAMP) $(TORCHVISION_STAMP) $(DIFFUSERS_STAMP)
	$(BIN)/python -m pytest -q

# The property-based tests with many more, randomised, examples (FX2ONNX_NIGHTLY=1), and their statistics.
test-nightly: $(STAMP) $(TORCHVISION_STAMP) $(DIFFUSERS_STAMP)
	FX2ONNX_NIGHTLY=1 $(BIN)/python -m pytest -q --hypothesis-show-statistics

# The suite against the newest torch on the package index (pip's requirement in TORCH_LATEST: pass
# TORCH_LATEST=torch==2.15.0 to pin one), in its own venv: constraints.txt's pins except torch's. The venv
# is reinstalled on every run, so that it follows new releases. On Linux the PyPI wheel is the CUDA build,
# which pulls about 5.7 GB of CUDA libraries and runs on a CPU-only machine. PIP_CONSTRAINT replaces any
# constraint file of pip's own configuration (a machine's may cap torch at the release it holds).
TORCH_LATEST ?= torch
LATEST_VENV ?= .venv-torch-latest
LATEST_CONSTRAINTS := $(LATEST_VENV)/constraints-without-torch.txt

test-torch-latest:
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	grep -v '^torch==' constraints.txt > $(LATEST_CONSTRAINTS)
	PIP_CONSTRAINT=$(CURDIR)/$(LATEST_CONSTRAINTS) $(LATEST_VENV)/bin/python -m pip install --quiet --upgrade "$(TORCH_LATEST)"
	PIP_CONSTRAINT=$(CURDIR)/$(LATEST_CONSTRAINTS) $(LATEST_VENV)/bin/python -m pip install --quiet -e ".[test]"
	$(LATEST_VENV)/bin/python -c "import torch; print('torch', torch.__version__)"
	$(LATEST_VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

# Every benchmark model (groups torch.nn, transformers, torchvision, timm), 3 runs each; BENCH_ARGS adds options,
# e.g. `make bench BENCH_ARGS="--models torchvision --runs 1"` (benchmarks/README.md).
BENCH_ARGS ?=

bench: $(STAMP) $(TORCHVISION_STAMP) $(TIMM_STAMP) $(DIFFUSERS_STAMP)
	$(BIN)/python benchmarks/export_speed.py $(BENCH_ARGS)
