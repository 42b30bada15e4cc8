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

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not heavy" --durations=25

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

.PHONY: install demo test test-all lint
