# Fresh machine: `make demo` or `make test` set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The local CPU build; elsewhere pass TORCH_SPEC=torch (or any pin) to use another.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup demo test docs clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

demo: setup
	$(BIN)/perfmod apply fixtures/scripts/seed_latentwire.py --dry-run --level unsafe; \
	  status=$$?; [ $$status -le 1 ] || exit $$status
	$(BIN)/perfmod check fixtures/scripts/seed_latentwire.py; \
	  echo "perfmod check exit status: $$? (1: fixes pending at level safe)"

test: setup
	$(BIN)/python -m pytest -q --cov=codemod --cov=runtime --cov-report=term $(PYTEST_ARGS)

docs: setup
	$(BIN)/python -m codemod.docs docs/rules

clean:
	rm -rf $(VENV) .pytest_cache .coverage htmlcov
