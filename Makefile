# Two commands do all the set-up on a fresh machine:
#   make demo   export the built-in TinyGPT, run it in ONNX Runtime, verify it against eager
#   make test   run the test suite
# Both create .venv and install fx2onnx with its pinned torch on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-nightly lint bench

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fx2onnx demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The property-based tests with many more, randomised, examples (FX2ONNX_NIGHTLY=1), and their statistics.
test-nightly: $(STAMP)
	FX2ONNX_NIGHTLY=1 $(BIN)/python -m pytest -q --hypothesis-show-statistics

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/export_speed.py
