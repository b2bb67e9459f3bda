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
.PHONY: venv demo test test-all test-long lint

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

# The whole suite on both ExecuTorch versions users have (what CI runs).
# The two runs go side by side: most of the suite waits on servers, subprocesses and
# disks, so together they take about as long as one (each has its own S3 server on
# free ports and its own loop mounts). Each run's output is kept in test-logs/ and
# printed whole when both are done, 1.5.1 first; the target fails if either failed.
TEST_LOGS := test-logs
test-all:
	$(MAKE) venv EXECUTORCH=1.5.1
	$(MAKE) venv EXECUTORCH=1.4.1
	@mkdir -p $(TEST_LOGS)
	@echo "test-all: executorch 1.5.1 and 1.4.1 side by side (logs in $(TEST_LOGS)/)"
	@$(MAKE) --no-print-directory test EXECUTORCH=1.5.1 > $(TEST_LOGS)/executorch-1.5.1.log 2>&1 & a=$$!; \
	 $(MAKE) --no-print-directory test EXECUTORCH=1.4.1 > $(TEST_LOGS)/executorch-1.4.1.log 2>&1 & b=$$!; \
	 wait $$a; ra=$$?; wait $$b; rb=$$?; \
	 echo "=== executorch 1.5.1 (exit $$ra) ==="; cat $(TEST_LOGS)/executorch-1.5.1.log; \
	 echo "=== executorch 1.4.1 (exit $$rb) ==="; cat $(TEST_LOGS)/executorch-1.4.1.log; \
	 test $$ra -eq 0 && test $$rb -eq 0

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
