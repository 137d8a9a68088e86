"""Checkpoints: which one a run resumes from, a save on SIGUSR1, and resuming after SIGKILL."""

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from pretrain_runs import (
    COURSE_OPTIMISER,
    WritesAMarkerWhenUnpickled,
    logged_losses,
    read_summary,
    run_script_command,
    shared_data_paths,
    subprocess_env,
    tiny_run_argv,
)
from safetensors.torch import load_file, save_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader
from transformers import TrainerControl, TrainerState, TrainingArguments

from common.cli import InputError
from common.files import file_digests
from common.run_contract import (
    CHECKPOINT_MANIFEST_FILE,
    FINAL_MODEL_DIR,
    GPT_SUMMARY_FILE,
    TENSORBOARD_DIR,
    TRAIN_LOSS,
)
from pretrain.checkpoints import (
    checkpoint_damage,
    checkpoint_global_step,
    conversion_needed,
    identity_differences,
    list_checkpoints,
    resolve_resume_checkpoint,
    seal_checkpoint,
    strategy_in_words,
)
from pretrain.run import main
from pretrain.run_folder import hold_run_folder
from pretrain.stops import CheckpointOnSignalCallback, StopRequested

NUM_BLOCKS = 160  # 40 steps of 4 blocks
NUM_STEPS = NUM_BLOCKS // 4
SAVE_STEPS = 4
POLL_SECONDS = 0.02


@pytest.fixture
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


def make_checkpoint(output_dir, step, complete=True):
    """A checkpoint folder as Trainer writes it; a complete one is sealed by its manifest, as
    pretrain/run.py seals every checkpoint once all of it is written."""
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    save_file({"weight": torch.zeros(4)}, folder / "model.safetensors")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if complete:
        manifest = {"files": file_digests(folder), "run_identity": {}}
        (folder / CHECKPOINT_MANIFEST_FILE).write_text(json.dumps(manifest))
    return folder


def test_auto_resume_takes_the_newest_whole_checkpoint_and_moves_newer_damaged_ones_aside(
    tmp_path,
):
    make_checkpoint(tmp_path, 4)
    make_checkpoint(tmp_path, 8)
    damaged = make_checkpoint(tmp_path, 12)
    (damaged / "model.safetensors").write_bytes(b"\0" * 8)  # truncated after it was sealed
    make_checkpoint(tmp_path, 16, complete=False)  # a save cut short

    chosen, skipped = resolve_resume_checkpoint(tmp_path, "auto", is_main=True)
    assert chosen == tmp_path / "checkpoint-8"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-8", "checkpoint-4"]
    # Moved aside, never deleted, and named with the reason.
    assert [item["moved_to"] for item in skipped] == [
        "damaged-checkpoint-16",
        "damaged-checkpoint-12",
    ]
    assert "no checkpoint_manifest.json" in skipped[0]["damage"]
    assert "8 bytes" in skipped[1]["damage"]
    assert (tmp_path / "damaged-checkpoint-12" / "model.safetensors").read_bytes() == b"\0" * 8


def test_a_checkpoint_is_whole_only_while_every_file_matches_its_manifest(tmp_path):
    checkpoint = make_checkpoint(tmp_path, 4)
    assert checkpoint_damage(checkpoint) is None
    weights = (checkpoint / "model.safetensors").read_bytes()
    (checkpoint / "model.safetensors").write_bytes(weights[:-1] + b"\1")  # same size
    assert "model.safetensors changed" in checkpoint_damage(checkpoint)
    (checkpoint / "trainer_state.json").unlink()
    assert checkpoint_damage(checkpoint) == "trainer_state.json is missing"
    assert "no checkpoint_manifest.json" in checkpoint_damage(make_checkpoint(tmp_path, 8, False))


def reseal(checkpoint: Path, **extra: dict) -> None:
    """Rewrite the manifest to match what the folder now holds, as a planter would."""
    files = {**file_digests(checkpoint, skip=(CHECKPOINT_MANIFEST_FILE,)), **extra}
    (checkpoint / CHECKPOINT_MANIFEST_FILE).write_text(
        json.dumps({"files": files, "run_identity": {}})
    )


@pytest.mark.parametrize("outside", ["../document_split.json", "/etc/hostname"])
def test_a_manifest_naming_files_outside_its_checkpoint_is_damage(tmp_path, outside):
    make_checkpoint(tmp_path, 4)
    newest = make_checkpoint(tmp_path, 8)
    (tmp_path / "document_split.json").write_text("{}")
    reseal(newest, **{outside: file_digests(tmp_path)["document_split.json"]})
    assert checkpoint_damage(newest) == f"its manifest names {outside}, outside checkpoint-8/"
    chosen, skipped = resolve_resume_checkpoint(tmp_path, "auto", is_main=True)
    assert chosen == tmp_path / "checkpoint-4" and skipped[0]["checkpoint"] == "checkpoint-8"


def test_a_file_linked_into_a_checkpoint_or_one_it_did_not_seal_is_damage(tmp_path):
    """Another run's weights behind a symbolic link, the manifest resealed, are not trained on;
    nor is a file the manifest does not list."""
    other = make_checkpoint(tmp_path / "other_run", 4)
    checkpoint = make_checkpoint(tmp_path, 8)
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "model.safetensors").symlink_to(other / "model.safetensors")
    reseal(checkpoint)
    assert checkpoint_damage(checkpoint) == (
        "model.safetensors is a symbolic link, not a file of checkpoint-8/"
    )
    (checkpoint / "model.safetensors").unlink()
    shutil.copy(other / "model.safetensors", checkpoint / "model.safetensors")
    reseal(checkpoint)
    assert checkpoint_damage(checkpoint) is None
    (checkpoint / "global_step8").mkdir()
    (checkpoint / "global_step8" / "extra.pt").write_bytes(b"\0")
    assert checkpoint_damage(checkpoint) == "global_step8/extra.pt was not sealed"


def test_a_saved_model_or_an_unreadable_manifest_is_no_checkpoint_to_resume(tmp_path):
    # A run's final/ is sealed like a checkpoint but has no trainer state to resume.
    final = tmp_path / FINAL_MODEL_DIR
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"\0" * 16)
    (final / CHECKPOINT_MANIFEST_FILE).write_text(json.dumps({"files": file_digests(final)}))
    with pytest.raises(InputError, match="a saved model, not a checkpoint"):
        resolve_resume_checkpoint(tmp_path, str(final), is_main=True)
    # A damaged manifest is damage, and left as it is.
    checkpoint = make_checkpoint(tmp_path, 4)
    (checkpoint / CHECKPOINT_MANIFEST_FILE).write_text("{")
    assert "unreadable" in checkpoint_damage(checkpoint)
    assert (checkpoint / CHECKPOINT_MANIFEST_FILE).read_text() == "{"


def test_auto_resume_without_checkpoints_starts_fresh(tmp_path):
    assert resolve_resume_checkpoint(tmp_path / "new", "auto", is_main=True) == (None, [])
    make_checkpoint(tmp_path, 3, complete=False)
    assert resolve_resume_checkpoint(tmp_path, "auto", is_main=False)[0] is None
    assert (tmp_path / "checkpoint-3").exists()  # only the main process moves it aside


def test_a_new_run_refuses_a_folder_with_checkpoints(tmp_path):
    make_checkpoint(tmp_path, 4)
    with pytest.raises(InputError, match="--resume_from_checkpoint auto"):
        resolve_resume_checkpoint(tmp_path, None, is_main=True)
    with pytest.raises(InputError, match="cannot be resumed from: no checkpoint_manifest.json"):
        resolve_resume_checkpoint(tmp_path, str(make_checkpoint(tmp_path, 5, False)), True)


def wait_for_complete_checkpoint(output_dir, process=None, min_step=1):
    """Block until a checkpoint of `min_step` or later is sealed by its manifest."""
    while True:
        steps = [
            checkpoint_global_step(p) or 0
            for p in list_checkpoints(output_dir)
            if (p / CHECKPOINT_MANIFEST_FILE).is_file()
        ]
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
    assert stopped_at % 2 == 0  # a logging step (--logging_steps 2): no logging window split
    assert not (output_dir / GPT_SUMMARY_FILE).exists()
    assert not (output_dir / FINAL_MODEL_DIR).exists()

    assert main([*argv, "--resume_from_checkpoint", "auto"]) == 0
    summary = read_summary(output_dir)
    assert summary["resumed_from_step"] == stopped_at
    assert summary["global_step"] == summary["max_steps"] == NUM_STEPS
    # The final loss, which decides pass or fail, is the uninterrupted run's.
    uninterrupted = [str(tmp_path / "uninterrupted") if a == str(output_dir) else a for a in argv]
    assert main(uninterrupted) == 0
    assert summary["final_loss"] == read_summary(tmp_path / "uninterrupted")["final_loss"]


def test_a_stop_signal_stops_at_the_next_logging_step():
    """Stopped between logging steps, the run saved a window's first steps unlogged and the
    resumed run logged its rest as the whole window: the final loss moved (7.209 for 7.213)."""
    callback = CheckpointOnSignalCallback()
    callback.received = signal.SIGTERM
    state = TrainerState(logging_steps=2, max_steps=10)
    for step, stops in [(5, False), (6, True)]:
        state.global_step, control = step, TrainerControl()
        callback.on_step_end(TrainingArguments("unused", use_cpu=True), state, control)
        assert control.should_training_stop == control.should_save == stops


def stop_signalled_during_the_all_reduce(rank: int, folder: Path) -> None:
    """Two processes at their logging steps; rank 1 sends rank 0 SIGTERM while rank 0 waits for
    it in the step's all-reduce, then joins. Each writes the step it stopped at."""
    store = f"file://{folder / 'store'}"
    torch.distributed.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    pids = [0, 0]
    torch.distributed.all_gather_object(pids, os.getpid())
    callback, args = CheckpointOnSignalCallback(), TrainingArguments("unused", use_cpu=True)
    state, loader = TrainerState(logging_steps=1, max_steps=10), DataLoader(range(4))
    with callback.caught():
        callback.on_train_begin(args, state, TrainerControl(), train_dataloader=loader)
        for step in range(1, 4):
            if rank == 1 and step == 1:
                time.sleep(2)  # rank 0 is in the all-reduce by now (else it stops at step 1)
                os.kill(pids[0], signal.SIGTERM)
                time.sleep(1)
            state.global_step, control = step, TrainerControl()
            callback.on_step_end(args, state, control)
            if control.should_training_stop:
                (folder / f"stopped-{rank}").write_text(f"{step} {callback.received.name}")
                break
        callback.on_train_end(args, state, TrainerControl())
    torch.distributed.destroy_process_group()


@pytest.mark.multiprocess
def test_a_stop_signal_during_the_processes_agreement_is_kept_for_the_next_step(tmp_path):
    """A signal that came while the processes agreed whether to stop (the all-reduce) was
    overwritten by their answer: the run trained on until the launcher killed it."""
    torch.multiprocessing.spawn(stop_signalled_during_the_all_reduce, (tmp_path,), nprocs=2)
    stops = {(tmp_path / f"stopped-{rank}").read_text() for rank in (0, 1)}
    assert stops in ({"1 SIGTERM"}, {"2 SIGTERM"})  # both at one step, the first after it


def test_a_second_stop_signal_before_the_loop_leaves_the_first_ones_clean_up_running():
    """Ctrl-C reaches a process twice, from the terminal and passed on by its launcher: the
    second came while the first one's StopRequested unwound the run and cut its clean-up short
    (a run folder half removed)."""
    callback, cleaned_up = CheckpointOnSignalCallback(), []
    with pytest.raises(StopRequested), callback.caught():
        try:
            signal.raise_signal(signal.SIGINT)
        finally:
            signal.raise_signal(signal.SIGINT)
            cleaned_up.append(True)
    assert cleaned_up and callback.received == signal.SIGINT


def test_a_changed_setting_of_a_group_is_named_alone(tmp_path):
    saved = {"identity_version": 2, "muon": {"muon_learning_rate": 0.02, "muon_momentum": 0.9}}
    current = {**saved, "muon": {"muon_learning_rate": 0.02, "muon_momentum": 0.95}}
    assert identity_differences(saved, current, tmp_path) == [
        "muon.muon_momentum: 0.95 now, 0.9 in the checkpoint"
    ]


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


@pytest.mark.multiprocess
def test_a_run_with_the_course_optimiser_killed_after_a_checkpoint_resumes_to_the_same_loss(
    data_paths, tmp_path
):
    """The optimizer's whole state (Muon's momentum, AdamW's moments, every group's place in
    the warmup-stable-decay schedule) is in the checkpoint: the resumed run ends exactly where
    the uninterrupted one does."""
    options = {**COURSE_OPTIMISER, "save_steps": SAVE_STEPS, "save_total_limit": NUM_STEPS}
    uninterrupted = tmp_path / "uninterrupted"
    argv = tiny_run_argv(**data_paths, output_dir=uninterrupted, num_blocks=NUM_BLOCKS, **options)
    assert main(argv) == 0
    output_dir = tmp_path / "run"
    argv = tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS, **options)
    process = subprocess.Popen(
        run_script_command(argv), env=subprocess_env(), stdout=subprocess.DEVNULL, text=True
    )
    try:
        wait_for_complete_checkpoint(output_dir, process, min_step=SAVE_STEPS)
        process.kill()
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    checkpoint = list_checkpoints(output_dir)[0]
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    assert sum("momentum_buffer" in s for s in state.values()) == 8  # 4 matrices x 2 layers
    assert sum("exp_avg" in s for s in state.values()) == len(state) - 8

    assert main([*argv, "--resume_from_checkpoint", "auto"]) == 0
    resumed, reference = read_summary(output_dir), read_summary(uninterrupted)
    assert SAVE_STEPS <= resumed["resumed_from_step"] < NUM_STEPS
    assert resumed["eval_loss"] == pytest.approx(reference["eval_loss"], abs=1e-6)
    curve = dict(logged_losses(output_dir / f"checkpoint-{NUM_STEPS}"))
    assert curve == pytest.approx(dict(logged_losses(uninterrupted / f"checkpoint-{NUM_STEPS}")))


@pytest.fixture(scope="module")
def run_with_checkpoints(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    """A finished tiny run that kept a checkpoint every SAVE_STEPS steps; tests copy it."""
    data_paths = shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)
    output_dir = tmp_path_factory.mktemp("checkpointed") / "run"
    argv = tiny_run_argv(
        **data_paths, output_dir=output_dir, save_steps=SAVE_STEPS, save_total_limit=3
    )
    assert main(argv) == 0
    return argv, output_dir


def copy_of_run(run_with_checkpoints, tmp_path, drop_finish: bool):
    """The run folder copied (and its argv pointed at the copy); without its summary and final
    model when `drop_finish`, as if stopped after its last checkpoint."""
    argv, output_dir = run_with_checkpoints
    copy = tmp_path / "run"
    shutil.copytree(output_dir, copy)
    if drop_finish:
        (copy / GPT_SUMMARY_FILE).unlink()
        shutil.rmtree(copy / FINAL_MODEL_DIR)
    return [str(copy) if part == str(output_dir) else part for part in map(str, argv)], copy


def test_a_zero_checkpoint_is_resumed_only_under_the_strategy_and_processes_that_wrote_it(
    run_with_checkpoints, tmp_path, capsys
):
    """Refused in one line before any block is prepared: ZeRO's shards convert to no other."""
    argv, output_dir = copy_of_run(run_with_checkpoints, tmp_path, drop_finish=True)
    newest = list_checkpoints(output_dir)[0]
    manifest = json.loads((newest / CHECKPOINT_MANIFEST_FILE).read_text())
    assert manifest["written_by"] == {"strategy": "single", "num_processes": 1}
    manifest["written_by"] = {"strategy": "zero2", "num_processes": 2}
    (newest / CHECKPOINT_MANIFEST_FILE).write_text(json.dumps(manifest))
    fresh_cache = tmp_path / "fresh_cache"
    argv[argv.index("--cache_dir") + 1] = str(fresh_cache)
    assert main([*argv, "--resume_from_checkpoint", "auto"]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith(
        f"error: {newest.name} was written by ZeRO-2 on 2 processes; this run is one process "
        "on 1 process (only one process, DDP and FSDP2 (full state dict) convert into each "
        "other): resume it with the accelerate config it was written with and --num_processes 2"
    )
    assert not fresh_cache.exists() or not any(fresh_cache.iterdir())


NOT_CONVERTED = "only one process, DDP and FSDP2 (full state dict) convert into each other"


# Every ordered pair with ZeRO on one side (tests/test_pretrain_resume_strategies.py resumes
# the others), and ZeRO on 2 processes resumed by 1.
LAUNCHES = [("single", 1), ("ddp", 2), ("fsdp2", 2), ("zero2", 2), ("zero3", 2)]
ZERO_PAIRS = [(a, b) for a in LAUNCHES for b in LAUNCHES if a != b and "zero" in a[0] + b[0]]
ZERO_PAIRS += [(("zero2", 2), ("zero2", 1)), (("zero3", 2), ("zero3", 1))]


@pytest.mark.parametrize(
    ("written_by", "launched", "why"),
    [
        *((written_by, launched, NOT_CONVERTED) for written_by, launched in ZERO_PAIRS),
        (("single", 1), ("fsdp2", 2), "an earlier release recorded no optimizer parameter names"),
    ],
)
def test_a_checkpoint_that_converts_to_no_other_strategy_is_refused_naming_both(
    tmp_path, written_by, launched, why
):
    written_by, launched = ({"strategy": s, "num_processes": n} for s, n in (written_by, launched))
    checkpoint = make_checkpoint(tmp_path, 4, complete=False)
    torch.save({"state": {}, "param_groups": []}, checkpoint / "optimizer.pt")
    seal_checkpoint(checkpoint, {"run_identity": {}, "written_by": written_by})
    with pytest.raises(InputError) as refusal:
        conversion_needed(checkpoint, launched, is_main=True)
    assert str(refusal.value) == (
        f"checkpoint-4 was written by {strategy_in_words(written_by)}; this run is "
        f"{strategy_in_words(launched)} ({why}): resume it with the accelerate config it was "
        f"written with and --num_processes {written_by['num_processes']}, or start a new run in "
        "another --output_dir"
    )


def test_resuming_a_finished_run_changes_nothing_and_says_so(run_with_checkpoints, capsys):
    argv, output_dir = run_with_checkpoints
    before = {path: path.read_bytes() for path in output_dir.rglob("*") if path.is_file()}
    assert main([*argv, "--resume_from_checkpoint", "auto"]) == 0
    assert "holds a finished run (final loss" in capsys.readouterr().out
    after = {path: path.read_bytes() for path in output_dir.rglob("*") if path.is_file()}
    assert after == before


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"max_train_tokens": 96 * 64 * 2}, "max_train_tokens: 12288 now, 6144 in the checkpoint"),
        ({"per_device_train_batch_size": 8}, "global_batch_blocks: 8 now, 4 in the checkpoint"),
        ({"learning_rate": "2.0e-3"}, "learning_rate: 0.002 now, 0.001 in the checkpoint"),
        ({"vocab_size": 640}, "vocab_size: 640 now, 512 in the checkpoint"),
    ],
)
def test_resuming_with_other_settings_is_refused_naming_them(
    run_with_checkpoints, tmp_path, capsys, changes, named
):
    argv, output_dir = copy_of_run(run_with_checkpoints, tmp_path, drop_finish=True)
    flags = [item for name, value in changes.items() for item in (f"--{name}", str(value))]
    assert main([*argv, *flags, "--resume_from_checkpoint", "auto"]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("error: checkpoint ") and "belongs to another run" in error
    assert named in error


def test_resuming_with_another_tokenizer_of_the_same_size_is_refused(
    run_with_checkpoints, tiny_tokenizer_dir, tmp_path, capsys
):
    argv, output_dir = copy_of_run(run_with_checkpoints, tmp_path, drop_finish=True)
    other = tmp_path / "other_tokenizer"
    shutil.copytree(tiny_tokenizer_dir, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["model_max_length"] = 4096  # another tokenizer folder, the same 512 tokens
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    argv = [str(other) if part == str(tiny_tokenizer_dir) else part for part in argv]
    assert main([*argv, "--resume_from_checkpoint", "auto"]) == 2
    assert "tokenizer: " in capsys.readouterr().err


def test_a_damaged_newest_checkpoint_is_skipped_for_the_newest_whole_one(
    run_with_checkpoints, tmp_path, caplog
):
    argv, output_dir = copy_of_run(run_with_checkpoints, tmp_path, drop_finish=True)
    newest, previous = list_checkpoints(output_dir)[:2]
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated by a crash or a full disk
    with caplog.at_level(logging.WARNING, logger="pretrain.checkpoints"):
        assert main([*argv, "--resume_from_checkpoint", "auto"]) == 0
    assert f"skipping {newest.name}: model.safetensors has 100 bytes" in caplog.text
    summary = read_summary(output_dir)
    assert summary["resumed_from_step"] == checkpoint_global_step(previous)
    (skipped,) = summary["skipped_checkpoints"]
    assert skipped["checkpoint"] == newest.name and skipped["moved_to"] == f"damaged-{newest.name}"
    assert (output_dir / skipped["moved_to"] / "model.safetensors").stat().st_size == 100
    # A damaged checkpoint named explicitly is refused, not half-loaded.
    (optimizer := list_checkpoints(output_dir)[-1] / "optimizer.pt").write_bytes(b"\0")
    with pytest.raises(InputError, match="optimizer.pt has 1 bytes"):
        resolve_resume_checkpoint(output_dir, str(optimizer.parent), is_main=True)


def test_a_checkpoint_without_a_manifest_is_moved_aside_never_resumed(
    run_with_checkpoints, tmp_path, caplog
):
    """Its files cannot be checked: weights replaced by random values, as in a save cut short
    or a copy by another tool, are never trained on; the previous whole checkpoint is."""
    argv, output_dir = copy_of_run(run_with_checkpoints, tmp_path, drop_finish=True)
    newest, previous = list_checkpoints(output_dir)[:2]
    (newest / CHECKPOINT_MANIFEST_FILE).unlink()
    weights = load_file(newest / "model.safetensors")
    save_file({name: torch.randn_like(tensor) for name, tensor in weights.items()},
              newest / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="pretrain.checkpoints"):
        assert main([*argv, "--resume_from_checkpoint", "auto"]) == 0
    assert f"skipping {newest.name}: no {CHECKPOINT_MANIFEST_FILE}" in caplog.text
    summary = read_summary(output_dir)
    assert summary["resumed_from_step"] == checkpoint_global_step(previous)
    assert summary["final_loss"] < 7  # trained on from whole weights, not random ones
    assert (output_dir / f"damaged-{newest.name}" / "model.safetensors").is_file()
    with pytest.raises(InputError, match=f"no {CHECKPOINT_MANIFEST_FILE}"):
        resolve_resume_checkpoint(output_dir, str(output_dir / f"damaged-{newest.name}"), True)


def test_resuming_a_finished_run_with_other_settings_is_refused_naming_them(
    run_with_checkpoints, tmp_path, capsys
):
    argv, output_dir = copy_of_run(run_with_checkpoints, tmp_path, drop_finish=False)
    before = (output_dir / GPT_SUMMARY_FILE).read_bytes()
    assert main([*argv, "--learning_rate", "2.0e-3", "--resume_from_checkpoint", "auto"]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert "holds a finished run of other settings" in error
    assert "learning_rate: 0.002 now, 0.001 in that run" in error
    assert (output_dir / GPT_SUMMARY_FILE).read_bytes() == before


def test_a_signal_after_the_last_step_still_finishes_the_run(data_paths, tmp_path):
    output_dir = tmp_path / "run"
    argv = tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS)

    def signal_after_the_last_checkpoint():
        wait_for_complete_checkpoint(output_dir, min_step=NUM_STEPS)
        signal.raise_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    sender = threading.Thread(target=signal_after_the_last_checkpoint, daemon=True)
    try:
        sender.start()
        assert main(argv) == 0
        sender.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert read_summary(output_dir)["global_step"] == NUM_STEPS
    assert (output_dir / FINAL_MODEL_DIR / "config.json").is_file()


@pytest.mark.multiprocess
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stop_before_the_first_step_stops_at_once_and_leaves_no_folder(
    data_paths, tmp_path, stop_signal
):
    output_dir = tmp_path / "run"
    argv = tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS)
    process = subprocess.Popen(
        run_script_command(argv), env=subprocess_env(), stderr=subprocess.PIPE, text=True
    )
    try:
        while not (output_dir / ".lock").exists() and process.poll() is None:
            time.sleep(POLL_SECONDS)
        process.send_signal(stop_signal)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + stop_signal, stderr[-2000:]
    # Before training started, or while its blocks were built: which, the signal's time decides.
    when = "(before training started|while preparing blocks)"
    assert re.search(f"stopped by {stop_signal.name} {when}; nothing was kept", stderr), stderr[
        -2000:
    ]
    assert not output_dir.exists()


def test_a_stop_after_the_set_up_wrote_in_the_folder_still_removes_it(tmp_path):
    """A signal can land after the set-up wrote its files (TensorBoard's, the document split)
    and before the loop: the folder the run created goes all the same; an error keeps it."""
    training_args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    for ending, kept in [(StopRequested(signal.SIGTERM), False), (RuntimeError("bug"), True)]:
        output_dir = tmp_path / type(ending).__name__
        with pytest.raises(type(ending)), hold_run_folder(output_dir, training_args):
            (output_dir / TENSORBOARD_DIR).mkdir()
            raise ending
        assert output_dir.exists() == kept


@pytest.mark.multiprocess
def test_a_signal_saves_a_checkpoint_without_periodic_ones(data_paths, tmp_path):
    """The course config saves no periodic checkpoint; Slurm's warning still gets one."""
    output_dir = tmp_path / "run"
    argv = tiny_run_argv(
        **data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS * 10, save_strategy="no"
    )
    process = subprocess.Popen(
        run_script_command(argv), env=subprocess_env(), stderr=subprocess.PIPE, text=True
    )
    try:
        # A loss in TensorBoard: the loop runs (the events file itself is written before it).
        while (
            not (output_dir / TENSORBOARD_DIR).is_dir()
            or not EventAccumulator(str(output_dir / TENSORBOARD_DIR)).Reload().Tags()["scalars"]
        ):
            assert process.poll() is None, process.stderr.read()[-2000:]
            time.sleep(POLL_SECONDS)
        process.send_signal(signal.SIGUSR1)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGUSR1, stderr[-2000:]
    (checkpoint,) = list_checkpoints(output_dir)
    assert checkpoint_damage(checkpoint) is None


def test_a_finished_run_whose_summary_records_no_identity_cannot_be_compared(
    run_with_checkpoints, tmp_path, capsys
):
    """Summaries before version 3 (30c6c0a's) record no run identity: other settings cannot be
    told from the same ones, so neither is taken for 'nothing to do'."""
    argv, output_dir = copy_of_run(run_with_checkpoints, tmp_path, drop_finish=False)
    summary = read_summary(output_dir)
    del summary["run_identity"]
    (output_dir / GPT_SUMMARY_FILE).write_text(json.dumps({**summary, "summary_version": 2}))
    assert main([*argv, "--learning_rate", "2.0e-3", "--resume_from_checkpoint", "auto"]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert "records no run identity: it cannot be compared with these settings" in error


RELEASE_FIXTURES = Path(__file__).parent / "fixtures" / "release_checkpoints"
RELEASES = sorted(path.parent.name for path in RELEASE_FIXTURES.glob("*/written_by.json"))


def release_fixture_folder(tmp_path: Path, release: str | None = None) -> list[str]:
    """The fixture's corpus, tokenizer and config in `tmp_path` (and the run folder a release
    left, as `run/`); the command line of its run, relative to `tmp_path`."""
    for name in ("corpus", "tokenizer", "run.yaml"):
        copy = shutil.copytree if (RELEASE_FIXTURES / name).is_dir() else shutil.copyfile
        copy(RELEASE_FIXTURES / name, tmp_path / name)
    if release is not None:
        shutil.copytree(
            RELEASE_FIXTURES / release,
            tmp_path / "run",
            ignore=shutil.ignore_patterns("written_by.json"),
        )
    return ["--config", "run.yaml", "--output_dir", "run"]


@pytest.fixture(scope="module")
def uninterrupted_release_run(tmp_path_factory):
    """The fixture's run trained from step 0 to the end by this checkout."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    argv = release_fixture_folder(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        assert main(argv) == 0
    return read_summary(folder / "run")


@pytest.mark.parametrize("release", RELEASES)
def test_a_checkpoint_written_by_an_earlier_release_resumes_to_the_uninterrupted_loss(
    release, uninterrupted_release_run, tmp_path, monkeypatch, caplog
):
    argv = release_fixture_folder(tmp_path, release)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="pretrain.checkpoints"):
        assert main([*argv, "--resume_from_checkpoint", "auto"]) == 0
    (warning,) = [line for line in caplog.messages if "strategy that wrote it" in line]
    assert warning.endswith("(an older release): resuming it as one process on 1 process")
    summary = read_summary(tmp_path / "run")
    assert summary["resumed_from_step"] == 8
    assert summary["global_step"] == uninterrupted_release_run["global_step"] == 16
    for loss in ("final_loss", "eval_loss"):
        assert summary[loss] == pytest.approx(uninterrupted_release_run[loss], rel=1e-5)


@pytest.mark.parametrize(
    "manifest",
    ["{}", "[]", '{"files": []}', '{"files": {"model.safetensors": 16}}', "RUN_IDENTITY_LIST"],
)
def test_a_checkpoint_manifest_of_the_wrong_shape_is_damage_moved_aside(tmp_path, manifest):
    output_dir = tmp_path / "run"
    make_checkpoint(output_dir, 4)
    newest = make_checkpoint(output_dir, 8)
    if manifest == "RUN_IDENTITY_LIST":  # files as written, the identity of another type
        manifest = json.dumps({"files": file_digests(newest), "run_identity": []})
    (newest / CHECKPOINT_MANIFEST_FILE).write_text(manifest)
    resumed, skipped = resolve_resume_checkpoint(output_dir, "auto", is_main=True)
    assert resumed == output_dir / "checkpoint-4"
    assert skipped == [
        {
            "checkpoint": "checkpoint-8",
            "damage": f"its {CHECKPOINT_MANIFEST_FILE} is unreadable",
            "moved_to": "damaged-checkpoint-8",
        }
    ]
    assert (output_dir / "damaged-checkpoint-8" / CHECKPOINT_MANIFEST_FILE).read_text() == manifest
    with pytest.raises(InputError, match="is unreadable; pass a complete checkpoint"):
        resolve_resume_checkpoint(output_dir, str(output_dir / "damaged-checkpoint-8"), True)


@pytest.mark.parametrize("summary", ["{}", "[]", '{"summary_version": 3}', "VERDICT_NUMBER"])
def test_a_finished_run_whose_summary_has_the_wrong_shape_is_one_line(
    run_with_checkpoints, tmp_path, capsys, summary
):
    argv, output_dir = copy_of_run(run_with_checkpoints, tmp_path, drop_finish=False)
    if summary == "VERDICT_NUMBER":
        summary = json.dumps({**read_summary(output_dir), "verdict": 1})
    (output_dir / GPT_SUMMARY_FILE).write_text(summary)
    assert main([*argv, "--resume_from_checkpoint", "auto"]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("error: ") and GPT_SUMMARY_FILE in error
    assert (output_dir / GPT_SUMMARY_FILE).read_text() == summary


@pytest.mark.parametrize("name", ["optimizer.pt", "rng_state.pth", "training_args.bin"])
def test_no_pickle_in_a_checkpoint_runs_as_code(run_with_checkpoints, tmp_path, caplog, name):
    """A planted pickle, the manifest rewritten to match: each file Trainer resumes from is
    loaded first as Trainer loads it (tensors only), never an object that runs code; one that
    does not load moves its checkpoint aside, and the run continues from the previous one."""
    argv, output_dir = copy_of_run(run_with_checkpoints, tmp_path, drop_finish=True)
    newest, previous = list_checkpoints(output_dir)[:2]
    marker = tmp_path / "marker"
    torch.save(WritesAMarkerWhenUnpickled(marker), newest / name)
    record = json.loads((newest / CHECKPOINT_MANIFEST_FILE).read_text())
    seal_checkpoint(newest, {key: value for key, value in record.items() if key != "files"})
    if name == "training_args.bin":  # Trainer never loads it: the checkpoint is whole
        assert checkpoint_damage(newest) is None
    else:
        with caplog.at_level(logging.WARNING, logger="pretrain.checkpoints"):
            assert main([*argv, "--resume_from_checkpoint", "auto"]) == 0
        assert read_summary(output_dir)["resumed_from_step"] == checkpoint_global_step(previous)
        (skipped,) = read_summary(output_dir)["skipped_checkpoints"]
        assert skipped["damage"].startswith(f"{name} does not load as tensors only (Unpickling")
    assert not marker.exists()
