# Developer and CI entry points. Every target sets up .venv first (quickly,
# when it is already up to date).

PYTHON ?= python3
VENV := .venv
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
.PHONY: venv demo test test-long lint

venv: $(STAMP)

# torch goes in first and on its own: once the CPU build is installed,
# nothing else can resolve a multi-GB CUDA build of torch.
$(STAMP): requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -n "$(TORCH_PIN)" || { echo "requirements-dev.txt must pin torch==..." >&2; exit 1; }
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -r requirements-dev.txt
	$(PIP) install -q -c requirements-dev.txt -e .
	touch $@

demo: venv
	$(BIN)/trtet-store bench

# pytest's own exit code is kept: 5 (no tests collected) fails like any other.
test: venv
	$(BIN)/python -m pytest -q --timeout=$(PYTEST_TIMEOUT) $(PYTEST_ARGS)

# Long fuzzing and kill variants: tests marked `slow`, which conftest.py
# skips unless TRTET_LONG=1.
test-long: venv
	TRTET_LONG=1 $(BIN)/python -m pytest -q -m slow --timeout=$(PYTEST_TIMEOUT) $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
