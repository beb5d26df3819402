# `make serve` and `make test` create .venv on first use and install everything into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; override on a CUDA machine, e.g. `make TORCH=torch==2.11.0 serve`.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: serve test lint clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/python -m sglang.launch_server $(ARGS)

test: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest -q test $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/python -m ruff check .

clean:
	rm -rf $(VENV)
