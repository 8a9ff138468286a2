# make demo: run the main pipeline on an embedded Temporal dev server.
# make test: lint, type-check, check the import layers, run the test suite.
# Both create .venv and install what they need on first use (Python 3.11 and make are all it takes).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint unit bench native clean

$(STAMP): pyproject.toml
	@echo "first run: installing gangflow and its dependencies into $(VENV) (torch is most of it)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check --progress-bar off -e ".[all,dev]"
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gangflow demo

lint: $(STAMP)
	$(VENV)/bin/ruff check engine workflows plugins examples tests
	$(VENV)/bin/mypy engine workflows plugins
	$(VENV)/bin/lint-imports

unit: $(STAMP)
	$(PY) -m pytest -q

test: lint unit

bench: $(STAMP)
	$(PY) tests/perf/bench_orchestration.py

# the policy's hot modules compiled with mypyc (engine/scheduling/native.py): the same decisions, less CPU per
# event; needs a C compiler, about 3 minutes; used while the sources match it, ignored (with a warning) after an edit
native: $(STAMP)
	$(PY) -c 'from engine.scheduling import native; print("compiled policy built in", native.build())'

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .gangflow build
