# One entry point for every job: `make demo` and `make test` set themselves up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The real agent clients (Codex CLI, Claude Code), pinned in clients/package.json and its lock.
CLIENTS_STAMP := clients/node_modules/.installed

.PHONY: system-deps venv clients corpus test check static fmt lint types serve demo test-vllm bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[evalkit,dev]'
	touch $(STAMP)

# redis-server, chromium, promtool, tinyproxy, wrk, Node.js: installed when missing (as root or
# with sudo -n), else one line each saying how. Instant when all are there.
system-deps:
	scripts/system-deps

clients: $(CLIENTS_STAMP)

$(CLIENTS_STAMP): clients/package.json clients/package-lock.json | system-deps
	cd clients && npm ci --no-audit --no-fund
	touch $(CLIENTS_STAMP)

# The Berkeley Function Calling Leaderboard's wheel: thousands of real tool declarations, read by
# tests/proxy/guard/test_dialect_corpus.py straight from the wheel (neither installed nor unpacked,
# no dependencies). Pinned; instant once downloaded.
BFCL_WHEEL := .cache/corpus/bfcl_eval-2026.3.23-py3-none-any.whl

corpus: $(BFCL_WHEEL)

$(BFCL_WHEEL): | venv
	$(BIN)/pip download -q --no-deps --only-binary=:all: -d .cache/corpus bfcl-eval==2026.3.23

# `make test COVERAGE=1` adds branch coverage (what `make check` and CI run); HYPOTHESIS_SEED=N
# replays the property tests of a run that printed that seed (.ci/run does).
PYTEST_OPTIONS := $(if $(COVERAGE),--cov --cov-report=term:skip-covered) \
	$(if $(HYPOTHESIS_SEED),--hypothesis-seed=$(HYPOTHESIS_SEED))

test: system-deps venv clients corpus
	$(BIN)/pytest -m "not vllm" $(PYTEST_OPTIONS)

# Format check, lint and strict types: the first half of `make check`.
static: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

check: static
	$(MAKE) test COVERAGE=1

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

serve: venv
	$(BIN)/toolsentry serve

demo: venv
	$(BIN)/evalkit replay --domain retail --out runs/demo

# Proxy overhead against direct access, bare pass-throughs and LiteLLM (needs wrk), the
# validator comparison, then evalkit replay's episodes per second with and without the proxy;
# bench.overhead and bench.evalkit write their sections of bench/RESULTS.md.
bench: venv
	$(BIN)/python -m bench.overhead
	$(BIN)/python -m bench.validate
	$(BIN)/python -m bench.evalkit

test-vllm: venv
	$(BIN)/pytest -m vllm tests/live

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
