# One venv, installed from this project's own files; every target installs what it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo check test bench bench-spark bench-restore bench-scale install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,service,spark]'
	touch $(STAMP)

install: $(STAMP)

## The main job, end to end on embedded defaults.
demo: $(STAMP)
	$(BIN)/purgatory demo

## The gate: format, lint, types, import contracts, the whole test suite (what CI runs).
check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest

test: check

## Benchmarks beside their baselines: the timer and the purgatory, then the service through
## Kafka beside a bare pipe and a bare hop on the same broker (FULL sizes: several minutes on
## 2 cores); writes docs/bench-results.json, the plot and docs/bench-service.json.
bench: $(STAMP)
	$(BIN)/python -m tests.benchmarks.run --service

## Journal, snapshot and restore of 100k and 1M pending operations through the real broker
## (about 4 minutes); writes docs/bench-restore.json.
bench-restore: $(STAMP)
	$(BIN)/python -m tests.benchmarks.bench_restore --out docs

## One service process against two that own disjoint partitions, and the cost of a forward
## (about 4 minutes); writes docs/bench-scale.json.
bench-scale: $(STAMP)
	$(BIN)/python -m tests.benchmarks.bench_scale --out docs

## The Spark bridge through the real broker and the service; writes docs/bench-spark.json.
bench-spark: $(STAMP)
	$(BIN)/python -m tests.benchmarks.bench_spark

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
