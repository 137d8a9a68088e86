"""pretrain/run.py end to end on a tiny model: learning, run folder, TensorBoard, sampling, configs,
and the one-line errors for bad input."""

import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from accelerate.utils.other import get_free_port
from pretrain_runs import (
    BLOCK_SIZE,
    TINY_CONFIG,
    logged_losses,
    read_summary,
    run_script_command,
    shared_data_paths,
    small_disk,
    subprocess_env,
    tiny_run_argv,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments, get_scheduler

from common.cli import InputError
from common.files import file_digests, sealed_folder_damage
from common.run_contract import (
    CHECKPOINT_MANIFEST_FILE,
    DOCUMENT_SPLIT_FILE,
    EVAL_LOSS,
    FINAL_MODEL_DIR,
    GPT_REQUIRED_KEYS,
    GPT_SUMMARY_FILE,
    GPT_SUMMARY_VERSION,
    GRAD_NORM,
    LEARNING_RATE,
    MFU,
    NVIDIA_SMI_FILE,
    TENSORBOARD_DIR,
    TOKENS_PER_SECOND,
    TRAIN_LOSS,
)
from pretrain import generate
from pretrain.args import resolve_decay_steps
from pretrain.blocks.cache import load_blocks
from pretrain.library_fixes import (
    COMPILE_CACHE_MANIFEST,
    compile_cache_distrust,
    use_compile_cache,
)
from pretrain.prepare_blocks import main as prepare_blocks_main
from pretrain.run import main, parse_pretrain_args
from report.build import write_report

NUM_BLOCKS = 96  # 24 steps of 4 blocks
GPT2_CONFIG = TINY_CONFIG.with_name("gpt2_117m.yaml")
# Lines libraries print on every run that say nothing about it; each is removed at its cause.
LIBRARY_NOISE = (
    "loss_type=",  # transformers, when the model's class names none of its losses
    "Setting accelerator to CPU",  # DeepSpeed, imported by accelerate when installed
    "Writing model shards",  # transformers' save bar, despite --disable_tqdm
    "Saving the dataset",  # datasets' bars, despite --disable_tqdm
    "Tokenizing documents",
    "No CUDA runtime is found",  # torch.compile's C++ build on a CPU
    "The speedups for torchdynamo",  # TrainingArguments, compiling on a CPU
    "recompile_limit",  # dynamo: our one line says it, with its reason
)

# The line both loops log at a logging step (MFU only where the peak is known); 12s, 2m10s, 1h02m.
DURATION = r"\d+(?:s|m\d\ds|h\d\dm)"
PROGRESS_LINE = re.compile(
    rf"INFO pretrain\.metrics: step (\d+)/{NUM_BLOCKS // 4}: loss \d+\.\d{{4}}, lr \d\.\de-\d\d, "
    rf"[\d,]+ tokens/s, mfu \d+%, {DURATION} elapsed, {DURATION} left$",
    re.MULTILINE,
)


@pytest.fixture(scope="module")
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_run_process(data_paths, tmp_path_factory):
    """One finished tiny run (24 steps) started as a user starts it, with its output;
    MFU against a made-up 1 TFLOP/s peak."""
    output_dir = tmp_path_factory.mktemp("tiny") / "run"
    argv = tiny_run_argv(
        **data_paths,
        output_dir=output_dir,
        num_blocks=NUM_BLOCKS,
        peak_tflops=1,
        expected_final_loss=5.5,
        expected_final_loss_margin=0.25,
    )
    finished = subprocess.run(
        run_script_command(argv), env=subprocess_env(), capture_output=True, text=True, check=False
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return output_dir, finished


@pytest.fixture(scope="module")
def tiny_run(tiny_run_process):
    return tiny_run_process[0]


@pytest.mark.slow
def test_tiny_run_learns_and_writes_its_summary(tiny_run):
    summary = read_summary(tiny_run)
    assert set(GPT_REQUIRED_KEYS) <= set(summary)
    assert summary["summary_version"] == GPT_SUMMARY_VERSION
    assert summary["max_steps"] == summary["global_step"] == NUM_BLOCKS // 4
    assert summary["tokens_trained"] == NUM_BLOCKS * BLOCK_SIZE
    assert summary["global_batch_tokens"] == 4 * BLOCK_SIZE
    assert summary["num_processes"] == 1 and summary["replicas_in_sync"] is True
    assert summary["final_loss_window"] == 3
    # A random model starts near ln(vocabulary) = ln(512) = 6.24; 24 steps must bring it down.
    first_loss = logged_losses(tiny_run / f"checkpoint-{NUM_BLOCKS // 4}")[0][1]
    assert first_loss > 5.5
    assert summary["final_loss"] < first_loss - 0.5
    assert summary["verdict"] == ("pass" if summary["final_loss"] < 7.0 else "fail")
    assert summary["expected_final_loss"] == [5.5, 0.25]  # the prediction, beside final_loss
    assert summary["perplexity"] == pytest.approx(math.exp(summary["eval_loss"]))
    assert summary["tokens_per_second"] > 0 and summary["train_loop_seconds"] > 0
    assert summary["wall_seconds"] > summary["train_loop_seconds"]
    assert 0 < summary["mfu"] < 1
    assert set(summary["config"]) >= {
        "ModelArguments",
        "CorpusArguments",
        "DataArguments",
        "ReportArguments",
        "TrainingArguments",
        "model_config",
    }
    configured = parse_pretrain_args(["--config", str(TINY_CONFIG)]).training.learning_rate
    assert summary["config"]["TrainingArguments"]["learning_rate"] == configured
    assert summary["speed_settings"]["precision"] == "fp32"
    assert summary["speed_settings"]["attn_implementation"] == "sdpa"
    assert "Device: cpu" in summary["accelerator_state"]
    assert summary["data"]["splits"]["train"]["num_blocks"] == NUM_BLOCKS
    # Which documents each split held, by hash, for the stages that read the run folder later.
    split = json.loads((tiny_run / DOCUMENT_SPLIT_FILE).read_text())
    for name in ("train", "validation"):
        assert len(set(split[name])) == summary["data"]["splits"][name]["num_documents"]
    assert {"cpu_count", "platform"} <= set(summary["hardware"])
    assert summary["versions"]["transformers"]


@pytest.mark.slow
def test_prepare_blocks_given_a_run_s_options_builds_the_cache_that_run_read(
    data_paths, tiny_run, tmp_path, capsys
):
    """`prepare-blocks` with a run's own flags and config prints the folder the run read; one
    block short of a whole batch, it rounds up as the run does, and the blocks' options alone
    keep the budget as given."""
    run_flags = tiny_run_argv(**data_paths, output_dir=tmp_path / "run", num_blocks=NUM_BLOCKS)
    assert prepare_blocks_main(run_flags) == 0
    assert capsys.readouterr().out.strip() == read_summary(tiny_run)["data"]["cache_dir"]

    short = tiny_run_argv(**data_paths, output_dir=tmp_path / "run", num_blocks=NUM_BLOCKS - 1)
    assert prepare_blocks_main(short) == 0
    assert capsys.readouterr().out.strip() == read_summary(tiny_run)["data"]["cache_dir"]
    corpus, tokenizer, cache = (
        data_paths[key] for key in ("corpus_dir", "tokenizer_dir", "cache_dir")
    )
    block_flags = ["--corpus", str(corpus), "--tokenizer_dir", str(tokenizer), "--cache_dir",
                   str(cache), "--block_size", str(BLOCK_SIZE),
                   "--max_train_tokens", str((NUM_BLOCKS - 1) * BLOCK_SIZE)]  # fmt: skip
    assert prepare_blocks_main(block_flags) == 0
    folder = capsys.readouterr().out.strip()
    assert len(load_blocks(folder)["train"]) == NUM_BLOCKS - 1


@pytest.mark.slow
def test_bits_per_byte_is_the_validation_text_s_nats_per_byte(tiny_run):
    """Measured directly: the final model's summed loss over the validation blocks' predicted
    tokens, over the bytes those tokens stand for, counted from the byte-level vocabulary (one
    symbol per byte; end-of-text as the line's newline)."""
    summary = read_summary(tiny_run)
    model = AutoModelForCausalLM.from_pretrained(tiny_run / FINAL_MODEL_DIR).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_run / FINAL_MODEL_DIR)
    input_ids = load_blocks(summary["data"]["cache_dir"])["validation"][:]["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits[:, :-1]
    targets = input_ids[:, 1:]
    nats = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="sum")
    tokens = tokenizer.convert_ids_to_tokens(targets.flatten().tolist())
    num_bytes = sum(1 if token == tokenizer.eos_token else len(token) for token in tokens)
    assert summary["bits_per_byte"] == pytest.approx(nats.item() / num_bytes / math.log(2))


@pytest.mark.slow
def test_tensorboard_events_land_in_the_run_folder(tiny_run):
    accumulator = EventAccumulator(str(tiny_run / TENSORBOARD_DIR))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {TRAIN_LOSS, LEARNING_RATE, GRAD_NORM, TOKENS_PER_SECOND, MFU, EVAL_LOSS} <= tags
    assert not any(tag.startswith("gpu/") for tag in tags)  # no GPU here
    loss_steps = [event.step for event in accumulator.Scalars(TRAIN_LOSS)]
    assert loss_steps == [1, *range(2, NUM_BLOCKS // 4 + 1, 2)]
    assert not (tiny_run / NVIDIA_SMI_FILE).exists()


@pytest.mark.slow
def test_a_tiny_run_logs_our_lines_and_no_library_noise(tiny_run_process):
    _, finished = tiny_run_process
    log = finished.stdout + finished.stderr
    assert [line for line in log.splitlines() if any(text in line for text in LIBRARY_NOISE)] == []
    assert "\r" not in log  # no progress bar of any library with --disable_tqdm
    # A clean run gives no warning of ours (a library's new deprecation is not this test's).
    assert [line for line in log.splitlines() if " WARNING pretrain." in line] == []
    assert "INFO pretrain.model: GPT-2 2 layers x 64 wide" in finished.stderr
    # One progress line per logging step, ours, with every field (MFU: the peak is given).
    steps = [int(step) for step in PROGRESS_LINE.findall(finished.stderr)]
    assert steps == [1, *range(2, NUM_BLOCKS // 4 + 1, 2)]
    assert "{'loss'" not in log
    assert f"run folder {tiny_run_process[0]}" in finished.stdout
    assert "(below 7; predicted 5.50 +- 0.25), eval loss" in finished.stdout  # the headline


@pytest.mark.slow
def test_final_model_loads_and_samples_text(tiny_run, capsys):
    model = AutoModelForCausalLM.from_pretrained(tiny_run / FINAL_MODEL_DIR)
    assert model.config.vocab_size == 512 and model.config.n_layer == 2
    assert (tiny_run / FINAL_MODEL_DIR / "model.safetensors").is_file()
    assert (tiny_run / FINAL_MODEL_DIR / "tokenizer.json").is_file()

    assert generate.main([str(tiny_run), "--prompt", "The method", "--max_new_tokens", "8"]) == 0
    text = capsys.readouterr().out.strip()
    assert text.startswith("The method") and len(text) > len("The method")


@pytest.mark.slow
def test_chunked_loss_trains_like_the_hf_loss(data_paths, tiny_run, tmp_path):
    output_dir = tmp_path / "chunked"
    argv = tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS)
    assert main([*argv, "--peak_tflops", "1", "--loss_implementation", "chunked"]) == 0
    # The variable that points transformers at the folder is set only while Trainer is created.
    assert os.environ.get("TENSORBOARD_LOGGING_DIR") != str(output_dir / TENSORBOARD_DIR)
    assert read_summary(output_dir)["speed_settings"]["loss_implementation"] == "chunked"
    last = f"checkpoint-{NUM_BLOCKS // 4}"
    chunked, reference = logged_losses(output_dir / last), logged_losses(tiny_run / last)
    assert [step for step, _ in chunked] == [step for step, _ in reference]
    assert [loss for _, loss in chunked] == pytest.approx([loss for _, loss in reference], abs=1e-3)
    assert read_summary(output_dir)["eval_loss"] == pytest.approx(
        read_summary(tiny_run)["eval_loss"], abs=1e-3
    )


def test_generate_without_a_model_is_one_line_error(tmp_path, capsys):
    assert generate.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
def test_generate_from_a_final_model_missing_a_file_is_one_line_error(tiny_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny_run / FINAL_MODEL_DIR, run / FINAL_MODEL_DIR)
    (run / FINAL_MODEL_DIR / "tokenizer.json").unlink()
    assert generate.main([str(run)]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("error: model folder ") and "tokenizer.json is missing" in error


def test_every_key_of_a_config_reaches_the_options_and_flags_win():
    config = yaml.safe_load(TINY_CONFIG.read_text())
    flags = {"learning_rate": 1.0e-4, "block_size": 32}
    argv = [str(item) for name, value in flags.items() for item in (f"--{name}", value)]
    parsed = parse_pretrain_args(["--config", str(TINY_CONFIG), *argv])
    values = {
        name: getattr(options, name)
        for options in parsed
        for name in config
        if hasattr(options, name)
    }
    assert set(values) == set(config), "every key of the YAML is an option"
    for name, value in {**config, **flags}.items():
        parsed_value = values[name]
        parsed_value = getattr(parsed_value, "value", parsed_value)  # an enum of transformers
        assert parsed_value == value or [parsed_value] == value, name


@pytest.mark.parametrize("config", sorted(TINY_CONFIG.parent.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_parses_its_numbers_as_numbers(config):
    """YAML reads 6e-4 (no dot) as a string: Trainer would then fail at the first step."""
    options = yaml.safe_load(config.read_text())
    parsed = {type(a).__name__: a for a in parse_pretrain_args(["--config", str(config)])}
    training = parsed["PretrainTrainingArguments"]
    for name, value in options.items():
        if isinstance(value, str) and re.fullmatch(r"[-+.\d]+e[-+]?\d+", value):
            pytest.fail(f"{config.name}: {name}: {value!r} is a string to YAML; write 1.0e-3")
    assert isinstance(training.learning_rate, float) and training.max_steps == -1


def test_shipped_configs_agree_on_shared_choices():
    tiny = parse_pretrain_args(["--config", str(TINY_CONFIG)]).training
    course = parse_pretrain_args(["--config", str(GPT2_CONFIG)]).training
    # Not the betas: the course's go with its Muon recipe, tiny's with AdamW alone.
    for name in ("eval_strategy", "report_to", "weight_decay", "max_grad_norm"):
        assert getattr(tiny, name) == getattr(course, name), name


def test_unknown_config_key_is_rejected(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text(TINY_CONFIG.read_text() + "learning_rte: 1.0e-3\n")
    with pytest.raises(InputError, match="learning_rte.*learning_rate"):
        parse_pretrain_args(["--config", str(config)])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"model_preset": "gpt5"}, "unknown model preset 'gpt5'"),
        ({"block_size": 512}, "--block_size 512 is longer than the 256 positions of preset"),
        ({"vocab_size": 256}, "vocab_size 256 is smaller than the tokenizer's 512 tokens"),
        ({"max_train_tokens": 100}, "less than one global batch of 256 tokens"),
        (
            {
                "lr_scheduler_type": "warmup_stable_decay",
                "lr_scheduler_kwargs": '{"num_decay_steps": 30}',
            },
            "num_decay_steps 30 and 0 warmup steps do not fit in this run's 24 steps",
        ),
        ({"corpus": "/no/such/corpus.txt"}, "/no/such/corpus.txt"),
        ({"resume_from_checkpoint": "/no/checkpoint-3"}, "cannot be resumed from: it does not"),
        # Options that need the network or a package not installed: refused before any work.
        ({"report_to": "wandb"}, "--report_to wandb is not installed here"),
        ({"push_to_hub": "true"}, "--push_to_hub needs the network and a Hugging Face token"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(data_paths, tmp_path, capsys, flags, message):
    output_dir = tmp_path / "run"
    assert main(tiny_run_argv(**data_paths, output_dir=output_dir, **flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert message in err
    assert not output_dir.exists()


def test_a_decay_given_as_a_share_of_the_steps_ends_the_run_s_schedule(tmp_path):
    args = TrainingArguments(
        tmp_path, max_steps=184, warmup_steps=0.05, lr_scheduler_type="warmup_stable_decay",
        lr_scheduler_kwargs={"num_decay_steps": 0.65, "decay_type": "linear", "min_lr_ratio": 0.05},
    )  # fmt: skip
    resolve_decay_steps(args)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler(
        args.lr_scheduler_type, optimizer, args.get_warmup_steps(184), 184,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )  # fmt: skip
    rates = []
    for _ in range(184):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    # 10 warmup steps, 54 at the peak, then 120 (0.65 x 184, rounded up) from the peak to 5%.
    assert rates.index(1.0) == 10 and rates.count(1.0) == 55
    assert all(later < earlier for earlier, later in zip(rates[64:-1], rates[65:], strict=True))
    assert rates[-1] == pytest.approx(0.05, abs=0.01)


@pytest.mark.parametrize("steps", [1, 2, 3, 7])
def test_a_decay_share_fits_a_run_of_a_few_steps(tmp_path, steps):
    """A check run of the course config (--max_steps 2) is not refused for its warmdown: the
    share rounds up, but not into the warmup."""
    args = TrainingArguments(
        tmp_path, max_steps=steps, warmup_steps=0.05, lr_scheduler_type="warmup_stable_decay",
        lr_scheduler_kwargs={"num_decay_steps": 0.65},
    )  # fmt: skip
    resolve_decay_steps(args)
    decay = args.lr_scheduler_kwargs["num_decay_steps"]
    assert decay >= 0 and args.get_warmup_steps(steps) + decay <= steps
    assert decay == math.ceil(0.65 * steps) or decay == steps - args.get_warmup_steps(steps)


def test_missing_tokenizer_is_one_line_and_exit_2(data_paths, tmp_path, capsys):
    paths = {**data_paths, "tokenizer_dir": tmp_path / "no_tokenizer"}
    assert main(tiny_run_argv(**paths, output_dir=tmp_path / "run")) == 2
    assert "tokenizer folder" in capsys.readouterr().err


@pytest.mark.slow
def test_a_finished_run_folder_is_not_overwritten(data_paths, tiny_run, capsys):
    summary_before = (tiny_run / GPT_SUMMARY_FILE).read_bytes()
    assert main(tiny_run_argv(**data_paths, output_dir=tiny_run)) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (tiny_run / GPT_SUMMARY_FILE).read_bytes() == summary_before


# --- faults: a run that diverges, two runs at once, a full disk --------------------------------


def strict_json(path):
    """A JSON file as a strict parser reads it: NaN or Infinity is an error."""

    def refuse(constant):
        raise ValueError(f"{path} holds {constant}, which strict JSON does not")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_diverged_run_stops_fails_in_one_line_and_never_passes(data_paths, tmp_path, capsys):
    output_dir = tmp_path / "run"
    argv = tiny_run_argv(**data_paths, output_dir=output_dir, learning_rate="1000.0")
    assert main(argv) == 3  # a failed run: neither success nor bad input
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: training diverged at step ")
    assert "lower --learning_rate or lengthen --warmup_steps" in errors[0]  # no Muon here
    summary = strict_json(output_dir / GPT_SUMMARY_FILE)
    assert summary["verdict"] == "diverged" and summary["final_loss"] is None
    assert summary["global_step"] == summary["diverged_at_step"] < summary["max_steps"]  # early
    assert "nan" in summary["divergence"] or "inf" in summary["divergence"]
    assert not (output_dir / FINAL_MODEL_DIR).exists()
    # The report says so too, never "pass".
    report = write_report([output_dir], tmp_path / "report").read_text()
    assert "| diverged |" in report and "| pass |" not in report
    # Resuming it is no way out: it is still diverged (exit 3 again, for a retry script).
    assert main([*argv, "--resume_from_checkpoint", "auto"]) == 3
    assert "diverged at step" in capsys.readouterr().err


@pytest.mark.slow
def test_a_second_run_into_a_folder_in_use_is_refused_naming_the_first(data_paths, tmp_path):
    """The first run is still training (far from its end) when the second starts; once the
    second is refused, the first is stopped by SIGTERM and leaves its own checkpoint."""
    output_dir = tmp_path / "run"
    argv = tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=NUM_BLOCKS * 100)
    first = subprocess.Popen(
        run_script_command(argv), env=subprocess_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while not (output_dir / TENSORBOARD_DIR).exists():  # training has begun
            assert first.poll() is None, first.communicate()[1][-2000:]
            time.sleep(0.05)
        second = subprocess.run(
            run_script_command([*argv, "--learning_rate", "2.0e-3"]),
            env=subprocess_env(), capture_output=True, text=True,
        )  # fmt: skip
        first.send_signal(signal.SIGTERM)
        _, first_err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2
    (error,) = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert f"output folder {output_dir} is in use by another run (process {first.pid}" in error
    assert first.returncode == 128 + signal.SIGTERM, first_err[-2000:]
    # Everything in the folder is the first run's: its checkpoints, with its learning rate.
    checkpoints = list(output_dir.glob("checkpoint-*"))
    assert checkpoints
    for checkpoint in checkpoints:
        manifest = json.loads((checkpoint / CHECKPOINT_MANIFEST_FILE).read_text())
        first_rate = parse_pretrain_args(argv).training.learning_rate
        assert manifest["run_identity"]["learning_rate"] == first_rate != 2.0e-3


@pytest.mark.system
def test_a_full_disk_while_saving_is_one_line_and_leaves_no_checkpoint_looking_whole(
    data_paths, tmp_path
):
    """The run folder on a real 1 MiB tmpfs: the logs fit, the first checkpoint does not."""
    with small_disk(tmp_path / "small_disk", "1m") as disk:
        output_dir = disk / "run"
        argv = tiny_run_argv(**data_paths, output_dir=output_dir, save_steps=4)
        finished = subprocess.run(
            run_script_command(argv), env=subprocess_env(), capture_output=True, text=True
        )
        assert finished.returncode == 3, finished.stderr[-3000:]
        errors = [line for line in finished.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in finished.stderr
        assert f"cannot save in {output_dir}: no space left on device" in errors[0]
        assert list(output_dir.glob("checkpoint-*")) == []  # the unfinished one was removed
        assert not (output_dir / FINAL_MODEL_DIR).exists()
        assert not (output_dir / GPT_SUMMARY_FILE).exists()


@pytest.mark.slow
def test_a_file_size_limit_while_saving_is_named_in_one_line(data_paths, tmp_path):
    """`ulimit -f` (or a quota) below a checkpoint's size: torch's writer said only "enforce
    fail at inline_container.cc ... unexpected pos"."""
    output_dir = tmp_path / "run"
    argv = tiny_run_argv(**data_paths, output_dir=output_dir, save_steps=4)
    limit = 2**19

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    finished = subprocess.run(
        run_script_command(argv), env=subprocess_env(), capture_output=True, text=True,
        preexec_fn=limit_file_size,
    )  # fmt: skip
    assert finished.returncode == 3, finished.stderr[-3000:]
    (error,) = [line for line in finished.stderr.splitlines() if line.startswith("error:")]
    assert f"cannot save in {output_dir}: file too large: this process may write files of at " in (
        error
    )
    assert "0.5 MiB (ulimit -f)" in error and "raise that limit" in error
    assert list(output_dir.glob("checkpoint-*")) == []  # the unfinished one was removed


@pytest.mark.slow
def test_the_course_config_runs_on_a_cpu_compiled_once(data_paths, tmp_path):
    """Every setting of gpt2_117m.yaml but the model's size and the batch (regional compile,
    chunked loss, fused AdamW, two data workers, the warmup schedule, checkpoints and logging
    as configured), so that the first GPU run is not the first run of this config. The budget
    is not a whole number of batches: rounded up, no step has a new shape, and neither has the
    final evaluation, so nothing is compiled after the first step."""
    output_dir = tmp_path / "course"
    batch_tokens = 4 * BLOCK_SIZE
    argv = [
        "--config", str(GPT2_CONFIG),
        "--model_preset", "tiny",
        "--block_size", str(BLOCK_SIZE),
        "--per_device_train_batch_size", "4",
        "--max_train_tokens", str(12 * batch_tokens - 100),
        "--use_cpu", "true",
        "--corpus", str(data_paths["corpus_dir"]),
        "--tokenizer_dir", str(data_paths["tokenizer_dir"]),
        "--cache_dir", str(data_paths["cache_dir"]),
        "--output_dir", str(output_dir),
        "--disable_tqdm", "true",
    ]  # fmt: skip
    finished = subprocess.run(
        run_script_command(argv), env=subprocess_env(), capture_output=True, text=True
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert not [noise for noise in LIBRARY_NOISE if noise in finished.stderr]
    summary = read_summary(output_dir)
    assert summary["tokens_trained"] == 12 * batch_tokens and summary["global_step"] == 12
    assert summary["compile"]["compiles"] > 0 and summary["compile"]["recompiles"] == 0
    settings = summary["speed_settings"]
    assert settings["compile_regions"] and settings["fused_adamw"]
    assert settings["loss_implementation"] == "chunked"
    assert settings["dataloader_num_workers"] == 2
    headline = finished.stdout.strip().splitlines()[-1]
    assert f"{12 * batch_tokens:,} tokens (the budget" in headline and " s: imports " in headline
    assert sum(summary["time_budget"].values()) == pytest.approx(summary["wall_seconds"], abs=0.01)
    assert (output_dir / FINAL_MODEL_DIR / "model.safetensors").is_file()
    assert (data_paths["cache_dir"] / "compile").is_dir()  # the compiled code, kept for next time


@pytest.mark.slow
def test_dynamo_s_recompile_limit_is_an_error_never_a_silent_eager_run(
    data_paths, tmp_path, capsys, monkeypatch
):
    """Without --whole_batches the last step is smaller: a new shape, a recompile. With the
    limit at one compile per function, that is the limit: one line, exit 3."""
    monkeypatch.setattr("torch._dynamo.config.recompile_limit", 1)
    argv = tiny_run_argv(**data_paths, output_dir=tmp_path / "run", num_blocks=NUM_BLOCKS - 2)
    flags = ["--torch_compile", "true", "--whole_batches", "false", "--max_steps", "-1"]
    assert main([*argv, *flags]) == 3
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("error: torch.compile reached dynamo's recompile limit (")
    assert "size mismatch" in error  # dynamo's reason: the smaller last batch


@pytest.mark.multiprocess
def test_a_survivor_whose_peer_died_says_so_never_free_space(tmp_path):
    """Two gloo processes; one dies (kill -9 to itself) before an all-reduce, after the
    survivor wrote a checkpoint it has not sealed yet, as when a peer dies mid-save: the
    survivor's one line names the cause, and its unfinished save goes."""
    survivor = (
        "import os, sys, time, torch, torch.distributed as dist, pathlib\n"
        "from pretrain.run_folder import failures_in_one_line\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 1:\n"
        "    time.sleep(1); os.kill(os.getpid(), 9)\n"
        "time.sleep(3)\n"
        f"folder = pathlib.Path({str(tmp_path)!r})\n"
        "with failures_in_one_line(folder, 2**40, True):\n"
        "    (folder / 'checkpoint-4').mkdir()  # this run's save, written, not yet sealed\n"
        "    dist.all_reduce(torch.ones(1))\n"
    )
    env = {**subprocess_env(), "MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2"}
    env["MASTER_PORT"] = str(get_free_port())
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", survivor],
            env={**env, "RANK": str(rank)},
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    _, stderr = processes[0].communicate(timeout=120)
    processes[1].wait(timeout=60)
    assert "RunFailed: another process of this run stopped" in stderr, stderr[-2000:]
    assert "free space" not in stderr
    assert not (tmp_path / "checkpoint-4").exists()  # this run's unfinished save: removed


def test_a_final_model_that_cannot_be_saved_is_named_with_its_own_size(tmp_path):
    """torch's writer under a file-size limit says only "unexpected pos": the line names
    final/ and what it takes (its weights), not a checkpoint's size."""
    script = (
        "import pathlib, resource, torch\n"
        "from common.cli import RunFailed\n"
        "from pretrain.run_folder import failures_in_one_line, save_final_model\n"
        f"folder = pathlib.Path({str(tmp_path)!r})\n"
        "weights = torch.zeros(2**18)  # 1 MiB\n"
        "def write_model(directory):\n"
        "    pathlib.Path(directory).mkdir()\n"
        "    torch.save(weights, pathlib.Path(directory) / 'model.bin')\n"
        "hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (2**18, hard))\n"
        "try:\n"
        "    with failures_in_one_line(folder, weights.nbytes, is_main=True):\n"
        "        save_final_model(write_model, folder / 'final', is_main=True)\n"
        "except RunFailed as failed:\n"
        "    print(failed)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=subprocess_env(), capture_output=True, text=True
    )
    assert result.stdout.startswith(
        f"cannot save in {tmp_path}: file too large: this process may write files of at most "
        "0.2 MiB (ulimit -f), final/ takes about 1.0 MiB; removed the unfinished .final.tmp; "
        "raise that limit"
    ), result.stderr[-2000:]
    assert not any(tmp_path.iterdir())  # the unfinished final model removed


# --- The compile cache: damaged, read-only, on a full disk ----------------------------------


def compiled_run(data_paths: dict, output_dir: Path, cache: Path) -> subprocess.CompletedProcess:
    """A tiny compiled run (8 steps) keeping its code in `cache`, as a child process (the
    cache's environment variables stay there)."""
    argv = tiny_run_argv(
        **data_paths, output_dir=output_dir, num_blocks=32, torch_compile="true",
        compile_cache_dir=cache,
    )  # fmt: skip
    return subprocess.run(
        run_script_command(argv), env=subprocess_env(), capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def warm_compile_cache(data_paths, tmp_path_factory):
    """A compile cache a finished run sealed, and that run's summary."""
    root = tmp_path_factory.mktemp("compile")
    finished = compiled_run(data_paths, root / "run", root / "cache")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert (root / "cache" / COMPILE_CACHE_MANIFEST).is_file()
    return root / "cache", read_summary(root / "run")


@pytest.mark.parametrize("damage", ["nul", "random"])
def test_each_damage_to_a_sealed_compile_cache_is_found(warm_compile_cache, tmp_path, damage):
    cache = tmp_path / "cache"
    shutil.copytree(warm_compile_cache[0], cache)
    assert sealed_folder_damage(cache, COMPILE_CACHE_MANIFEST) is None
    path = sorted(cache.rglob("*.py" if damage == "nul" else "*.so"))[0]
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + b"\0" if damage == "nul" else os.urandom(size))
    found = sealed_folder_damage(cache, COMPILE_CACHE_MANIFEST)
    changed = "changed since it was written" if damage == "random" else f"{size + 1:,} bytes"
    assert found.startswith(path.relative_to(cache).as_posix()) and changed in found


def test_only_a_sealed_compile_cache_that_you_alone_can_write_is_trusted(
    warm_compile_cache, tmp_path
):
    cache = tmp_path / "cache"
    shutil.copytree(warm_compile_cache[0], cache)
    assert compile_cache_distrust(cache) is None
    assert not any(path.stat().st_mode & 0o022 for path in [cache, *cache.rglob("*")])
    python_file = sorted(cache.rglob("*.py"))[0]
    planted = python_file.with_name("planted.py")
    planted.write_text("import os\n")
    assert compile_cache_distrust(cache) == f"{planted.relative_to(cache)} was not sealed"
    planted.unlink()
    (cache / "locks").mkdir(exist_ok=True)
    (cache / "locks" / "planted.lock").write_text("")  # inductor's lock files are sealed too
    assert compile_cache_distrust(cache) == "locks/planted.lock was not sealed"
    (cache / "locks" / "planted.lock").unlink()
    python_file.parent.chmod(0o775)  # another member of the group could plant code
    assert compile_cache_distrust(cache) == f"{python_file.parent} is not writable by you alone"
    python_file.parent.chmod(0o755)
    (cache / COMPILE_CACHE_MANIFEST).unlink()
    assert compile_cache_distrust(cache).startswith(f"no readable {COMPILE_CACHE_MANIFEST}")
    (empty := tmp_path / "empty").mkdir(mode=0o700)
    assert compile_cache_distrust(empty) is None  # no code in it


@pytest.fixture
def compile_variables(monkeypatch):
    """The cache's variables, restored after the test (use_compile_cache sets them)."""
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(variable, "replaced by the test")


def test_a_compile_cache_that_is_or_holds_a_run_folder_is_refused(compile_variables, tmp_path):
    """Distrusted, it would be moved aside, the run's checkpoints and lock with it."""
    run = (runs := tmp_path / "runs") / "run"
    (run / "checkpoint-4").mkdir(parents=True)
    (run / "checkpoint-4" / CHECKPOINT_MANIFEST_FILE).write_text("{}")
    for cache, output_dir in [(run, run), (runs, run), (runs, tmp_path / "this_run")]:
        with pytest.raises(InputError, match=f"holds the run folder {run}, which distrusting"):
            use_compile_cache(cache, True, output_dir)
        assert (run / "checkpoint-4" / CHECKPOINT_MANIFEST_FILE).is_file()
    inside = run / "compile_cache"  # a cache in the run folder is its own folder
    assert use_compile_cache(inside, True, run) == inside


def test_a_compile_cache_that_is_a_link_leaves_the_folder_it_names_alone(
    compile_variables, tmp_path, caplog
):
    (elsewhere := tmp_path / "another_users_cache").mkdir(mode=0o700)
    (elsewhere / "planted.py").write_text("import os\n")
    (link := tmp_path / "cache").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="pretrain.library_fixes"):
        assert use_compile_cache(link, True, tmp_path / "run") is None
    assert (elsewhere / "planted.py").is_file() and link.is_symlink()
    (warning,) = caplog.messages
    assert warning.startswith(f"compile cache {link} cannot be used (a link, or another user's")
    assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) not in (link, elsewhere)


@pytest.mark.slow
def test_code_planted_in_a_compile_cache_never_runs(data_paths, warm_compile_cache, tmp_path):
    """The manifest deleted and a line appended to each generated Python file (a writer who
    can delete the seal too): the cache is moved aside, compiled again, and no line of it ran."""
    cache = tmp_path / "cache"
    shutil.copytree(warm_compile_cache[0], cache)
    (cache / COMPILE_CACHE_MANIFEST).unlink()
    marker = tmp_path / "planted_code_ran"
    python_files = sorted(cache.rglob("*.py"))
    for path in python_files:
        path.write_text(path.read_text() + f"\nopen({str(marker)!r}, 'a').write('ran')\n")
    finished = compiled_run(data_paths, tmp_path / "run", cache)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert not marker.exists()
    (warning,) = [line for line in finished.stderr.splitlines() if "is not used" in line]
    (aside,) = tmp_path.glob("cache.untrusted-*")
    assert f"compile cache {cache} is not used (no readable {COMPILE_CACHE_MANIFEST}" in warning
    assert warning.endswith(f"moved to {aside.name}; compiling again")
    assert len(list(aside.rglob("*.py"))) == len(python_files)  # set aside, not deleted
    assert read_summary(tmp_path / "run")["final_loss"] == pytest.approx(
        warm_compile_cache[1]["final_loss"], rel=1e-4
    )
    assert compile_cache_distrust(cache) is None  # sealed again


@pytest.mark.system
@pytest.mark.parametrize("warm", [False, True], ids=["empty", "warm"])
def test_a_read_only_compile_cache_is_skipped_in_one_warning(
    warm_compile_cache, tmp_path, monkeypatch, caplog, warm
):
    """A read-only folder (a cache shared read-only, a full quota) made inductor fail with
    'Read-only file system'; it is left untouched for a new private folder, not torch's default
    (a name in /tmp that another user can create first)."""

    def fill(disk: Path) -> None:  # then remounted read-only
        if warm:
            shutil.copytree(warm_compile_cache[0], disk / "cache")

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "replaced by the test")
    monkeypatch.setenv("TRITON_CACHE_DIR", "replaced by the test")
    with small_disk(tmp_path / "disk", "64m", read_only_after=fill) as disk:
        before = file_digests(disk)
        with caplog.at_level(logging.WARNING, logger="pretrain.library_fixes"):
            assert use_compile_cache(disk / "cache", True, tmp_path / "run") is None
        assert file_digests(disk) == before
    (warning,) = caplog.messages
    assert warning.startswith(f"compile cache {disk / 'cache'} cannot be used (Read-only")
    private = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    assert warning.endswith(f"compiling in a new private folder, {private}")
    assert private.stat().st_mode & 0o777 == 0o700 and not any(private.iterdir())
    assert os.environ["TRITON_CACHE_DIR"] == str(private / "triton")


@pytest.mark.system
def test_a_full_disk_while_compiling_is_one_line_and_exit_3(data_paths, tmp_path):
    """Was 1,246 lines of linker errors and a traceback, exit 1."""
    with small_disk(tmp_path / "small_disk", "1m") as disk:
        finished = compiled_run(data_paths, tmp_path / "run", disk / "cache")
    assert finished.returncode == 3, finished.stderr[-3000:]
    assert "Traceback" not in finished.stderr and "/usr/bin/ld" not in finished.stderr
    (error,) = [line for line in finished.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith(
        f"error: cannot write torch.compile's code in {disk / 'cache'}: no space left on device"
    )
    assert len(finished.stderr.splitlines()) < 40
