# The two commands a newcomer runs: `make demo` and `make test`.
# Each bootstraps .venv (python3 -m venv + pip install -e '.[dev]') on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export GLOG_v ?= 3

.PHONY: demo test lint bench venv clean-venv sysdeps

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/msmon demo

sysdeps:
	bash .ci/sysdeps

test: $(STAMP) sysdeps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

bench: $(STAMP) sysdeps
	$(BIN)/python bench/all.py; status=$$?; $(BIN)/python bench/all.py --update-readme; exit $$status

clean-venv:
	rm -rf $(VENV)
