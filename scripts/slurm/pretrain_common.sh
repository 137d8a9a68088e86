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
#   PRETRAIN_STOP_GRACE_SECONDS=60 seconds the training processes have to save and exit once
#                                  signalled; `--signal=B:USR1@90` leaves that plus 30 s for
#                                  Slurm's delay (6-17 s seen): raise both together

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

# Run the training step in the background, so that the batch shell can pass on the signal
# `#SBATCH --signal=B:USR1@90` sends before the time limit (srun to every task, the launcher to
# every training process). On the launcher's 138 (143: SIGTERM), a checkpoint was saved: the job
# requeues itself (same job id and OUTPUT_DIR) and the next start resumes. Other codes are
# final: 0 done, 2 bad input, 3 a failed run (its `error:` line says why).
run_step_with_requeue() {
    trap 'echo "$(date +%T) time limit near: asking the training step to save a checkpoint"
        kill -USR1 "${step_pid:-}" 2>/dev/null' USR1
    "$@" &
    step_pid=$!
    local status
    # `wait` again while the step runs on after the trap cut it short (it is saving).
    while status=0 && wait "$step_pid" || status=$?; kill -0 "$step_pid" 2>/dev/null; do :; done
    trap - USR1
    if ((status == 138 || status == 143)); then
        echo "$(date +%T) step saved a checkpoint and stopped ($status): requeueing $SLURM_JOB_ID"
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    return "$status"
}

report_run_folder() {
    if [[ -f "$OUTPUT_DIR/run_summary.json" ]]; then
        echo "summary: $OUTPUT_DIR/run_summary.json  samples: $PYTHON -m pretrain.generate $OUTPUT_DIR"
    fi
}
