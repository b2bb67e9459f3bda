# Developer and CI entry points. Every target sets up .venv first (quickly,
# when it is already up to date).

PYTHON ?= python3
# The ExecuTorch the environment is built with. 1.5.1 is the default; 1.4.1 is
# what torch-tensorrt 2.14.0's [executorch] extra and its released runtime
# (torch-tensorrt-executorch-runtime 0.1.0) require. Each gets its own venv.
EXECUTORCH ?= 1.5.1
ifeq ($(EXECUTORCH),1.5.1)
VENV := .venv
else
VENV := .venv-executorch-$(EXECUTORCH)
endif
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check
# Rebuilt whenever the pinned requirements or the package metadata change.
STAMP := $(VENV)/.trtet-dev.stamp
# Taken from requirements-dev.txt so the pin lives in one place.
TORCH_PIN := $(shell grep -E '^torch==' requirements-dev.txt)
# A hung test must not eat CI's whole time budget; override for debugging.
PYTEST_TIMEOUT ?= 900
PYTEST_ARGS ?=

.DEFAULT_GOAL := test
.PHONY: venv demo test test-all lane durations test-long lint

venv: $(STAMP)

# torch goes in first and on its own: once the CPU build is installed,
# nothing else can resolve a multi-GB CUDA build of torch.
$(STAMP): requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -n "$(TORCH_PIN)" || { echo "requirements-dev.txt must pin torch==..." >&2; exit 1; }
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -r requirements-dev.txt "executorch==$(EXECUTORCH)"
	$(PIP) install -q -c requirements-dev.txt -e .
	touch $@

demo: venv
	$(BIN)/trtet-store bench

# pytest's own exit code is kept: 5 (no tests collected) fails like any other. The 25
# slowest tests are listed at the end, to keep the suite's time in check.
test: venv
	$(BIN)/python -m pytest -q --timeout=$(PYTEST_TIMEOUT) --durations=25 $(PYTEST_ARGS)

# The whole suite on both ExecuTorch versions users have (what CI runs), as two lanes
# side by side, one per version (tests/lanes.py): each lane runs every test marked
# `executorch` (given by tests/conftest.py to tests that load torch or ExecuTorch, or
# start a child that does) on its own version, and its share of the other tests, which
# do not depend on the version and so run once: split between the lanes by test file,
# balanced by the times in tests/durations.json (`make durations` refreshes it from the
# lanes' last run), each lane counted whole (its executorch part included). Lane 2 runs a
# named smoke subset of the multi-machine engine-cache families (tests/lanes.py
# SMOKE_FAMILIES), lane 1 their full form; its summary line says so.
# A lane is two pytest runs: its share of the unmarked tests first, in a process that
# never imports torch (so a test that does fails, naming the marker), then the marked
# tests. Each lane's output is kept in test-logs/ and printed whole when both are done;
# the target fails if either lane failed. A lane fails when its tests take 20% over
# their recorded time (TRTET_LANE_BUDGET=2 doubles that budget, =off drops it), or a
# test takes over 60 s of call time without being marked long_test.
TEST_LOGS := test-logs
LANE_VERSIONS := 1.5.1,1.4.1
LANE_PYTEST = $(BIN)/python -m pytest -q --timeout=$(PYTEST_TIMEOUT) --durations=15 \
	--lane=$(LANE) --lane-versions=$(LANE_VERSIONS)
# One lane (LANE=K/2 with its EXECUTORCH). A part with nothing to run (pytest's exit 5,
# e.g. under a small PYTEST_ARGS) is no failure by itself; a lane that ran no test at all
# says "no test ran", and test-all fails when both lanes say so.
lane: venv
	@test -n "$(LANE)" || { echo "lane: set LANE=K/N" >&2; exit 2; }
	@$(LANE_PYTEST) --lane-part=plain $(PYTEST_ARGS); rp=$$?; \
	 $(LANE_PYTEST) --lane-part=executorch $(PYTEST_ARGS); re=$$?; \
	 echo "lane $(LANE) (executorch $(EXECUTORCH)): unmarked part exit $$rp, executorch part exit $$re"; \
	 if [ $$rp -ne 0 ] && [ $$rp -ne 5 ]; then exit 1; fi; \
	 if [ $$re -ne 0 ] && [ $$re -ne 5 ]; then exit 1; fi; \
	 if [ $$rp -eq 5 ] && [ $$re -eq 5 ]; then echo "lane $(LANE): no test ran"; fi

test-all:
	$(MAKE) venv EXECUTORCH=1.5.1
	$(MAKE) venv EXECUTORCH=1.4.1
	@mkdir -p $(TEST_LOGS)
	@echo "test-all: lane 1 (executorch 1.5.1) and lane 2 (executorch 1.4.1) side by side (logs in $(TEST_LOGS)/)"
	@$(MAKE) --no-print-directory lane LANE=1/2 EXECUTORCH=1.5.1 > $(TEST_LOGS)/lane-1-executorch-1.5.1.log 2>&1 & a=$$!; \
	 $(MAKE) --no-print-directory lane LANE=2/2 EXECUTORCH=1.4.1 > $(TEST_LOGS)/lane-2-executorch-1.4.1.log 2>&1 & b=$$!; \
	 wait $$a; ra=$$?; wait $$b; rb=$$?; \
	 echo "=== lane 1, executorch 1.5.1 (exit $$ra) ==="; cat $(TEST_LOGS)/lane-1-executorch-1.5.1.log; \
	 echo "=== lane 2, executorch 1.4.1 (exit $$rb) ==="; cat $(TEST_LOGS)/lane-2-executorch-1.4.1.log; \
	 if grep -q '^lane 1/2: no test ran' $(TEST_LOGS)/lane-1-executorch-1.5.1.log && \
	    grep -q '^lane 2/2: no test ran' $(TEST_LOGS)/lane-2-executorch-1.4.1.log; then \
	   echo "test-all: no test ran in either lane" >&2; exit 5; fi; \
	 test $$ra -eq 0 && test $$rb -eq 0

# Refresh tests/durations.json (the lanes' split and budgets) from what the lanes last
# ran: every lane run records its per-test times in $(TEST_LOGS)/durations/ (one file a
# version and part); this merges them, keyed by version, and prints the split they give.
# So: `make test-all` (on the machine kind CI uses, with nothing else running), then
# `make durations`, and commit the file.
durations: venv
	$(BIN)/python tests/lanes.py merge $(TEST_LOGS)/durations

# Long fuzzing and kill variants: tests marked `slow`, which conftest.py
# skips unless TRTET_LONG=1.
test-long: venv
	TRTET_LONG=1 $(BIN)/python -m pytest -q -m slow --timeout=$(PYTEST_TIMEOUT) $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .

# The documentation site (mkdocs.yml, docs/) into site/, as CI builds it: --strict fails
# on a broken link or anchor and on a page left out of the navigation.
.PHONY: docs
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
