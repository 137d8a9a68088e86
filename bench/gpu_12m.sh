#!/usr/bin/env bash
# GPT-2 117M on 12M tokens on one GPU, plus a short speed ablation, as one table.
#
#   bash bench/make_wheelhouse.sh          # once, on a machine with PyPI: bench/wheels/
#   bash bench/gpu_12m.sh [--corpus data/WebOfScience.zip] [--output_dir runs/bench_gpu_12m]
#   bash bench/gpu_12m.sh --dry-run        # (or DRY_RUN=1) tiny model on CPU, a minute or two
#
# Made for a GPU machine without network that has PyTorch, accelerate and tokenizers but not
# this repo's other packages: it installs bench/wheels/ (datasets, transformers) with
# --no-index, then
#   1. corpus: the given one, else the docstrings of the installed Python packages (real
#      English, bench/docstring_corpus.py), since a fresh machine has no Web of Science copy;
#   2. tokenizer: byte-level BPE, 32,768 tokens, trained on that corpus;
#   3. packed blocks: exactly 12,000,000 training tokens (the corpus repeated if smaller);
#   4. runs (bench/gpu_ablation.py): the shipped pretrain/configs/gpt2_117m.yaml on the whole
#      budget, then one-lever variants for a few dozen steps each; prints the table.
# The table goes to <output_dir>/runs/table.md, each stage's seconds to <output_dir>/stages.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=${DRY_RUN:-0}
CORPUS=""
OUTPUT_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --corpus) CORPUS=$2; shift ;;
    --output_dir) OUTPUT_DIR=$2; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$DRY_RUN" = 1 ]; then
  OUTPUT_DIR=${OUTPUT_DIR:-runs/bench_gpu_12m_dry_run}
  CORPUS_MB=2; VOCAB_SIZE=1024; TRAIN_TOKENS=4096; ABLATION_STEPS=2; MODE="dry run (CPU, tiny)"
else
  OUTPUT_DIR=${OUTPUT_DIR:-runs/bench_gpu_12m}
  CORPUS_MB=60; VOCAB_SIZE=32768; TRAIN_TOKENS=12000000; ABLATION_STEPS=40; MODE="GPU"
fi
# The repo's virtual environment where there is one (CPU machines), else the system Python.
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Nothing may reach the network: every library reads local files only.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

mkdir -p "$OUTPUT_DIR"
STAGES="$OUTPUT_DIR/stages.txt"
: > "$STAGES"
seconds_since() {  # seconds_since START_NS: elapsed seconds, one decimal
  awk -v start="$1" -v now="$(date +%s%N)" 'BEGIN { printf "%.1f", (now - start) / 1e9 }'
}
BENCH_START=$(date +%s%N)
stage() {  # stage NAME COMMAND...: run it, append its seconds to stages.txt, pass its status on
  local name=$1; shift
  local start status=0; start=$(date +%s%N)
  echo "== $name: $*" >&2
  "$@" || status=$?
  printf '%-10s %7s s\n' "$name" "$(seconds_since "$start")" >> "$STAGES"
  return "$status"
}

install_wheels() {
  if ! ls bench/wheels/*.whl > /dev/null 2>&1; then
    "$PYTHON" -c "import datasets, transformers" 2> /dev/null && return 0
    echo "error: datasets/transformers missing and no bench/wheels/; run bench/make_wheelhouse.sh" \
      "on a machine with PyPI and carry bench/wheels/ along" >&2
    exit 2
  fi
  "$PYTHON" - <<'PY'
import sys
import pyarrow
if int(pyarrow.__version__.split(".")[0]) < 24:
    sys.exit(f"error: datasets needs pyarrow >= 24, this machine has {pyarrow.__version__}; "
             "add its wheel to bench/wheels/ (pip download pyarrow==26.0.1 ...)")
PY
  "$PYTHON" -m pip install --quiet --no-index --find-links bench/wheels \
    "$(grep -E '^datasets==' requirements.txt)" "$(grep -E '^transformers==' requirements.txt)"
}

stage setup install_wheels
"$PYTHON" - <<'PY'
import torch, transformers, datasets, accelerate
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, datasets "
      f"{datasets.__version__}, accelerate {accelerate.__version__}; {gpu}")
PY

if [ -n "$CORPUS" ]; then
  CORPUS_PATH=$CORPUS
else
  stage corpus "$PYTHON" bench/docstring_corpus.py --output_dir "$OUTPUT_DIR/corpus" \
    --max_megabytes "$CORPUS_MB" --num_proc "$(nproc)"
  CORPUS_PATH="$OUTPUT_DIR/corpus/docstrings.txt"
fi
stage tokenizer "$PYTHON" -m tokenizer.train --corpus "$CORPUS_PATH" \
  --output_dir "$OUTPUT_DIR/tokenizer" --vocab_size "$VOCAB_SIZE" --overwrite
stage blocks "$PYTHON" -m pretrain.blocks.prepare --corpus "$CORPUS_PATH" \
  --tokenizer_dir "$OUTPUT_DIR/tokenizer" --cache_dir "$OUTPUT_DIR/cache" \
  --max_train_tokens "$TRAIN_TOKENS" --repeat_corpus
DRY_RUN_FLAG=()
[ "$DRY_RUN" = 1 ] && DRY_RUN_FLAG=(--dry_run)
rm -rf "$OUTPUT_DIR/runs"
echo "== $MODE, $(date -u +%Y-%m-%d), corpus $CORPUS_PATH" >&2
# A failed variant shows in the table; the script still reports the stages, then fails.
RUNS_STATUS=0
stage runs "$PYTHON" bench/gpu_ablation.py --corpus "$CORPUS_PATH" \
  --tokenizer_dir "$OUTPUT_DIR/tokenizer" --cache_dir "$OUTPUT_DIR/cache" \
  --output_dir "$OUTPUT_DIR/runs" --max_train_tokens "$TRAIN_TOKENS" \
  --ablation_steps "$ABLATION_STEPS" "${DRY_RUN_FLAG[@]}" || RUNS_STATUS=$?

printf '%-10s %7s s\n' total "$(seconds_since "$BENCH_START")" >> "$STAGES"
echo
cat "$STAGES"
exit "$RUNS_STATUS"
