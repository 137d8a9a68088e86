"""Checkpoints: which one a run resumes from, a save on SIGUSR1, and resuming after SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest
from pretrain_runs import (
    logged_losses,
    read_summary,
    run_script_command,
    shared_data_paths,
    subprocess_env,
    tiny_run_argv,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.cli import InputError
from common.run_contract import FINAL_MODEL_DIR, GPT_SUMMARY_FILE, TENSORBOARD_DIR, TRAIN_LOSS
from pretrain.checkpoints import checkpoint_global_step, list_checkpoints, resolve_resume_checkpoint
from pretrain.run import main

NUM_BLOCKS = 160  # 40 steps of 4 blocks
NUM_STEPS = NUM_BLOCKS // 4
SAVE_STEPS = 4
POLL_SECONDS = 0.02


@pytest.fixture
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


def make_checkpoint(output_dir, step, complete=True):
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    state = json.dumps({"global_step": step, "log_history": []})
    # A save cut short leaves trainer_state.json (written last) missing or truncated.
    if complete:
        (folder / "trainer_state.json").write_text(state)
    return folder


def test_auto_resume_takes_the_newest_complete_checkpoint_and_drops_cut_short_ones(tmp_path):
    make_checkpoint(tmp_path, 4)
    make_checkpoint(tmp_path, 8)
    cut_short = make_checkpoint(tmp_path, 12, complete=False)
    (cut_short / "trainer_state.json").write_text('{"global_st')
    never_started = make_checkpoint(tmp_path, 16, complete=False)

    chosen = resolve_resume_checkpoint(tmp_path, "auto", remove_incomplete=True)
    assert chosen == tmp_path / "checkpoint-8"
    assert not cut_short.exists() and not never_started.exists()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-8", "checkpoint-4"]


def test_auto_resume_without_checkpoints_starts_fresh(tmp_path):
    assert resolve_resume_checkpoint(tmp_path / "new", "auto", remove_incomplete=True) is None
    make_checkpoint(tmp_path, 3, complete=False)
    assert resolve_resume_checkpoint(tmp_path, "auto", remove_incomplete=False) is None
    assert (tmp_path / "checkpoint-3").exists()  # only the main process deletes


def test_a_new_run_refuses_a_folder_with_checkpoints(tmp_path):
    make_checkpoint(tmp_path, 4)
    with pytest.raises(InputError, match="--resume_from_checkpoint auto"):
        resolve_resume_checkpoint(tmp_path, None, remove_incomplete=True)
    with pytest.raises(InputError, match="incomplete"):
        resolve_resume_checkpoint(tmp_path, str(make_checkpoint(tmp_path, 5, False)), True)


def wait_for_complete_checkpoint(output_dir, process=None, min_step=1):
    """Block until a checkpoint of `min_step` or later has a readable trainer_state.json."""
    while True:
        steps = [checkpoint_global_step(p) or 0 for p in list_checkpoints(output_dir)]
        if steps and max(steps) >= min_step:
            return
        if process is not None and process.poll() is not None:
            pytest.fail(f"training ended (exit {process.returncode}) before its first checkpoint")
        time.sleep(POLL_SECONDS)


@pytest.mark.multiprocess
def test_sigusr1_saves_a_checkpoint_and_auto_resume_finishes(data_paths, tmp_path):
    output_dir = tmp_path / "run"
    argv = tiny_run_argv(
        **data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS, save_steps=SAVE_STEPS
    )

    def signal_after_first_checkpoint():
        wait_for_complete_checkpoint(output_dir)
        signal.raise_signal(signal.SIGUSR1)

    # Should the signal come after training has restored the handlers, it must not end pytest.
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    sender = threading.Thread(target=signal_after_first_checkpoint, daemon=True)
    try:
        sender.start()
        exit_code = main(argv)
        sender.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)

    assert exit_code == 128 + signal.SIGUSR1
    stopped_at = max(checkpoint_global_step(p) or 0 for p in list_checkpoints(output_dir))
    assert SAVE_STEPS <= stopped_at < NUM_STEPS
    assert not (output_dir / GPT_SUMMARY_FILE).exists()
    assert not (output_dir / FINAL_MODEL_DIR).exists()

    assert main([*argv, "--resume_from_checkpoint", "auto"]) == 0
    summary = read_summary(output_dir)
    assert summary["resumed_from_step"] == stopped_at
    assert summary["global_step"] == summary["max_steps"] == NUM_STEPS


@pytest.mark.multiprocess
def test_resume_after_sigkill_continues_from_the_last_complete_checkpoint(data_paths, tmp_path):
    output_dir = tmp_path / "run"
    argv = tiny_run_argv(
        **data_paths,
        output_dir=output_dir,
        num_blocks=NUM_BLOCKS,
        save_steps=SAVE_STEPS,
        save_total_limit=NUM_STEPS,  # keep checkpoint-4 however far the run gets
    )
    process = subprocess.Popen(
        run_script_command(argv),
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_complete_checkpoint(output_dir, process, min_step=2 * SAVE_STEPS)
        process.kill()  # SIGKILL: no handler, no last save
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL, stderr[-2000:]
    assert not (output_dir / GPT_SUMMARY_FILE).exists()

    # As if the kill had come while checkpoint-8 was being written: trainer_state.json, the
    # last file of a checkpoint, is cut short (in this and any later checkpoint).
    for checkpoint in list_checkpoints(output_dir):
        if checkpoint_global_step(checkpoint) >= 2 * SAVE_STEPS:
            (checkpoint / "trainer_state.json").write_text('{"global_st')

    assert main([*argv, "--resume_from_checkpoint", "auto"]) == 0
    summary = read_summary(output_dir)
    assert summary["resumed_from_step"] == SAVE_STEPS
    assert summary["global_step"] == summary["max_steps"] == NUM_STEPS
    assert summary["tokens_trained"] == NUM_BLOCKS * 64

    # One continuous loss curve: the killed run logged steps 6 and 8 after checkpoint-4; they
    # are replaced by the resumed run's, not drawn twice.
    final_state_losses = logged_losses(output_dir / f"checkpoint-{NUM_STEPS}")
    accumulator = EventAccumulator(str(output_dir / TENSORBOARD_DIR))
    accumulator.Reload()
    curve = [(event.step, event.value) for event in accumulator.Scalars(TRAIN_LOSS)]
    assert [step for step, _ in curve] == [step for step, _ in final_state_losses]
    assert [value for _, value in curve] == pytest.approx([loss for _, loss in final_state_losses])
