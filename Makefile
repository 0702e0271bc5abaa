# trainstack developer workflow. Quick start: `make preview`, then `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STACK  ?= dev
STAMP  := $(VENV)/.installed-stamp
PREVIEW_STAMP := $(VENV)/.preview-stamp
# torch for the runtime's tests: the version pyproject.toml's `torch` extra pins, from PyPI by
# default. Where PyTorch's own index is reachable, TORCH_INDEX_URL=https://download.pytorch.org/
# whl/cpu takes its CPU build instead of PyPI's larger Linux wheel. Not the default: where that
# index is unreachable (CI here) pip spends minutes retrying it for every dependency.
TORCH_INDEX_URL ?=
# The security scanner (checkov) that `make test` runs over every generated object
# (tests/conformance/test_security_scan.py): its version and whole dependency tree are pinned in
# CHECKOV_CONSTRAINTS, installed into a venv of its own outside .venv (its ~100 packages would
# clash with the project's) at TRAINSTACK_CHECKOV_HOME, exported: the test looks there too.
CHECKOV_CONSTRAINTS := tests/conformance/checkov-constraints.txt
CHECKOV_VERSION := $(shell sed -n 's/^checkov==//p' $(CHECKOV_CONSTRAINTS))
TRAINSTACK_CHECKOV_HOME ?= $(HOME)/.cache/trainstack/checkov-$(CHECKOV_VERSION)
export TRAINSTACK_CHECKOV_HOME
# Stamps are named by the pins' content, not dated: a clean clone's files are newer than any
# stamp, so a dated stamp reinstalled both venvs on every CI run (a minute or more) although
# nothing had changed. Another content: another stamp, a fresh venv.
pins_hash = $(shell sha256sum $(1) | cut -c1-16)
CHECKOV_STAMP := $(TRAINSTACK_CHECKOV_HOME)/.installed-$(call pins_hash,$(CHECKOV_CONSTRAINTS))
# The MLflow tracking server that tests/runtime/test_registry.py and test_handoff.py register
# models in (the runtime's registry client, registry.py): mlflow-skinny and the server's
# dependencies, the whole tree pinned in MLFLOW_CONSTRAINTS, installed into a venv of its own
# outside .venv (it would clash with the project's) at TRAINSTACK_MLFLOW_HOME, exported: the
# tests look there too. ~275 MB, ~30 s cold.
MLFLOW_CONSTRAINTS := tests/runtime/mlflow-constraints.txt
MLFLOW_VERSION := $(shell sed -n 's/^mlflow-skinny==//p' $(MLFLOW_CONSTRAINTS))
TRAINSTACK_MLFLOW_HOME ?= $(HOME)/.cache/trainstack/mlflow-$(MLFLOW_VERSION)
export TRAINSTACK_MLFLOW_HOME
MLFLOW_STAMP := $(TRAINSTACK_MLFLOW_HOME)/.installed-$(call pins_hash,$(MLFLOW_CONSTRAINTS))

.PHONY: setup preview test lint typecheck unit faults goldens bench-runtime bench-preview clean \
	e2e-tools e2e bench-scheduling fuzz policy-config help setup-preview packaging bench-prewarm \
	mutation scan-tools mlflow-server log-tools

# `make` alone lists the targets: each described by the `## ` line right above its rule.
.DEFAULT_GOAL := help
## list these targets with what each does
help:
	@echo 'usage: make TARGET [STACK=dev]'
	@awk '/^## /{d=substr($$0,4); next} d && /^[a-z][-a-z0-9]*:/{sub(/:.*/,""); printf "  %-17s %s\n",$$0,d} {d=""}' $(firstword $(MAKEFILE_LIST))

# The Pulumi project's environment, as `pulumi install` makes it (requirements.txt): the platform
# alone, no torch, no development tools. Reinstall only when the dependency declarations change.
$(PREVIEW_STAMP): pyproject.toml requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	touch $@

# Development: the project's environment plus the tools, torch and the images' packages.
$(STAMP): $(PREVIEW_STAMP) images/runtime/pyproject.toml images/prewarm/pyproject.toml \
		images/deadlines/pyproject.toml images/health/pyproject.toml
	$(BIN)/python -m pip install -q $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL)) \
		"$$($(BIN)/python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["torch"][0])')"
	$(BIN)/python -m pip install -q -e '.[dev]' -e images/runtime -e images/prewarm \
		-e images/deadlines -e images/health
	# The CSI spec's modules for the cache agent, from its Go module (sha256-pinned, cached).
	$(BIN)/python -m trainstack_prewarm.csi_proto
	touch $@

## create .venv with the platform only: what `make preview` needs
setup-preview: $(PREVIEW_STAMP)

## create .venv and install (again when a pyproject changes)
setup: $(STAMP)

## offline plan of STACK (default dev) into build/STACK/
preview: $(PREVIEW_STAMP)
	$(BIN)/trainstack preview $(STACK)

## lint, typecheck and unit: what CI runs
test: setup lint typecheck unit

## ruff check and ruff format --check
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy's incremental cache outside the clone, as the tools' caches: a clean clone (CI) checked
# all 244 files in 77 s with an empty .mypy_cache, 5 s with this one. mypy checks each entry
# against its source file and its own version and options, and reports a module's errors again
# on every run; a cache made in another checkout is what its docs' "remote cache" section
# builds on (mypy docs, additional_features "Using a remote cache to speed up mypy runs").
# Always the whole file set (pyproject.toml's [tool.mypy] files), never a subset, so mypy
# issue 9554 (a dependency checked alone first) cannot hide an error.
MYPY_CACHE_DIR ?= $(HOME)/.cache/trainstack/mypy
## mypy --strict
typecheck: setup
	$(BIN)/mypy --cache-dir $(MYPY_CACHE_DIR)

# Two workers on the 2-core machines (pytest-xdist): the runtime's torchrun tests and the rest
# overlap, ~6 minutes instead of ~9 (docs/testing.md, "CI's time budget"). PYTEST_WORKERS=0
# runs in one process; a plain `pytest` runs in one too. `--dist worksteal`: a worker that runs
# out of tests takes the other's pending ones, so the long torchrun tests do not leave one core
# idle at the end (11m27s instead of 12m09s on 2026-12-07).
PYTEST_WORKERS ?= 2
## the test suite (pytest; e2e scenarios deselected)
unit: setup scan-tools mlflow-server log-tools
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# A fresh venv whenever the constraints change, so nothing of an earlier install lingers; never
# one over a folder that is not a venv (TRAINSTACK_CHECKOV_HOME set by mistake).
$(CHECKOV_STAMP):
	@test ! -e $(TRAINSTACK_CHECKOV_HOME) || test -f $(TRAINSTACK_CHECKOV_HOME)/pyvenv.cfg || \
		{ echo "$(TRAINSTACK_CHECKOV_HOME) is not a venv: not replacing it" >&2; exit 1; }
	$(PYTHON) -m venv --clear $(TRAINSTACK_CHECKOV_HOME)
	$(TRAINSTACK_CHECKOV_HOME)/bin/python -m pip install -q "checkov==$(CHECKOV_VERSION)" \
		--constraint $(CHECKOV_CONSTRAINTS)
	touch $@

## install the pinned security scanner (checkov) into its own venv
scan-tools: $(CHECKOV_STAMP)

# As the scanner's: a fresh venv whenever the pins change, never over a folder that is not one.
# The file is a complete freeze, so it is both the requirements and the constraints.
$(MLFLOW_STAMP):
	@test ! -e $(TRAINSTACK_MLFLOW_HOME) || test -f $(TRAINSTACK_MLFLOW_HOME)/pyvenv.cfg || \
		{ echo "$(TRAINSTACK_MLFLOW_HOME) is not a venv: not replacing it" >&2; exit 1; }
	$(PYTHON) -m venv --clear $(TRAINSTACK_MLFLOW_HOME)
	$(TRAINSTACK_MLFLOW_HOME)/bin/python -m pip install -q -r $(MLFLOW_CONSTRAINTS)
	touch $@

## install the pinned MLflow tracking server into its own venv (the registry tests')
mlflow-server: $(MLFLOW_STAMP)

# The node log collector (docs/logs.md), one component of the e2e toolchain, built from its Go
# modules into the same cache; a no-op when cached. tests/logs/test_collector.py runs it.
## build the node log collector (OpenTelemetry Collector) from its Go modules
log-tools: setup
	$(BIN)/python -m trainstack.sandbox.toolchain build otelcol

## the training runtime's fault-injection tests only
faults: setup
	$(BIN)/pytest -q -m faults

# The wheel and the Pulumi project's environment as users install them (tests/packaging/): a few
# minutes with a warm pip cache, so not part of `make test`; CI runs it.
## build the wheel; install it, and `pulumi install`'s steps, in clean virtualenvs
packaging: setup
	$(BIN)/pytest -q -m packaging tests/packaging

# Mutation fuzzing of stack files and job specs (tests/fuzz/README.md). `make test` runs a fixed,
# derandomized budget; this runs ten times more from a random seed (FUZZ_SEED=N repeats a run).
## 10x make test's fuzzing, random seed (FUZZ_SEED=N repeats)
fuzz: setup
	seed=$${FUZZ_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "fuzz seed: $$seed (FUZZ_SEED=$$seed make fuzz repeats this run)"; \
	TRAINSTACK_FUZZ_MUTANTS=20000 TRAINSTACK_FUZZ_PREVIEWS=1000 TRAINSTACK_FUZZ_RANDOM=1 \
		$(BIN)/pytest -q --timeout=0 --hypothesis-seed=$$seed tests/fuzz

# Mutation testing (mutmut) of the core modules, each against its own test files only
# (tests/mutation/run.py, docs/testing.md): on demand, never in `make test` or CI. A seeded
# sample per module, MUTATION_SAMPLE mutants (0: all) from MUTATION_SEED; about 45 minutes on
# 2 cores. MUTATION_MODULES picks modules (scheduling rules spec render fabric).
MUTATION_SAMPLE ?= 60
MUTATION_SEED ?= 25
MUTATION_MODULES ?=
## mutation score per core module against its own tests (slow)
mutation: setup
	$(BIN)/python -m tests.mutation.run --sample $(MUTATION_SAMPLE) --seed $(MUTATION_SEED) \
		$(MUTATION_MODULES)

# The CrossGuard pack's --policy-pack-config files, policies/config/<stack>.json, from the stack
# files (docs/policies.md); `make test` fails while a checked-in one is stale.
## write the CrossGuard pack's policies/config/<stack>.json
policy-config: setup-preview
	$(BIN)/trainstack policy-config

## rewrite tests/goldens/ after a deliberate plan change
goldens: setup
	TRAINSTACK_UPDATE_GOLDENS=1 $(BIN)/pytest -q tests/test_goldens.py

# Checkpoint cost (docs/runtime.md, Benchmark): DDP and FSDP2 at ~50M and ~200M parameters on 2
# gloo workers: seconds per checkpoint with a 95 % interval (checkpoint against placebo
# windows), its upper bound / a fixed interval, async stall, sync save; last line JSON.
# BENCH_ARGS=--quick: tiny models, seconds (what tests/runtime/test_bench.py runs).
## checkpoint cost benchmark of the runtime (~40 min on 2 cores; BENCH_ARGS=--quick)
bench-runtime: setup
	$(BIN)/python -m trainstack_runtime.bench $(BENCH_ARGS)

# The dataset pre-warm at fleet scale (docs/prewarm.md, Load test): 64 simulated nodes through a
# throttling proxy in front of moto, then peak RSS of a 1M-object fetch; last line JSON.
## pre-warm load test (64 nodes, throttling proxy) and 1M-object RSS
bench-prewarm: setup
	$(BIN)/python -m tests.prewarm.bench

## remove build/ and the tools' caches
clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache

# Offline preview at organisation scale vs. the mock engine's floor, then the same stacks under
# the real `pulumi preview` on the control plane (docs/testing.md, "The preview benchmark");
# about 10 minutes warm; last line JSON. PREVIEW_FLAGS: --factor, --repeats, --no-engine, ...
# (python -m tests.e2e.bench_preview --help).
## preview time at organisation scale vs the engine's floor and vs the real engine
bench-preview: e2e-tools
	$(BIN)/python -m tests.e2e.bench_preview $(PREVIEW_FLAGS)

# The real control plane (docs/testing.md): kube-apiserver, etcd, Volcano, kwok, actionlint,
# the Pulumi CLI and its Kubernetes provider, built from pinned Go modules into
# ~/.cache/trainstack/e2e (TRAINSTACK_E2E_CACHE); cold about 35 minutes on 2 cores (all seven,
# 2026-12-04: docs/testing.md, "CI's time budget"), warm a no-op.
## build the pinned control-plane tools (cold ~35 min)
e2e-tools: setup
	$(BIN)/python -m trainstack.sandbox.toolchain build

# Scenario tests on that control plane; last line: one JSON object of outcome counts.
## scenario tests on a real control plane; last line JSON
e2e: e2e-tools
	$(BIN)/python -m tests.e2e.run $(E2E_FLAGS) -q

# Volcano with the generated configuration vs. its default, on a simulated organisation, each
# against an offline oracle. BENCH_FLAGS: --quick (32 nodes, about 4 minutes), --nodes, --jobs,
# --duration-scale, --configurations (tests/e2e/bench_scheduling.py --help).
## Volcano, generated configuration vs its default, against an oracle (1,000 nodes)
bench-scheduling: e2e-tools
	$(BIN)/python -m tests.e2e.bench_scheduling $(BENCH_FLAGS)
