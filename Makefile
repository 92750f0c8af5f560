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
	@# Debian's PoCL (LLVM 15) beside the wheels' PoCL 3.0 (LLVM 14), which builds no kernel on
	@# a CPU its LLVM does not know (an AMD family 1Ah host: "unknown target CPU 'generic'");
	@# kiln takes the first OpenCL device that builds one. Only as root with apt-get.
	@if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    ! dpkg-query -W -f='$${Status}' pocl-opencl-icd 2>/dev/null | grep -q "ok installed"; \
	    then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q pocl-opencl-icd >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q pocl-opencl-icd >/dev/null; } || \
	  echo "warning: could not install pocl-opencl-icd; OpenCL runs on the wheels' PoCL" >&2; \
	fi
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
