# kiln developer entry points. Each target creates the local venv from pyproject.toml first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

## Compile and run the bundled demo model, check it against numpy, print its speed.
demo: $(STAMP)
	$(PY) examples/demo.py

## Lint, then the whole test suite on both cores; the operator tests run on OpenCL (PoCL)
## too, every case compared with the CPU's result (kiln.testing.gpu_testing).
test: $(STAMP)
	$(PY) -m ruff check kiln tests benchmarks examples
	$(PY) -m pytest -n 2 tests --ignore=tests/op
	KILN_TEST_TARGETS=c,opencl $(PY) -m pytest -n 2 tests/op

lint: $(STAMP)
	$(PY) -m ruff check kiln tests benchmarks examples

bench: $(STAMP)
	$(PY) benchmarks/ops.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
