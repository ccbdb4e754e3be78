# Fresh machine: `make demo` or `make test` set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The local CPU build; elsewhere pass TORCH_SPEC=torch (or any pin) to use another.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup demo test durations coverage lint docs browser runtime-wheel clean bench-gpu bench-cpu bench-scripts bench-acceptance bench-prepare

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

# The README's "A real before/after" shows this command and what it prints
# (tests/test_readme.py checks that the two name the same command).
demo: setup
	$(BIN)/perfmod apply fixtures/scripts/seed_latentwire.py --dry-run; \
	  status=$$?; [ $$status -le 1 ] || exit $$status
	$(BIN)/perfmod check fixtures/scripts/seed_latentwire.py; \
	  echo "perfmod check exit status: $$? (1: fixes pending at level safe)"

# Two pytest processes, one per core of a 2-core machine (tests/parallel.py; TEST_PROCESSES=1
# for one), sharing the tests out.
TEST_PROCESSES ?= 2
test: setup lint
	$(BIN)/python -m tests.parallel -n $(TEST_PROCESSES) -q $(PYTEST_ARGS)

# The suite as `make test` runs it, rewriting tests/durations.json (what the longer tests
# take, so that none that would end after the others is claimed last) when every test passes.
durations: setup
	$(BIN)/python -m tests.parallel -n $(TEST_PROCESSES) -q --record-durations $(PYTEST_ARGS)

# The same suite under coverage, one combined report. Python 3.11's line tracer nearly
# doubles the CPU time of the in-process tests, so it is not part of `make test`.
coverage: setup
	$(BIN)/python -m tests.parallel -n $(TEST_PROCESSES) -q --cov=codemod --cov=runtime $(PYTEST_ARGS)

# The project's own lint and format check (configured in pyproject.toml).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Chromium for tests/test_report_browser.py: Debian's package, installed where
# apt-get runs as root (about 40 s on a fresh Debian 12 machine); elsewhere a
# note, never a failure, and the test skips with its reason.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
	  echo "browser: $$(command -v chromium || command -v chromium-browser)"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) \
	    || echo "warning: could not install chromium; tests/test_report_browser.py will be skipped"; \
	else \
	  echo "note: no apt-get as root here; install Chromium to run tests/test_report_browser.py (skipped otherwise)"; \
	fi

# Benchmarks (BENCHMARKS.md). bench-gpu is for the lent GPU machine (one H200, 15 minutes
# in all) that has torch and triton but no libcst and no network: it needs no venv (the
# venv's python where there is one, else python3) and nothing but committed files, and
# finishes within its 480 s default budget. BENCH_ARGS passes options, e.g.
# BENCH_ARGS="--only scripts" or "--budget 300" (python -m benchmarks.bench_gpu --help).
BENCH_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
BENCH_ARGS ?=

bench-gpu:
	$(BENCH_PYTHON) -m benchmarks.bench_gpu --device cuda $(BENCH_ARGS)

# The same benchmarks on the CPU at small sizes (a few minutes): a check that all of them run.
bench-cpu: setup
	$(BIN)/python -m benchmarks.bench_gpu --device cpu $(BENCH_ARGS)

# The CPU table of BENCHMARKS.md: the three seed-style scripts, original, rewrite and hand-optimized.
bench-scripts: setup
	$(BIN)/python -m benchmarks.bench_scripts --device cpu $(BENCH_ARGS)

# The acceptance scripts (fixtures/acceptance/) at every level against the experts' versions, on the CPU.
bench-acceptance: setup
	$(BIN)/python -m benchmarks.acceptance --device cpu $(BENCH_ARGS)

# Rewrite the benchmark scripts (and the acceptance scripts) again with the current rules
# (needs libcst); commit the result.
bench-prepare: setup
	$(BIN)/python -m benchmarks.bench_scripts prepare

# The rule pages, and codemod/rule_catalogue.py (the rules' codes, names and levels for the
# command line to use without importing the rules; tests/test_startup.py fails when it is stale).
docs: setup
	$(BIN)/python -m codemod.docs docs/rules
	$(BIN)/python -m codemod.catalogue

# perfmod-runtime: the `runtime` package alone (torch its only dependency), for
# machines that only run rewritten code; see packaging/runtime/pyproject.toml.
runtime-wheel: setup
	$(BIN)/python -m pip wheel --no-deps --no-build-isolation -w dist packaging/runtime

clean:
	rm -rf $(VENV) .pytest_cache .coverage htmlcov .perfmod_cache dist
