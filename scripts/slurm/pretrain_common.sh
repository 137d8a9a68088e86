# shellcheck shell=bash
# Shared by the pretrain_*.sbatch scripts (sourced, not run): paths, the GPU check, precision,
# and the checkpoint-and-requeue handshake before the time limit.
#
# Variables (with defaults):
#   PYTHON=.venv/bin/python        interpreter with the project installed (python3 if no .venv)
#   CONFIG=pretrain/configs/gpt2_117m.yaml   Trainer YAML (model, data, optimisation)
#   OUTPUT_DIR=runs/<CONFIG's name>-<job id>   run folder (runs/gpt2_117m-<job id>); a
#                                  requeued job keeps its id and resumes
#   USE_CPU=false                  true: train on the node's CPU (fp32) whether it has a GPU or
#                                  not; a CONFIG with use_cpu: true (tiny.yaml) does the same
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
OUTPUT_DIR="${OUTPUT_DIR:-runs/$(basename "$CONFIG" .yaml)-${SLURM_JOB_ID:-local}}"
MIXED_PRECISION="${MIXED_PRECISION:-no}"
# The value of option $1 in CONFIG, else $2.
config_value() {
    "$PYTHON" -c 'import sys, yaml
print((yaml.safe_load(open(sys.argv[1])) or {}).get(sys.argv[2], sys.argv[3]))' "$CONFIG" "$1" "$2"
}
# srun does not inherit --cpus-per-task since Slurm 22.05.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"

# ON_CPU=true (fp32) when asked for: USE_CPU=true, or CONFIG's use_cpu: true. Else the pre-flight
# check (check-gpu on pretrain/run.py's flags: GPU, batch that fits, predicted loop seconds)
# stops a job on a node without a usable GPU, in one line (exit code 2).
choose_device() {
    ON_CPU=false
    if [[ "${USE_CPU:-false}" == true || "$(config_value use_cpu False)" == True ]]; then
        echo "training on the CPU, as asked (fp32)"
        ON_CPU=true MIXED_PRECISION=no
    elif ! "$PYTHON" -m pretrain.check_gpu --config "$CONFIG" "$@"; then
        echo "to train on this node's CPU instead: USE_CPU=true sbatch ..."
        exit 2
    fi
}

# The GPUs this job's processes can use, as torch counts them (those Slurm granted).
gpus_on_node() {
    "$PYTHON" -c 'import torch; print(torch.cuda.device_count())'
}

# Per-process batch for GLOBAL_BATCH blocks over $1 processes (no gradient accumulation).
per_process_batch() {
    local processes=$1
    # By default the recipe's, read from the config (TrainingArguments' defaults: 8 x 1).
    GLOBAL_BATCH="${GLOBAL_BATCH:-$(($(config_value per_device_train_batch_size 8) * $(config_value gradient_accumulation_steps 1)))}"
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
