# The two commands a newcomer runs: `make demo` and `make test`.
# Each bootstraps .venv (python3 -m venv + pip install -e '.[dev]') on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export GLOG_v ?= 3

.PHONY: demo test lint bench conformance venv clean-venv sysdeps

venv: $(STAMP)

# mindone and MindOCR (tests/trainers, tests/conformance) go in without their declared
# dependencies (transformers, opencv, pillow<=9.5...): the modules the tests use need only
# what '.[dev]' brings; MindOCR's package does not import on MindSpore 2.10 at all (its
# train-step modules are loaded as files)
SUITES := mindone==0.5.0 mindocr==0.5.0

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps $(SUITES)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/msmon demo

sysdeps:
	bash .ci/sysdeps

# Suites that check results only (no timing, liveness or overhead assertions) run in a
# second pytest beside the rest, at the lowest CPU priority: the rest mostly keeps one core
# busy (tiny models, pages, kernels), so they fill the other one and the rest's timing
# checks keep the cores they need. Their log is printed after the rest's summary.
BESIDE := tests/conformance tests/trainers tests/diagnose tests/detection tests/scenarios

test: $(STAMP) sysdeps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@mkdir -p build
	@( nice -n 19 $(BIN)/python -m pytest -p no:cacheprovider $(BESIDE) \
	    > build/test-beside.log 2>&1; echo $$? > build/test-beside.status ) & \
	$(BIN)/python -m pytest $(addprefix --ignore=,$(BESIDE)); rest=$$?; \
	wait; echo; echo "== beside it, at nice 19: $(BESIDE) =="; \
	cat build/test-beside.log; \
	[ $$rest = 0 ] && [ "$$(cat build/test-beside.status)" = 0 ]

# the randomised conformance test at length (make test draws 12 cases): 300 cases, ~6 min
conformance: $(STAMP)
	MSMON_CONFORMANCE_EXAMPLES=300 $(BIN)/python -m pytest -q tests/conformance/test_random.py

bench: $(STAMP) sysdeps
	$(BIN)/python bench/all.py; status=$$?; $(BIN)/python bench/all.py --update-readme; exit $$status

clean-venv:
	rm -rf $(VENV)
