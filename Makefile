# make demo: set up .venv (runtime deps only) and diagnose a built-in synthetic hang.
# make test: set up .venv with the [torch,test] extras and run the whole test suite.
PY ?= python3
VENV ?= .venv
PIP := $(VENV)/bin/pip
CONSTRAINTS := requirements/constraints.txt

.PHONY: demo test bench venv clean

$(VENV)/.base: pyproject.toml $(CONSTRAINTS)
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(CONSTRAINTS) -e .
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[torch,test]'
	touch $@

venv: $(VENV)/.dev

demo: $(VENV)/.base
	$(VENV)/bin/rankscope demo

test: $(VENV)/.dev
	$(VENV)/bin/python -m pytest -q

bench: $(VENV)/.dev
	$(VENV)/bin/python benchmarks/bench_hang.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
