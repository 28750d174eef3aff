# make demo: set up .venv (runtime deps only) and diagnose a built-in synthetic hang.
# make test: set up .venv with the [torch,test,ray] extras, run the gates (make lint), then the whole test suite.
# make lint: ruff check, ruff format --check, the import-layer contracts (lint-imports) and mypy.
PY ?= python3
VENV ?= .venv
PIP := $(VENV)/bin/pip
CONSTRAINTS := requirements/constraints.txt
# The package's bytecode, written once: an editable install leaves it to the first import, which writes nothing
# where PYTHONDONTWRITEBYTECODE is set (CI images, containers): every command then compiles ~300 modules (0.2-0.3 s).
COMPILE = $(VENV)/bin/python -m compileall -q -j 0 *.py $$(ls -d */__init__.py | xargs -n1 dirname | grep -vx -e tests -e benchmarks)

.PHONY: demo test lint typecheck bench venv clean

$(VENV)/.base: pyproject.toml $(CONSTRAINTS)
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(CONSTRAINTS) -e .
	$(COMPILE) >/dev/null
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[torch,test,ray]'
	touch $@

venv: $(VENV)/.dev

demo: $(VENV)/.base
	@$(COMPILE) >/dev/null
	$(VENV)/bin/rankscope demo

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(MAKE) --no-print-directory typecheck

# The repository root is the package, so mypy sees it through a link named rankscope in a scratch directory.
typecheck: $(VENV)/.dev
	@tmp=$$(mktemp -d) && ln -s "$(CURDIR)" "$$tmp/rankscope" && cd "$$tmp" && \
	  MYPYPATH="$$tmp" "$(CURDIR)/$(VENV)/bin/mypy" --config-file "$(CURDIR)/pyproject.toml" \
	    --cache-dir "$(CURDIR)/.mypy_cache" -p rankscope; \
	  rc=$$?; rm -rf "$$tmp"; exit $$rc

test: lint
	$(VENV)/bin/python -m pytest -q

bench: $(VENV)/.dev
	$(VENV)/bin/python benchmarks/bench_hang.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache build *.egg-info
