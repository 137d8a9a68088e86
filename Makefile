# Two entry points do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# Where the demo writes its runs and report.
DEMO_DIR ?= runs/demo

.PHONY: install demo test lint format clean

$(INSTALLED): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

install: $(INSTALLED)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: lint
	$(VENV)/bin/pytest

demo: install
	$(PY) -m mnist.train --output_dir $(DEMO_DIR)/mnist --epochs 3
	$(PY) -m mnist.train_lightning --output_dir $(DEMO_DIR)/mnist_lightning --epochs 3

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
