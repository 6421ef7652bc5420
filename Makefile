# mtplab: `make run` builds the report, `make test` runs every test, `make lab` opens JupyterLab.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU build from local disk here; GPU users: make TORCH_SPEC="torch==2.13.0 --index-url ..." or TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.mtplab-installed
PORT ?= 8888

.PHONY: setup run test lab clean

$(STAMP): pyproject.toml Makefile scripts/install_browser.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[dev]"
	bash scripts/install_browser.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/python -m mtplab.report

test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q --nbval-lax notebooks/

lab: setup
	$(BIN)/jupyter lab --ip 127.0.0.1 --no-browser --notebook-dir notebooks $(if $(filter 0,$(shell id -u)),--allow-root,)

clean:
	rm -rf build
