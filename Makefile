# gpufed developer entry points. The README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install binaries lint fmt unit integration e2e protos crds clean

demo: install  ## bring up the local sandbox with the example fleet and run the demo
	$(BIN)/gpufed local build --skip-kueue  # the demo runs no peer: Kueue is the benchmarks'
	$(BIN)/gpufed demo

test:  ## everything CI runs: setup, binaries, lint, unit, integration and e2e tests
	./scripts/test.sh

install:  ## create or update the virtual environment at .venv/ (editable, strict link tree)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --disable-pip-version-check -q -e '.[dev]' --config-settings editable_mode=strict

binaries: install  ## build the pinned control-plane binaries into ~/.cache/gpufed (skipped when present)
	$(BIN)/gpufed local build

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p gpufed.api -p gpufed.placement -p gpufed.sync -p gpufed.hub -p gpufed.agent -p gpufed.sandbox -p gpufed.console -p gpufed.cli
	$(BIN)/mypy tests/unit/hub/fakes.py tests/unit/hub/term.py  # the fakes satisfy the hub's ports
	$(BIN)/lint-imports

fmt: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

unit: install
	$(BIN)/pytest tests/unit

integration: binaries
	$(BIN)/pytest tests/integration

e2e: binaries
	$(BIN)/pytest tests/e2e

crds: install  ## regenerate manifests/crds/ and charts/gpufed-hub/crds/ from the pydantic models in api/
	$(BIN)/python scripts/gen_crds.py

clean:
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache
