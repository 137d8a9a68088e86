# Two entry points do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DEV_INSTALLED := $(VENV)/.installed-dev
# `make install VENV_OPTIONS=--system-site-packages`: the venv sees the machine's own packages,
# and keeps its torch (and transformers...) when requirements.txt's ranges accept them.
VENV_OPTIONS ?=
# The fast tier against the lowest supported versions (requirements-lowest.txt), its own venv.
LOWEST_VENV ?= .venv-lowest
# Where the demo writes its runs and report.
DEMO_DIR ?= runs/demo

.PHONY: install install-dev demo test test-fast test-lowest lint format notebook clean

# What training needs (most of its size is torch's CUDA libraries); the test tools come apart.
$(INSTALLED): requirements.txt requirements-deepspeed.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV_OPTIONS) $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=77.0.3,<82"  # what every torch in range takes
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-build-isolation -r requirements-deepspeed.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

install: $(INSTALLED)

$(DEV_INSTALLED): $(INSTALLED) requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

install-dev: $(DEV_INSTALLED)

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: install-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: lint
	$(VENV)/bin/pytest

# The edit loop: every test but the slow, multi-process and system ones (about 1.5 minutes).
test-fast: lint
	$(VENV)/bin/pytest -m "not slow and not multiprocess and not system"

# The lowest versions go in first; the usual install then keeps them (its ranges accept them) and
# adds the rest, as it keeps a cluster's torch: it fails if the install replaced one of them.
test-lowest:
	test -x $(LOWEST_VENV)/bin/python || $(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install --quiet -r requirements-lowest.txt
	$(MAKE) install-dev VENV=$(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -c "import sys; from importlib.metadata import version; \
		pins = [line.strip().split('==') for line in open('requirements-lowest.txt') if '==' in line]; \
		changed = [f'{name} {version(name)}' for name, pin in pins if version(name) != pin]; \
		sys.exit(f'error: make install replaced the lowest versions: {changed}' if changed else 0)"
	$(LOWEST_VENV)/bin/pytest -p no:cacheprovider -m "not slow and not multiprocess and not system"

demo: install
	$(BIN)/write-demo-corpus --output_dir $(DEMO_DIR)/corpus --overwrite
	$(BIN)/train-tokenizer --corpus $(DEMO_DIR)/corpus --output_dir $(DEMO_DIR)/tokenizer \
		--vocab_size 2048 --overwrite
	rm -rf $(DEMO_DIR)/gpt2_tiny
	$(PY) pretrain/run.py --config pretrain/configs/tiny.yaml --corpus $(DEMO_DIR)/corpus \
		--tokenizer_dir $(DEMO_DIR)/tokenizer --cache_dir $(DEMO_DIR)/cache \
		--output_dir $(DEMO_DIR)/gpt2_tiny
	$(BIN)/generate-text $(DEMO_DIR)/gpt2_tiny --prompt "The for statement"
	OMP_NUM_THREADS=1 $(BIN)/train-mnist --output_dir $(DEMO_DIR)/mnist --overwrite
	OMP_NUM_THREADS=1 $(BIN)/train-mnist-lightning --output_dir $(DEMO_DIR)/mnist_lightning \
		--overwrite
	$(BIN)/run-report $(DEMO_DIR)/gpt2_tiny $(DEMO_DIR)/mnist $(DEMO_DIR)/mnist_lightning \
		--out $(DEMO_DIR)/report --overwrite

# Run notebooks/lenet5.ipynb as its test does (one epoch) and save it with its outputs: commit
# the result. tests/test_notebook.py fails while the saved outputs are older than the code.
notebook: install-dev
	UPDATE_NOTEBOOK=1 $(VENV)/bin/pytest -q tests/test_notebook.py::test_notebook_runs_on_embedded_digits

clean:
	rm -rf $(VENV) $(LOWEST_VENV) runs .pytest_cache .ruff_cache
