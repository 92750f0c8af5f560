# kiln developer entry points. Each target creates the local venv from pyproject.toml first,
# installing only what it needs: the demo kiln itself plus onnxruntime (the `demo` extra), the
# tests and the linter the `test` extra (torch, hypothesis, ruff...), on top of it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.demo-stamp
TEST_STAMP := $(VENV)/.test-stamp

.PHONY: demo test lint bench clean venv

venv: $(TEST_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(DEMO_STAMP): pyproject.toml $(VENV)/bin/python
	$(PY) -m pip install -q -e ".[demo]"
	touch $(DEMO_STAMP)

$(TEST_STAMP): pyproject.toml $(VENV)/bin/python
	$(PY) -m pip install -q -e ".[test]"
	touch $(TEST_STAMP)

## Compile and run the bundled demo model, check it against numpy, print its speed.
demo: $(DEMO_STAMP)
	$(PY) examples/demo.py

## Lint, then the whole test suite on both cores; the operator tests run on OpenCL (PoCL)
## too, every case compared with the CPU's result, and are compiled for CUDA by NVRTC
## (kiln.testing.gpu_testing).
test: $(TEST_STAMP)
	$(PY) -m ruff check kiln tests benchmarks examples
	$(PY) -m pytest -n 2 tests --ignore=tests/op
	KILN_TEST_TARGETS=c,opencl,nvrtc $(PY) -m pytest -n 2 tests/op

lint: $(TEST_STAMP)
	$(PY) -m ruff check kiln tests benchmarks examples

bench: $(TEST_STAMP)
	$(PY) benchmarks/ops.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
