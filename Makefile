# The two commands a newcomer runs: `make demo` and `make test`.
# Each bootstraps .venv (python3 -m venv + pip install -e '.[dev]') on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export GLOG_v ?= 3

.PHONY: demo test lint bench conformance docs venv clean-venv sysdeps

venv: $(STAMP)

# mindone and MindOCR (tests/trainers, tests/conformance) go in without their declared
# dependencies (transformers, opencv, pillow<=9.5...): the modules the tests use need only
# what '.[dev]' brings; MindOCR's package does not import on MindSpore 2.10 at all (its
# train-step modules are loaded as files), nor does MindAudio's (its __init__ imports its
# data downloaders: wget...; tests/trainers/test_mindaudio.py loads its loss-scale cell's
# module as a file)
SUITES := mindone==0.5.0 mindocr==0.5.0 mindaudio==0.3.0

# MindFormers 2.1.0 (tests/trainers/test_mindformers.py) pins mindspore~=2.11.0 and
# hyper-parallel, neither on PyPI: it goes in --no-deps, with the packages its import needs,
# into a dir of its own that the test appends to sys.path, so nothing in the venv changes.
# Pinned where the newest would need NumPy 2 (pyarrow<24, pandas<3) or a huggingface_hub
# newer than mindone's (datasets<3.6)
MINDFORMERS := mindformers==2.1.0 datasets==3.5.1 pyarrow==23.0.1 pandas==2.3.3 \
	pytz==2026.6 multiprocess==0.70.19 xxhash==4.1.0 deprecated==1.3.1 wrapt==2.5.2 \
	regex==2026.12.2 jieba==0.42.1 rouge_chinese==1.0.3 tokenizers==0.23.3 \
	sentencepiece==0.2.3 tiktoken==0.14.0 mindpet==1.0.4 tensorboardX==2.6.5

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps $(SUITES)
	rm -rf $(VENV)/mindformers
	$(BIN)/python -m pip install --quiet --no-deps --target $(VENV)/mindformers $(MINDFORMERS)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/msmon demo

sysdeps:
	bash .ci/sysdeps

# Suites that check results only (no timing, liveness or overhead assertions) run beside
# the rest, at the lowest CPU priority (tests/collect among them: its overhead-budget and
# skip-page tests, which time things, live in tests/monitor and tests/viewer), in one
# pytest with two workers that take the next test as they come free (pytest-xdist,
# --dist worksteal): the rest mostly waits on pages,
# kernels and live steps (about half of two cores busy), so they fill what it leaves and
# the rest's timing checks keep the cores they need. Two fixed halves, as before, ended up
# to 4.5 minutes apart as the suites grew (the last of them ends the run). Their log is
# printed after the rest's summary; build/test-rest.status says when the rest is done
# (.ci/run starts its other jobs then), build/junit-*.xml hold each test's time.
BESIDE := tests/collect tests/conformance tests/scenarios tests/trainers tests/diagnose tests/detection
PYTEST := $(BIN)/python -m pytest -p no:cacheprovider

test: $(STAMP) sysdeps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@mkdir -p build; rm -f build/test-rest.status build/test-beside.status
	@( nice -n 19 $(PYTEST) -n 2 --dist worksteal --junitxml=build/junit-beside.xml $(BESIDE) \
	    > build/test-beside.log 2>&1; echo $$? > build/test-beside.status ) & \
	$(BIN)/python -m pytest --junitxml=build/junit-rest.xml $(addprefix --ignore=,$(BESIDE)); \
	rest=$$?; echo $$rest > build/test-rest.status; \
	wait; status=$$rest; \
	echo; echo "== beside it, at nice 19: build/test-beside.log =="; \
	cat build/test-beside.log; \
	[ "$$(cat build/test-beside.status)" = 0 ] || status=1; \
	exit $$status

# The manual as a static site in build/site/ (mkdocs.yml; strict: a broken link or anchor
# fails). A venv of its own with MkDocs alone, so a fresh clone builds it in seconds without
# MindSpore; DOCS_PIN is pyproject's docs extra (tests/readme/test_site.py checks they agree)
DOCS_VENV := .venv-docs
DOCS_PIN := mkdocs==1.6.1
DOCS_STAMP := $(DOCS_VENV)/.installed-stamp

$(DOCS_STAMP): Makefile
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet '$(DOCS_PIN)'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(DOCS_VENV)/bin/mkdocs build --strict --clean --site-dir build/site

# the randomised conformance test at length (make test draws 12 cases): 300 cases, ~6 min
conformance: $(STAMP)
	MSMON_CONFORMANCE_EXAMPLES=300 $(BIN)/python -m pytest -q tests/conformance/test_random.py

bench: $(STAMP) sysdeps
	$(BIN)/python bench/all.py; status=$$?; $(BIN)/python bench/all.py --update-docs; exit $$status

clean-venv:
	rm -rf $(VENV) $(DOCS_VENV)
