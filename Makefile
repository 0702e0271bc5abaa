# trainstack developer workflow. Quick start: `make preview`, then `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STACK  ?= dev
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup preview test lint typecheck unit faults goldens bench-runtime bench-preview clean \
	e2e-tools e2e bench-scheduling

# Reinstall only when the dependency declarations change.
$(STAMP): pyproject.toml images/runtime/pyproject.toml images/prewarm/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]' -e images/runtime -e images/prewarm
	touch $@

setup: $(STAMP)

preview: setup
	$(BIN)/trainstack preview $(STACK)

test: setup lint typecheck unit

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest -q

faults: setup
	$(BIN)/pytest -q -m faults

goldens: setup
	TRAINSTACK_UPDATE_GOLDENS=1 $(BIN)/pytest -q tests/test_goldens.py

bench-runtime: setup
	$(BIN)/python -m trainstack_runtime.bench

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache

# Offline preview at organisation scale vs. the mock engine's floor (docs/diff.md); last line JSON.
bench-preview: setup
	$(BIN)/python -m trainstack.bench.preview

# The real control plane (docs/testing.md): kube-apiserver, etcd, Volcano, kwok, actionlint,
# built from pinned Go modules into ~/.cache/trainstack/e2e (TRAINSTACK_E2E_CACHE); warm: a no-op.
e2e-tools: setup
	$(BIN)/python -m tests.e2e.toolchain build

# Scenario tests on that control plane; last line: one JSON object of outcome counts.
e2e: e2e-tools
	$(BIN)/python -m tests.e2e.run $(E2E_FLAGS) -q

# Volcano with the generated configuration vs. its default, on a simulated organisation.
bench-scheduling: e2e-tools
	$(BIN)/python -m tests.e2e.bench_scheduling
