"""The launcher's exit code and terminal under the faults a cluster deals out: a stop signal
(Slurm's warning before the time limit, scancel, preemption), a process killed (kill -9, the
out-of-memory killer), a save slower than the grace period, bad input. Each drives the real
command (the README's and the sbatch scripts') with the real fault."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from pretrain_runs import (
    REPO_ROOT,
    RUN_SCRIPT,
    TINY_CONFIG,
    shared_data_paths,
    subprocess_env,
    tiny_run_argv,
)

from common.run_contract import CHECKPOINT_MANIFEST_FILE
from pretrain.checkpoints import checkpoint_damage, checkpoint_global_step, list_checkpoints
from pretrain.launch import StopSignals, newest_complete_checkpoint, outcome, run_folder
from pretrain.launch import main as launch_main
from pretrain.run import main as pretrain_main
from pretrain.stops import STOP_GRACE_VARIABLE, STOP_SIGNALS

LAUNCHER = [sys.executable, "-m", "pretrain.launch"]
CPU_CONFIG = REPO_ROOT / "accelerate_configs" / "cpu.yaml"
CPU_DDP_CONFIG = REPO_ROOT / "accelerate_configs" / "cpu_ddp.yaml"
NUM_BLOCKS = 40_000  # 10,000 steps of 4 blocks: the tests stop the runs long before
SAVE_STEPS = 3  # a checkpoint soon, so a test knows training is under way
# A line the training processes log (common/cli.py setup_logging).
LOG_LINE = re.compile(r"\d\d:\d\d:\d\d (INFO|WARNING) [\w.]+: ")


@pytest.fixture
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


def launch(
    data_paths: dict,
    run_dir: Path,
    num_processes: int,
    *flags: str,
    python=False,
    run_script: Path = RUN_SCRIPT,
    **env: str,
) -> subprocess.Popen:
    """The launcher (or plain `python`) on a tiny run long enough to be stopped, in a process
    group of its own; `flags` for `run_script` (pretrain/run.py)."""
    config = CPU_DDP_CONFIG if num_processes > 1 else CPU_CONFIG
    argv = tiny_run_argv(**data_paths, output_dir=run_dir, num_blocks=NUM_BLOCKS)
    script = [
        str(run_script), *argv, "--per_device_train_batch_size", str(4 // num_processes),
        # Every step a boundary at which the processes agree to stop.
        "--logging_steps", "1", "--save_steps", str(SAVE_STEPS), *flags,
    ]  # fmt: skip
    launcher = [*LAUNCHER, "--config_file", str(config), "--num_processes", str(num_processes)]
    command = [sys.executable, *script] if python else [*launcher, *script]
    return subprocess.Popen(
        command,
        env={**subprocess_env(), **env},
        stdout=subprocess.DEVNULL,  # Trainer's log lines, read by no one: never a full pipe
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_training(launcher: subprocess.Popen, run_dir: Path, timeout: float = 300) -> int:
    """Once a checkpoint is sealed (training is under way), the step of the newest."""
    deadline = time.monotonic() + timeout
    while not list(run_dir.glob(f"checkpoint-*/{CHECKPOINT_MANIFEST_FILE}")):
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            pytest.fail(f"no checkpoint after {timeout} s:\n{launcher.communicate()[1][-3000:]}")
        time.sleep(0.2)
    return max(checkpoint_global_step(path) or 0 for path in list_checkpoints(run_dir))


def newest_whole_checkpoint(run_dir: Path) -> Path:
    return next(path for path in list_checkpoints(run_dir) if checkpoint_damage(path) is None)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("stop_signal", "num_processes", "to_group"),
    [
        (signal.SIGTERM, 2, False),
        (signal.SIGUSR1, 2, False),
        (signal.SIGINT, 2, True),  # Ctrl-C reaches the terminal's whole foreground group
        (signal.SIGUSR1, 1, False),  # accelerate's one-process launcher passes on no signal
    ],
    ids=["sigterm", "sigusr1", "sigint-to-group", "sigusr1-one-process"],
)
def test_stop_signal_saves_a_checkpoint_and_exits_128_plus_signal(
    data_paths, tmp_path, stop_signal, num_processes, to_group
):
    run_dir = tmp_path / "run"
    launcher = launch(data_paths, run_dir, num_processes)
    step_before = wait_for_training(launcher, run_dir)
    (os.killpg if to_group else os.kill)(launcher.pid, stop_signal)
    _, stderr = launcher.communicate(timeout=600)

    assert launcher.returncode == 128 + stop_signal, stderr[-3000:]
    checkpoint = newest_whole_checkpoint(run_dir)
    step = checkpoint_global_step(checkpoint)
    assert step > step_before  # saved on the signal, after the one the test saw
    assert f"stopped by {stop_signal.name} at step {step} of " in stderr
    assert "Traceback" not in stderr and not error_lines(stderr)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("stop_signal", "python"),
    [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGUSR1, False)],
    ids=["sigterm-launcher", "sigterm-python", "sigusr1-launcher"],
)
def test_a_stop_signal_to_the_group_leaves_the_dataloader_workers_running(
    data_paths, tmp_path, stop_signal, python
):
    """scancel signals every process of the job step, DataLoader workers included: the run
    still saves and ends with 128 + signal, without a worker's death in the terminal."""
    run_dir = tmp_path / "run"
    launcher = launch(data_paths, run_dir, 1, "--dataloader_num_workers", "2", python=python)
    step_before = wait_for_training(launcher, run_dir)
    workers = psutil.Process(launcher.pid).children(recursive=True)
    assert sum("pt_data_worker" in worker.name() for worker in workers) == 2, workers
    os.killpg(launcher.pid, stop_signal)
    _, stderr = launcher.communicate(timeout=600)

    assert launcher.returncode == 128 + stop_signal, stderr[-3000:]
    assert checkpoint_global_step(newest_whole_checkpoint(run_dir)) > step_before
    assert "Traceback" not in stderr and not error_lines(stderr), stderr[-3000:]
    assert stderr.count(f"received {stop_signal.name}") == 1  # the trainer's, not the workers'


def signal_workers_as_they_start(launcher: subprocess.Popen, timeout: float = 300) -> None:
    """SIGTERM to each DataLoader worker the moment it is seen (its rank's child), again and
    again until every rank has two; then to every process of the launch, as scancel sends it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and launcher.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            ranks = psutil.Process(launcher.pid).children()
            workers = [worker for rank in ranks for worker in rank.children()]
            for worker in workers:
                os.kill(worker.pid, signal.SIGTERM)
            if len(ranks) == 2 and len(workers) == 4:
                os.killpg(launcher.pid, signal.SIGTERM)
                return
    launcher.kill()
    pytest.fail(f"no DataLoader workers after {timeout} s:\n{launcher.communicate()[1][-3000:]}")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_stop_signal_as_the_dataloader_workers_start_saves_the_first_step(data_paths, tmp_path):
    """SIGTERM to the DataLoader workers as they are forked, then to every process of the
    launch (scancel, preemption): before a worker's init function ignored it, torch's handler
    let it kill the worker (or the trainer's ran in it), its rank failed, the other waited out
    the grace, and the run ended 3 with no checkpoint (3 tries of 3 before the fix)."""
    run_dir = tmp_path / "run"
    launcher = launch(data_paths, run_dir, 2, "--dataloader_num_workers", "2")
    signal_workers_as_they_start(launcher)
    _, stderr = launcher.communicate(timeout=600)

    assert launcher.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert checkpoint_global_step(newest_whole_checkpoint(run_dir)) >= 1
    assert "Traceback" not in stderr and not error_lines(stderr), stderr[-3000:]
    assert stderr.count("received SIGTERM") == 2, stderr[-3000:]  # the ranks', no worker's


@pytest.mark.slow
@pytest.mark.multiprocess
def test_killed_process_ends_the_run_in_one_line_naming_rank_signal_and_checkpoint(
    data_paths, tmp_path
):
    run_dir = tmp_path / "run"
    launcher = launch(data_paths, run_dir, num_processes=2)
    wait_for_training(launcher, run_dir)
    workers = psutil.Process(launcher.pid).children()
    (rank_1,) = [worker for worker in workers if worker.environ().get("RANK") == "1"]
    rank_1.kill()
    _, stderr = launcher.communicate(timeout=600)

    assert launcher.returncode == 3, stderr[-3000:]
    assert len(error_lines(stderr)) == 1, stderr[-3000:]
    (error,) = error_lines(stderr)
    assert "rank 1 was killed by SIGKILL" in error
    assert f"the newest complete checkpoint is {newest_whole_checkpoint(run_dir)};" in error
    # The survivor's traceback (its peer vanished mid all-reduce) stays off the terminal.
    assert "Traceback" not in stderr


@pytest.mark.multiprocess
def test_a_process_ended_by_its_peer_s_failure_adds_no_second_line(tmp_path):
    """A full disk on rank 0 ends rank 1's next collective: rank 0's line says why, alone."""
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys\n"
        "from common.run_contract import PEER_STOPPED\n"
        "cause = 'cannot save in run: no space left on device'\n"
        "line = cause if os.environ['RANK'] == '0' else f'{PEER_STOPPED} (DistError)'\n"
        "print(f'error: {line}', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    launcher = [*LAUNCHER, "--config_file", str(CPU_DDP_CONFIG), "--num_processes", "2"]
    result = subprocess.run(
        [*launcher, str(script)], env=subprocess_env(), capture_output=True, text=True
    )
    assert result.returncode == 3, result.stderr[-3000:]
    assert error_lines(result.stderr) == ["error: cannot save in run: no space left on device"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_stop_during_a_pipeline_run_ends_every_process_in_one_line_keeping_nothing(
    data_paths, tmp_path
):
    """The TP/PP loop saves no checkpoints: a stop signal to every process of the step, as Slurm
    sends it, ends them at once (no process left waiting in a collective), folder removed."""
    run_dir = tmp_path / "run"
    script = REPO_ROOT / "pretrain" / "run_model_parallel.py"
    flags = ("--strategy", "pp", "--per_device_train_batch_size", "4")  # one pipeline: 4 blocks
    launcher = launch(data_paths, run_dir, 2, *flags, run_script=script)
    deadline = time.monotonic() + 300
    while not list(run_dir.glob("tensorboard/events.*")):
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the pipeline run did not start within 300 s"
        time.sleep(0.2)
    os.killpg(launcher.pid, signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=600)

    assert launcher.returncode == 3, stderr[-3000:]
    (error,) = error_lines(stderr)
    assert "SIGTERM stopped the run unsaved" in error and "saves no checkpoints" in error
    assert stderr.count("stopped by SIGTERM (this loop saves none); nothing was kept") == 2
    assert not run_dir.exists()


@pytest.mark.slow
def test_stop_signal_unsaved_within_the_grace_period_is_a_failed_run(data_paths, tmp_path):
    run_dir = tmp_path / "run"
    launcher = launch(data_paths, run_dir, num_processes=1, **{STOP_GRACE_VARIABLE: "0.5"})
    wait_for_training(launcher, run_dir)
    (worker,) = psutil.Process(launcher.pid).children()
    worker.suspend()  # a save slower than any grace period: it never gets to it
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=600)

    assert launcher.returncode == 3, stderr[-3000:]
    (error,) = error_lines(stderr)
    assert "SIGTERM stopped the run unsaved: the processes were killed after 0.5 s" in error
    assert STOP_GRACE_VARIABLE in error
    assert f"the newest complete checkpoint is {newest_whole_checkpoint(run_dir)}" in error


@pytest.mark.slow
def test_bad_input_with_one_process_is_one_error_line_and_exit_2(data_paths, tmp_path):
    run_dir = tmp_path / "run"
    argv = tiny_run_argv(
        **{**data_paths, "tokenizer_dir": tmp_path / "missing"}, output_dir=run_dir
    )
    result = subprocess.run(
        [*LAUNCHER, "--config_file", str(CPU_CONFIG), str(RUN_SCRIPT), *argv],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    (error,) = error_lines(result.stderr)
    assert f"tokenizer folder {tmp_path / 'missing'} does not exist" in error
    # Besides it, only the lines the training process logged before it looked at the tokenizer.
    others = [line for line in result.stderr.splitlines() if line != error]
    assert all(LOG_LINE.match(line) for line in others), others
    assert not run_dir.exists()


def test_run_folder_is_the_output_dir_flag_else_the_config_files():
    config_output_dir = yaml.safe_load(TINY_CONFIG.read_text())["output_dir"]
    assert run_folder(["--config", str(TINY_CONFIG)]) == Path(config_output_dir)
    assert run_folder(["--config", str(TINY_CONFIG), "--output_dir=runs/x"]) == Path("runs/x")
    assert run_folder(["--output_dir", "runs/y", "--logging_steps", "1"]) == Path("runs/y")
    assert run_folder(["--config", "missing.yaml"]) is None


SEALED = '{"files": {}}'  # a manifest of no files: sealed, as far as the launcher looks


def test_the_newest_complete_checkpoint_is_the_highest_sealed_step(tmp_path):
    folders = {"checkpoint-8": True, "checkpoint-12": False, "damaged-checkpoint-16": True}
    for name, sealed in folders.items():
        (tmp_path / name).mkdir()
        if sealed:
            (tmp_path / name / CHECKPOINT_MANIFEST_FILE).write_text(SEALED)
    # checkpoint-12 has no manifest yet; a checkpoint moved aside is not a checkpoint folder.
    assert newest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-8"
    assert newest_complete_checkpoint(None) is None


def test_a_stop_that_saved_no_new_checkpoint_is_a_failed_run_not_one_to_requeue(tmp_path):
    handlers = {stop_signal: signal.getsignal(stop_signal) for stop_signal in STOP_SIGNALS}
    try:
        stop = StopSignals(grace=60, run_dir=tmp_path)
    finally:
        for stop_signal, handler in handlers.items():
            signal.signal(stop_signal, handler)
    stop.received, stop.grace_ended = signal.SIGUSR1, False
    # Every process stopped on the signal before its first step (exit 138), saving nothing.
    code, error = outcome({0: 138, 1: 138}, stop)
    assert code == 3 and "SIGUSR1 stopped the run unsaved: it came before training began" in error
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / CHECKPOINT_MANIFEST_FILE).write_text(SEALED)
    assert outcome({0: 138, 1: 138}, stop) == (138, None)


@pytest.mark.parametrize(
    ("argv", "mistake"),
    [
        (["--config_fiel", "x", str(RUN_SCRIPT)], "unrecognized arguments: --config_fiel"),
        (["--num_processes", "two", str(RUN_SCRIPT)], "invalid int value: 'two'"),
        ([], "the following arguments are required: training_script"),
    ],
)
def test_a_launcher_mistake_is_one_line_not_accelerates_usage(argv, mistake, capsys):
    assert launch_main(argv) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("error: ") and mistake in error
    assert error.endswith("(launch-pretraining --help lists the launcher's options)")


def test_the_run_script_under_a_python_without_the_venv_says_so_in_one_line():
    """`python pretrain/run.py` with the venv not active; -S: this Python without its packages."""
    finished = subprocess.run(
        [sys.executable, "-S", str(RUN_SCRIPT), "--help"], capture_output=True, text=True
    )
    assert finished.returncode == 2
    (error,) = finished.stderr.splitlines()
    assert error.startswith(f"error: {sys.executable} lacks the toolkit's packages (")
    assert ".venv/bin/python" in error


@pytest.mark.parametrize("grace", ["abc", "", "-5", "0", "nan", "inf", "1e10", "86401"])
def test_a_bad_grace_period_is_one_line_and_exit_2_with_or_without_the_launcher(
    data_paths, tmp_path, monkeypatch, capsys, grace
):
    """Checked before anything starts, under plain python too (not at the first checkpoint);
    a grace the launcher's kill timer cannot hold (1e10) or no number of seconds is refused."""
    monkeypatch.setenv(STOP_GRACE_VARIABLE, grace)
    run_dir = tmp_path / "run"
    argv = tiny_run_argv(**data_paths, output_dir=run_dir)
    assert pretrain_main(argv) == 2
    assert launch_main(["--config_file", str(CPU_CONFIG), str(RUN_SCRIPT), *argv]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors[-2:] == 2 * [
        f"error: {STOP_GRACE_VARIABLE}={grace!r} is not a number of seconds above 0 and at most "
        "86400; set it to the seconds a checkpoint save may take after a stop signal (default 60)"
    ]
    assert not run_dir.exists()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_processes_of_a_launcher_killed_by_sigkill_stop_within_seconds(data_paths, tmp_path):
    """kill -9 of launch-pretraining leaves no one to pass a signal on: the kernel sends each
    process SIGTERM (PR_SET_PDEATHSIG), and they save a checkpoint and stop, instead of
    training on unsupervised with the run folder's lock held."""
    run_dir = tmp_path / "run"
    launcher = launch(data_paths, run_dir, num_processes=2)
    step_before = wait_for_training(launcher, run_dir)
    workers = psutil.Process(launcher.pid).children()
    assert len(workers) == 2
    launcher.kill()
    launcher.communicate(timeout=60)
    _, alive = psutil.wait_procs(workers, timeout=60)
    stopped_late = [worker for worker in alive if worker.status() != psutil.STATUS_ZOMBIE]
    for worker in stopped_late:
        worker.kill()
    assert not stopped_late, "processes still running a minute after their launcher died"
    assert checkpoint_global_step(newest_whole_checkpoint(run_dir)) > step_before
