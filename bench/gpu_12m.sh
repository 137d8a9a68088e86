#!/usr/bin/env bash
# GPT-2 117M on 12M tokens on one GPU, and the ablations that decide its speed defaults, as one
# table (python -m bench.gpu_ablation, whose --help says what each row changes).
#
#   bash bench/make_wheelhouse.sh       # once, on a machine with PyPI: bench/wheels/
#   bash bench/gpu_12m.sh [--corpus data/WebOfScience.zip] [--time_limit_s 330] [--rows ...]
#   bash bench/gpu_12m.sh --scale dry_run   # every row with the tiny model on CPU, minutes
#
# Made for a GPU machine without network that has PyTorch, accelerate and tokenizers but not
# this repo's other packages: it installs bench/wheels/ (datasets, transformers) with
# --no-index first. Every library reads local files only.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repo's virtual environment where there is one (CPU machines), else the system Python.
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if ls bench/wheels/*.whl > /dev/null 2>&1; then
  "$PYTHON" - <<'PY'
import sys
import pyarrow
if int(pyarrow.__version__.split(".")[0]) < 24:
    sys.exit(f"error: datasets needs pyarrow >= 24, this machine has {pyarrow.__version__}; "
             "add its wheel to bench/wheels/ (pip download pyarrow==26.0.1 ...)")
PY
  "$PYTHON" -m pip install --quiet --no-index --find-links bench/wheels \
    "$(grep -E '^datasets==' requirements.txt)" "$(grep -E '^transformers==' requirements.txt)"
elif ! "$PYTHON" -c "import datasets, transformers" 2> /dev/null; then
  echo "error: datasets/transformers missing and no bench/wheels/; run bench/make_wheelhouse.sh" \
    "on a machine with PyPI and carry bench/wheels/ along" >&2
  exit 2
fi
exec "$PYTHON" -m bench.gpu_ablation "$@"
