#!/usr/bin/env bash
# Download the wheels that bench/gpu_12m.sh installs on a GPU machine without network.
#
# The GPU image has torch, accelerate, tokenizers, pyarrow, pandas, tensorboard and nvidia-ml-py;
# it lacks datasets (and dill, multiprocess) and has an older transformers. These are the pins of
# requirements.txt for CPython 3.12 on x86-64 Linux (fsspec because datasets caps it). pyarrow
# (55 MB) does not travel: the image's must be >= 24, which bench/gpu_12m.sh checks first.
#
#   bash bench/make_wheelhouse.sh            # -> bench/wheels/*.whl (about 15 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
pin() {  # the version requirements.txt pins, e.g. `pin datasets` -> datasets==5.2.0
  grep -E "^$1==" requirements.txt || { echo "error: $1 is not pinned in requirements.txt" >&2; exit 2; }
}
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d bench/wheels "$(pin datasets)" "$(pin transformers)" \
  "dill==0.4.1" "multiprocess==0.70.19" "fsspec==2026.9.0"
du -sh bench/wheels
