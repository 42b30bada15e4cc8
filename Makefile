# Two entry points for a fresh clone: `make demo` (the main job, embedded) and `make test`.
# Both build .venv from the repo's own files first (CPU torch from the local disk, never a CUDA build).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist, a module to a worker): on 2 cores the suite leaves a third of the CPU idle while
# services start and subprocesses import, and a second worker fills it. Each worker starts its own services, so
# more workers than cores only add memory.
TEST_WORKERS ?= 2

$(STAMP): pyproject.toml scripts/install.sh
	PY=$(PY) VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/bridge-rl demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not heavy" -n $(TEST_WORKERS) --dist loadfile

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

.PHONY: install demo test test-all lint
