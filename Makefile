# Two entry points for a fresh clone: `make demo` (the main job, embedded) and `make test`.
# Both build .venv from the repo's own files first (CPU torch from the local disk, never a CUDA build).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml scripts/install.sh
	PY=$(PY) VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/bridge-rl demo

# Whole modules over TEST_WORKERS processes (a module's services start once, in one worker; the modules that run a
# whole stack one after another: tests/conftest.py), in collection order, not xdist's most-tests-first.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not heavy" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

.PHONY: install demo test test-all lint
