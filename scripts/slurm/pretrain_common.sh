# shellcheck shell=bash
# Shared by the pretrain_*.sbatch scripts (sourced, not run): paths, GPU detection, precision,
# and the checkpoint-and-requeue handshake before the time limit.
#
# Variables (with defaults):
#   PYTHON=.venv/bin/python        interpreter with the project installed (python3 if no .venv)
#   CONFIG=pretrain/configs/gpt2_117m.yaml   Trainer YAML (model, data, optimisation)
#   OUTPUT_DIR=runs/gpt2_117m-<job id>       run folder; a requeued job keeps its id and resumes
#   MIXED_PRECISION=no             bf16 | fp16 | no; "no" lets pretrain/run.py choose from the
#                                  GPU (bf16 on Ampere and newer, fp16 before, fp32 on CPU)
#   GLOBAL_BATCH=<from CONFIG>     blocks per optimizer step over all processes; by default
#                                  the config's per_device_train_batch_size x
#                                  gradient_accumulation_steps (its recipe, written for one
#                                  process), split evenly over the processes

# sbatch runs a copy of the script from a spool folder: paths are relative to where it was
# submitted.
cd "${SLURM_SUBMIT_DIR:-.}" || exit 2
if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python3
    [[ -x .venv/bin/python ]] && PYTHON=.venv/bin/python
fi
CONFIG="${CONFIG:-pretrain/configs/gpt2_117m.yaml}"
OUTPUT_DIR="${OUTPUT_DIR:-runs/gpt2_117m-${SLURM_JOB_ID:-local}}"
MIXED_PRECISION="${MIXED_PRECISION:-no}"
# The recipe's global batch, read from the config (TrainingArguments' defaults: 8 x 1).
config_global_batch() {
    "$PYTHON" -c 'import sys, yaml
config = yaml.safe_load(open(sys.argv[1])) or {}
print(config.get("per_device_train_batch_size", 8) * config.get("gradient_accumulation_steps", 1))' "$CONFIG"
}
# srun does not inherit --cpus-per-task since Slurm 22.05.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"
# torchrun (behind `accelerate launch --multi_gpu`) forwards only these signals to the training
# processes; SIGUSR1 is the one `#SBATCH --signal` sends.
export PET_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"

# GPUs this job may use on this node: none when nvidia-smi is missing or fails (the CPU
# fallback), else those Slurm granted (CUDA_VISIBLE_DEVICES) or all that nvidia-smi lists.
gpus_on_node() {
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo 0
    elif [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
        tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .
    else
        nvidia-smi -L | grep -c '^GPU'
    fi
}

# Per-process batch for GLOBAL_BATCH blocks over $1 processes (no gradient accumulation).
per_process_batch() {
    local processes=$1
    GLOBAL_BATCH="${GLOBAL_BATCH:-$(config_global_batch)}"
    if ((GLOBAL_BATCH % processes != 0)); then
        echo "error: GLOBAL_BATCH=$GLOBAL_BATCH is not divisible by $processes processes" >&2
        exit 2
    fi
    echo $((GLOBAL_BATCH / processes))
}

# Run the training step in the background and wait for it, so that the batch shell can react
# to the signal `#SBATCH --signal=B:USR1@90` sends before the time limit: pass it on to the
# step (srun forwards it to every task), wait until the checkpoint is written, requeue the job
# (same job id, same OUTPUT_DIR) and let the next start resume from that checkpoint.
run_step_with_requeue() {
    step_pid=""
    checkpoint_at_start="$(newest_checkpoint)"
    trap checkpoint_and_requeue USR1  # before the step starts: an early signal must not kill us
    "$@" &
    step_pid=$!
    local status=0
    wait "$step_pid" || status=$?
    trap - USR1
    return "$status"
}

checkpoint_and_requeue() {
    echo "$(date +%T) time limit near: asking the training step to save a checkpoint"
    local status=0
    if [[ -n "$step_pid" ]]; then
        kill -USR1 "$step_pid" 2>/dev/null || true
        wait "$step_pid" || status=$?
    fi
    # A signal that arrives before training has begun (a time limit shorter than start-up plus
    # the warning) kills the step before it can save: requeueing would repeat that forever.
    if [[ "$(newest_checkpoint)" == "$checkpoint_at_start" ]]; then
        echo "$(date +%T) error: training step ended with status $status and saved no new" \
            "checkpoint, so job $SLURM_JOB_ID is not requeued; give it a longer time limit (-t)" >&2
        exit 1
    fi
    echo "$(date +%T) training step ended with status $status; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
}

# The run folder's sealed checkpoint (its manifest, written last, is there) with the highest
# step; empty when there is none.
newest_checkpoint() {
    local checkpoint step newest="" newest_step=-1
    for checkpoint in "$OUTPUT_DIR"/checkpoint-*; do
        step="${checkpoint##*-}"
        if [[ -f "$checkpoint/checkpoint_manifest.json" && "$step" =~ ^[0-9]+$ ]] &&
            ((step > newest_step)); then
            newest="$checkpoint" newest_step="$step"
        fi
    done
    echo "$newest"
}

report_run_folder() {
    if [[ -f "$OUTPUT_DIR/run_summary.json" ]]; then
        echo "summary: $OUTPUT_DIR/run_summary.json  samples: $PYTHON -m pretrain.generate $OUTPUT_DIR"
    fi
}
