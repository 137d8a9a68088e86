# Two entry points do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# Where the demo writes its runs and report.
DEMO_DIR ?= runs/demo

.PHONY: install demo test test-fast lint format notebook clean

$(INSTALLED): requirements.txt requirements-dev.txt requirements-deepspeed.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-build-isolation -r requirements-deepspeed.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

install: $(INSTALLED)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: lint
	$(VENV)/bin/pytest

# The edit loop: every test but the slow, multi-process and system ones (about 1.5 minutes).
test-fast: lint
	$(VENV)/bin/pytest -m "not slow and not multiprocess and not system"

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
notebook: install
	UPDATE_NOTEBOOK=1 $(VENV)/bin/pytest -q tests/test_notebook.py::test_notebook_runs_on_embedded_digits

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
