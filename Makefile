# trainstack developer workflow. Quick start: `make preview`, then `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STACK  ?= dev
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup preview test lint typecheck unit faults goldens bench-runtime bench-preview clean \
	e2e-tools e2e bench-scheduling fuzz policy-config

# Reinstall only when the dependency declarations change.
$(STAMP): pyproject.toml images/runtime/pyproject.toml images/prewarm/pyproject.toml \
		images/deadlines/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]' -e images/runtime -e images/prewarm \
		-e images/deadlines
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

# Mutation fuzzing of stack files and job specs (tests/fuzz/README.md). `make test` runs a fixed,
# derandomized budget; this runs ten times more from a random seed (FUZZ_SEED=N repeats a run).
fuzz: setup
	seed=$${FUZZ_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "fuzz seed: $$seed (FUZZ_SEED=$$seed make fuzz repeats this run)"; \
	TRAINSTACK_FUZZ_MUTANTS=20000 TRAINSTACK_FUZZ_PREVIEWS=1000 TRAINSTACK_FUZZ_RANDOM=1 \
		$(BIN)/pytest -q --timeout=0 --hypothesis-seed=$$seed tests/fuzz

# The CrossGuard pack's --policy-pack-config files, policies/config/<stack>.json, from the stack
# files (docs/policies.md); `make test` fails while a checked-in one is stale.
policy-config: setup
	$(BIN)/trainstack policy-config

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
# the Pulumi CLI and its Kubernetes provider, built from pinned Go modules into
# ~/.cache/trainstack/e2e (TRAINSTACK_E2E_CACHE); cold about 50 minutes, warm a no-op.
e2e-tools: setup
	$(BIN)/python -m tests.e2e.toolchain build

# Scenario tests on that control plane; last line: one JSON object of outcome counts.
e2e: e2e-tools
	$(BIN)/python -m tests.e2e.run $(E2E_FLAGS) -q

# Volcano with the generated configuration vs. its default, on a simulated organisation.
bench-scheduling: e2e-tools
	$(BIN)/python -m tests.e2e.bench_scheduling
