"""The shipped sbatch scripts, submitted for real to a throw-away Slurm cluster on this machine.

The cluster (scripts/slurm/local_cluster.sh) has two emulated nodes with two fake GPUs each and
the course cluster's partitions: debug (5 min) and normal (20 min). Where Slurm is not
installed, every test here is skipped with the reason.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from pretrain_runs import BLOCK_SIZE, TINY_CONFIG, read_summary
from safetensors.torch import load_file
from slurm_cluster import (
    REPO_ROOT,
    LocalCluster,
    find_processes,
    is_running,
    local_cluster,
    missing_requirements,
    pending_signals,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

SLURM_SCRIPTS = REPO_ROOT / "scripts" / "slurm"

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements())),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with local_cluster(tmp_path_factory.mktemp("slurm")) as running_cluster:
        yield running_cluster


def wait_until(condition: Callable[[], object], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what} after {timeout} s"
        time.sleep(0.2)


def submit_and_wait(
    cluster: LocalCluster,
    script: Path,
    log: Path,
    *script_args: str,
    sbatch_options: tuple[str, ...] = (),
    timeout: float = 240,
    **env_overrides: str,
) -> str:
    """Submit SCRIPT with `sbatch --wait`, assert the job succeeded and return its log."""
    submitted = cluster.run(
        ["sbatch", "--wait", f"--output={log}", *sbatch_options, str(script), *script_args],
        timeout=timeout,
        **env_overrides,
    )
    job_log = log.read_text() if log.exists() else "(no job log)"
    assert submitted.returncode == 0, (
        f"sbatch --wait {script.name} exited {submitted.returncode}\n"
        f"sbatch stderr: {submitted.stderr}\njob log:\n{job_log}"
    )
    return job_log


def test_two_node_step_sees_ranks_and_head_node(cluster: LocalCluster) -> None:
    # What the multi-node scripts rely on: one task per node, the rank in SLURM_PROCID and the
    # head node as the first of `scontrol show hostnames`.
    step = cluster.run(
        [
            "srun",
            "--nodes=2",
            "--ntasks-per-node=1",
            "bash",
            "-c",
            "echo $SLURM_PROCID $SLURMD_NODENAME"
            ' "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        ]
    )
    assert step.returncode == 0, step.stderr
    ranks = sorted(line.split() for line in step.stdout.splitlines())
    assert ranks == [["0", "127.0.0.2", "127.0.0.2"], ["1", "127.0.0.3", "127.0.0.2"]]


@pytest.mark.parametrize(("partition", "minutes"), [("debug", 6), ("normal", 21)])
def test_job_over_partition_time_limit_is_refused_at_submission(
    cluster: LocalCluster, tmp_path: Path, partition: str, minutes: int
) -> None:
    # A name of its own: the earlier test's srun allocation may still be listed as completing.
    job_name = f"over-{partition}-limit"
    submitted = cluster.run(
        [
            "sbatch",
            f"--job-name={job_name}",
            f"--partition={partition}",
            f"--time={minutes}",
            f"--output={tmp_path / 'never.out'}",
            str(SLURM_SCRIPTS / "mnist.sbatch"),
        ]
    )
    assert submitted.returncode != 0
    assert "Requested time limit is invalid" in submitted.stderr
    assert cluster.jobs(name=job_name) == []


def test_down_cancels_jobs_and_stops_every_daemon(tmp_path: Path) -> None:
    # A cluster of its own: this one is taken down while a job still runs.
    with local_cluster(tmp_path / "cluster") as own_cluster:
        pid_file = tmp_path / "job.pid"
        submitted = own_cluster.run(
            ["sbatch", "--parsable", f"--output={tmp_path / 'job.out'}", "--wrap",
             f"echo $$ > {pid_file}; exec sleep 300"]
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the job to start")
        job_pid = int(pid_file.read_text())
        daemon_pids = own_cluster.daemon_pids()
        assert len(daemon_pids) == 4  # munged, slurmctld, two slurmd
        assert all(is_running(pid) for pid in [job_pid, *daemon_pids])
    assert not any(is_running(pid) for pid in [job_pid, *daemon_pids])
    assert not list((tmp_path / "cluster" / "run").glob("*.pid"))


def test_mnist_lenet5_on_debug_partition_writes_test_accuracy(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    run_dir = tmp_path / "mnist"
    job_log = submit_and_wait(
        cluster,
        SLURM_SCRIPTS / "mnist.sbatch",
        tmp_path / "mnist.out",
        # A short run on the embedded 5k digits: enough to beat chance clearly.
        *("--epochs", "1", "--max_steps", "30", "--on_device_data", "true"),
        *("--num_projector_digits", "16"),
        OUTPUT_DIR=str(run_dir),
        OMP_NUM_THREADS="1",  # all emulated nodes share this machine's cores
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["num_test"] == 1000
    assert metrics["test_accuracy"] > 0.3, metrics["test_accuracy"]  # chance is 0.1
    # The job got the partition's (fake) GPU, which CUDA cannot use: the CPU fallback.
    assert "partition debug, GPUs: 0" in job_log
    assert metrics["device"] == "cpu"


# --- GPT-2 pretraining: the tiny preset, 96 blocks of 64 tokens, 24 steps of 4 blocks --------

PRETRAIN_STEPS = 24
GLOBAL_BATCH = 4  # blocks per optimizer step over all processes, as the one-process run's


@pytest.fixture(scope="module")
def pretrain_flags(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory) -> list[str]:
    """pretrain/run.py flags on the test corpus; the scripts add --config and --output_dir."""
    return [
        *("--corpus", str(wos_corpus_dir), "--tokenizer_dir", str(tiny_tokenizer_dir)),
        *("--cache_dir", str(tmp_path_factory.mktemp("pretrain_cache"))),
        *("--block_size", str(BLOCK_SIZE)),
        *("--max_train_tokens", str(PRETRAIN_STEPS * GLOBAL_BATCH * BLOCK_SIZE)),
        *("--logging_steps", "2", "--final_loss_window", "3", "--disable_tqdm", "true"),
    ]


def pretrain_env(output_dir: Path) -> dict[str, str]:
    """The variables the pretrain_*.sbatch scripts read, for a tiny CPU run."""
    return {
        "CONFIG": str(TINY_CONFIG),
        "OUTPUT_DIR": str(output_dir),
        "GLOBAL_BATCH": str(GLOBAL_BATCH),
        "OMP_NUM_THREADS": "1",  # all emulated nodes share this machine's cores
    }


def scalar_steps(tensorboard_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of TAG as TensorBoard shows it: over all event files, later runs
    replacing the steps an interrupted run wrote past its checkpoint (purge_step)."""
    if not tensorboard_dir.is_dir():
        return []
    events = EventAccumulator(str(tensorboard_dir))
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return []
    return [(event.step, event.value) for event in events.Scalars(tag)]


def assert_same_parameters(run_dir: Path, reference_run_dir: Path) -> None:
    """The two runs' final models agree, up to floating-point summation order."""
    parameters = load_file(run_dir / "final" / "model.safetensors")
    reference = load_file(reference_run_dir / "final" / "model.safetensors")
    assert parameters.keys() == reference.keys()
    for name, parameter in parameters.items():
        torch.testing.assert_close(parameter, reference[name], rtol=1e-4, atol=1e-4, msg=name)


@pytest.fixture(scope="module")
def single_node_run(cluster: LocalCluster, pretrain_flags, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("pretrain_single") / "run"
    submit_and_wait(
        cluster,
        SLURM_SCRIPTS / "pretrain_single_gpu.sbatch",
        run_dir.with_suffix(".out"),
        *pretrain_flags,
        **pretrain_env(run_dir),
    )
    return run_dir


def test_pretrain_on_a_node_without_gpu_stops_in_one_line_unless_the_cpu_is_asked_for(
    cluster: LocalCluster, pretrain_flags, tmp_path: Path
) -> None:
    """The course config on a node whose GPU torch cannot use: check-gpu's line, exit 2 (final:
    no requeue), nothing trained; the same job with USE_CPU=true starts on the CPU."""
    run_dir, log = tmp_path / "run", tmp_path / "run.out"
    script = str(SLURM_SCRIPTS / "pretrain_single_gpu.sbatch")
    env = {**pretrain_env(run_dir), "CONFIG": str(TINY_CONFIG.with_name("gpt2_117m.yaml"))}
    submitted = cluster.run(
        ["sbatch", "--wait", f"--output={log}", script, *pretrain_flags], timeout=240, **env
    )
    job_log = log.read_text()
    assert submitted.returncode == 2, job_log
    (error,) = [line for line in job_log.splitlines() if line.startswith("error:")]
    assert error.startswith("error: no usable GPU: ") and "USE_CPU=true" in job_log
    assert not run_dir.exists() and "restart 1" not in job_log

    # Two steps of the tiny model under the course config, on the CPU.
    tiny = ["--model_preset", "tiny", "--torch_compile", "false", "--max_steps", "2"]
    job_log = submit_and_wait(
        cluster, Path(script), log, *pretrain_flags, *tiny, USE_CPU="true", **env
    )
    assert "training on the CPU, as asked (fp32)" in job_log
    assert read_summary(run_dir)["global_step"] == 2


def test_pretrain_one_node_writes_summary_and_loss_falls(single_node_run: Path) -> None:
    summary = read_summary(single_node_run)
    assert summary["num_processes"] == 1
    assert summary["global_step"] == summary["max_steps"] == PRETRAIN_STEPS
    first_step, first_loss = scalar_steps(single_node_run / "tensorboard", "train/loss")[0]
    assert first_step == 1
    assert summary["final_loss"] < first_loss - 0.3, (first_loss, summary["final_loss"])


def test_pretrain_two_nodes_stay_in_sync_and_match_one_process(
    cluster: LocalCluster, pretrain_flags, single_node_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    job_log = submit_and_wait(
        cluster,
        SLURM_SCRIPTS / "pretrain_multi_node.sbatch",
        tmp_path / "run.out",
        *pretrain_flags,
        sbatch_options=("--nodes=2",),
        **pretrain_env(run_dir),
    )
    # One launcher per node (rank from SLURM_PROCID), meeting on the first node.
    assert "2 nodes x 1 processes x 2 blocks, rendezvous 127.0.0.2:" in job_log
    assert "Process index: 0" in job_log and "Process index: 1" in job_log
    summary = read_summary(run_dir)
    assert summary["num_processes"] == 2
    assert summary["global_step"] == PRETRAIN_STEPS
    # Every rank ends with the same parameters: the gradients were really all-reduced.
    first_rank, second_rank = summary["replica_checksums"]
    assert first_rank == second_rank
    # The same global batch on one process gives the same model, up to summation order.
    reference = read_summary(single_node_run)
    assert summary["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-4)
    assert summary["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-4)
    assert_same_parameters(run_dir, single_node_run)


def training_processes(run_dir: Path) -> list[int]:
    """The training processes writing RUN_DIR (not their launcher, whose arguments name it too)."""
    launchers = find_processes("python", "pretrain.launch")
    return [
        p for p in find_processes("python", "pretrain/run.py", str(run_dir)) if p not in launchers
    ]


def pause_after_first_step(run_dir: Path) -> int:
    """Stop (SIGSTOP) the training process writing RUN_DIR once it has logged a step, and return
    its PID. It runs in 0.1 s slices until then: a tiny run's steps take about a second in all,
    so a test that looked for the step while it ran on could find it finished, however early
    it looked on a loaded machine."""
    wait_until(lambda: training_processes(run_dir), "the training process to start")
    (pid,) = training_processes(run_dir)
    deadline = time.monotonic() + 120
    os.kill(pid, signal.SIGSTOP)
    while not scalar_steps(run_dir / "tensorboard", "train/loss"):
        os.kill(pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "gave up waiting for a first step after 120 s"
        time.sleep(0.1)
        os.kill(pid, signal.SIGSTOP)
    return pid


@pytest.mark.parametrize(
    "stop_signal", [signal.SIGUSR1, signal.SIGTERM], ids=["time-limit", "sigterm"]
)
def test_pretrain_stop_signal_checkpoints_requeues_and_resumes(
    cluster: LocalCluster,
    pretrain_flags,
    single_node_run: Path,
    tmp_path: Path,
    stop_signal: signal.Signals,
) -> None:
    """A job stopped mid-training saves a checkpoint, requeues itself (the launcher exits 138 or
    143), and the next start resumes and finishes the planned steps. SIGUSR1 is the script's
    `--signal=B:USR1@90` before the time limit; SIGTERM reaches the steps on preemption or
    `scancel --signal=TERM`.

    Slurm checks time limits every 30 s, so when the signal lands is not ours to choose; a tiny
    run would be over long before. The test therefore pauses training (SIGSTOP) after its first
    steps, cuts the job's time limit so that the signal falls due now (or sends SIGTERM), and
    lets training go on once the signal is pending on it. The requeued job gets a full slot back.
    """
    run_dir = tmp_path / "run"
    script = SLURM_SCRIPTS / "pretrain_single_gpu.sbatch"
    sbatch = subprocess.Popen(
        # 3 minutes: the 90 s warning cannot fall due before the test pauses the run.
        ["sbatch", "--wait", "--time=3", f"--output={tmp_path / 'run.out'}", str(script),
         *pretrain_flags],
        cwd=REPO_ROOT,
        env={**cluster.env, **pretrain_env(run_dir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    trainer_pids: list[int] = []
    try:
        wait_until(lambda: cluster.jobs(name="gpt2-pretrain"), "the job to be submitted")
        (job_id,) = cluster.jobs(name="gpt2-pretrain")
        trainer_pids = [pause_after_first_step(run_dir)]
        if stop_signal == signal.SIGUSR1:
            # 2 minutes with a warning 90 s before the end: due within Slurm's next check.
            updated = cluster.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=2"])
        else:
            updated = cluster.run(["scancel", f"--signal={stop_signal.name}", job_id])
        assert updated.returncode == 0, updated.stderr
        wait_until(
            lambda: stop_signal in pending_signals(trainer_pids[0]),
            f"{stop_signal.name} to reach the training process",
        )
        os.kill(trainer_pids[0], signal.SIGCONT)
        wait_until(lambda: cluster.job_fields(job_id).get("Restarts") == "1", "the job to requeue")
        updated = cluster.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=5"])
        assert updated.returncode == 0, updated.stderr
        stdout, stderr = sbatch.communicate(timeout=240)
    finally:
        for pid in trainer_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if sbatch.poll() is None:
            sbatch.kill()
    job_log = (tmp_path / "run.out").read_text()
    assert sbatch.returncode == 0, f"{stderr}\njob log:\n{job_log}"

    # The first start saved a checkpoint when signalled; the second one resumed from it.
    assert job_log.count("time limit near") == (stop_signal == signal.SIGUSR1)
    assert job_log.count(f"saved a checkpoint and stopped ({128 + stop_signal}): requeue") == 1
    assert "(restart 1)" in job_log
    stopped = re.search(rf"stopped by {stop_signal.name} at step (\d+) of (\d+)", job_log)
    assert stopped is not None, job_log
    stopped_at_step = int(stopped[1])
    assert 0 < stopped_at_step < PRETRAIN_STEPS == int(stopped[2])
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == stopped_at_step
    assert summary["global_step"] == summary["max_steps"] == PRETRAIN_STEPS
    # One continuous loss curve over both starts: every logged step once, in order.
    curve = scalar_steps(run_dir / "tensorboard", "train/loss")
    assert [step for step, _ in curve] == [1, *range(2, PRETRAIN_STEPS + 1, 2)]
    # Resuming changes nothing: the same model as the uninterrupted run's (same data order,
    # same optimizer state). Logged losses may differ where a logging window spans the stop.
    assert summary["eval_loss"] == pytest.approx(read_summary(single_node_run)["eval_loss"])
    assert_same_parameters(run_dir, single_node_run)


def test_pretrain_signal_before_training_fails_instead_of_requeueing_forever(
    cluster: LocalCluster, pretrain_flags, tmp_path: Path
) -> None:
    """A time limit shorter than start-up puts the warning before training began: nothing can
    be saved, and a requeue would only repeat that. The test holds the training process in its
    start-up (SIGSTOP) and signals the batch shell as Slurm does at `--signal=B:USR1@90`."""
    run_dir = tmp_path / "run"
    sbatch = subprocess.Popen(
        ["sbatch", "--wait", f"--output={tmp_path / 'run.out'}",
         str(SLURM_SCRIPTS / "pretrain_single_gpu.sbatch"), *pretrain_flags],
        cwd=REPO_ROOT,
        env={**cluster.env, **pretrain_env(run_dir)},
    )  # fmt: skip
    trainer_pids: list[int] = []
    try:
        wait_until(
            lambda: sbatch.poll() is not None or training_processes(run_dir),
            "the training process to start",
        )
        trainer_pids = training_processes(run_dir)
        assert trainer_pids, (tmp_path / "run.out").read_text()
        os.kill(trainer_pids[0], signal.SIGSTOP)
        (job_id,) = cluster.jobs(name="gpt2-pretrain")
        signalled = cluster.run(["scancel", "--batch", "--signal=USR1", job_id])
        assert signalled.returncode == 0, signalled.stderr
        wait_until(
            lambda: signal.SIGUSR1 in pending_signals(trainer_pids[0]),
            "SIGUSR1 to reach the training process",
        )
        os.kill(trainer_pids[0], signal.SIGCONT)
        sbatch.wait(timeout=240)
    finally:
        for pid in trainer_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if sbatch.poll() is None:
            sbatch.kill()
    job_log = (tmp_path / "run.out").read_text()
    assert sbatch.returncode == 3, job_log
    assert "error: SIGUSR1 stopped the run unsaved: it came before training began" in job_log
    assert "(restart 1)" not in job_log
