"""check-gpu: what it says of a GPU, whether the run's batch fits, the loop's predicted seconds,
and its one line where no GPU is usable. No GPU is here: the GPUs are a stand-in for the three
torch.cuda functions check-gpu reads them with (init, device_count, get_device_properties)."""

import math
import re
from types import SimpleNamespace

import psutil
import pytest
import torch
from pretrain_runs import TINY_CONFIG, tiny_run_argv
from transformers import AutoTokenizer, GPT2LMHeadModel

from common.cli import InputError
from pretrain import run
from pretrain.args import PretrainArguments
from pretrain.check_gpu import gpu_lines, main, memory_line, meta_model, sdpa_line
from pretrain.device import cuda_unusable_reason
from pretrain.metrics import (
    CPU_UTILISATION,
    cpu_run_estimate,
    flops_per_token,
    memory_estimate,
    model_flops_utilization,
    predicted_loop_seconds,
    refuse_cpu_run_over_free_memory,
)
from pretrain.model import build_model_config

COURSE_CONFIG = TINY_CONFIG.with_name("gpt2_117m.yaml")


def fake_gpu(monkeypatch, name: str, memory_gib: float, capability: tuple[int, int]) -> None:
    """torch.cuda as it answers on a machine with this one GPU, for what check-gpu asks."""
    gpu = SimpleNamespace(
        name=name, total_memory=int(memory_gib * 2**30), major=capability[0], minor=capability[1]
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)


def course_run(*flags: str) -> tuple[PretrainArguments, GPT2LMHeadModel]:
    """The course config's options (with `flags`) and its model on the meta device."""
    (args,) = PretrainArguments.parse(["--config", str(COURSE_CONFIG), *flags])
    return args, meta_model(args)


@pytest.fixture(scope="module")
def course():
    return course_run("--tokenizer_dir", "missing")  # no tokenizer yet: the vocabulary 32,768


def test_a_faked_h200_is_described_and_fits_the_course_batch(monkeypatch, course):
    fake_gpu(monkeypatch, "NVIDIA H200", 140.4, (9, 0))
    assert cuda_unusable_reason() is None
    gpu, versions = gpu_lines()
    assert gpu == "GPU 0: NVIDIA H200, 140.4 GiB, compute capability 9.0, bf16 yes, TF32 yes"
    assert versions.endswith(f"torch {torch.__version__} built for CUDA {torch.version.cuda}")
    line = memory_line(*course, torch.cuda.get_device_properties(0).total_memory)
    assert line.startswith("memory at 64 x 1024 tokens: about ")
    assert line.endswith(": fits in 140.4 GiB")


def test_a_faked_24_gb_card_gets_a_batch_x_accumulation_that_keeps_the_global_batch(
    monkeypatch, course
):
    hf_loss = course_run("--tokenizer_dir", "missing", "--loss_implementation", "hf")
    fake_gpu(monkeypatch, "NVIDIA GeForce RTX 4090", 23.6, (8, 9))  # after parsing: no device
    memory = torch.cuda.get_device_properties(0).total_memory
    assert gpu_lines()[0].endswith("23.6 GiB, compute capability 8.9, bf16 yes, TF32 yes")
    # The chunked loss (the course's) never holds more than one chunk of logits: 32 blocks fit;
    # transformers' loss keeps every block's fp32 logits and their gradients: 16.
    for (args, model), batch in [(course, 32), (hf_loss, 16)]:
        line = memory_line(args, model, memory)
        gib = sum(memory_estimate(args, model, 64)) / 2**30
        assert line.startswith(f"memory at 64 x 1024 tokens: about {gib:.1f} GiB")
        advice = (
            f"--per_device_train_batch_size {batch} --gradient_accumulation_steps {64 // batch}"
        )
        assert f": more than 85% of 23.6 GiB; keep the global batch with {advice}: about " in line
        # The largest that fits: twice the batch does not.
        assert sum(memory_estimate(args, model, batch)) <= 0.85 * memory
        assert sum(memory_estimate(args, model, 2 * batch)) > 0.85 * memory
    # A card too small for even one block says so instead of advising.
    assert memory_line(*course, 2**30).endswith(
        "even at one block: a smaller model or a larger GPU"
    )


def test_a_long_cpu_run_is_estimated_in_one_line_and_a_short_one_not_timed(course):
    args, model = course
    tokens = 12_058_624
    line = cpu_run_estimate(args, model, tokens)
    gib = sum(memory_estimate(args, model, args.training.per_device_train_batch_size)) / 2**30
    assert line.startswith(f"on the CPU, the first step needs about {gib:.1f} GiB (")
    hours, tflops = re.search(r"about ([\d,.]+) hours .* the ([\d.]+) TFLOP/s", line).groups()
    # Both printed rounded (a busy CPU's 0.01-0.03 TFLOP/s by as much as half): the hours lie
    # between those of the rate's rounding bounds, whatever the rate timed.
    rate, half_unit = float(tflops), 0.005 * 1.001

    def loop_hours(tflops: float) -> float:
        return predicted_loop_seconds(tokens, model, 1024, tflops, CPU_UTILISATION) / 3600

    slowest = loop_hours(rate - half_unit) if rate > half_unit else math.inf
    assert loop_hours(rate + half_unit) - 0.05 <= float(hours.replace(",", "")) <= slowest + 0.05
    assert cpu_run_estimate(args, model, 1024) is None  # seconds of work: no matmul timed


def test_a_cpu_run_needing_more_memory_than_this_machine_has_is_refused_unless_asked():
    flags = ("--tokenizer_dir", "missing", "--per_device_train_batch_size", "4096")
    args, model = course_run(*flags)
    assert sum(memory_estimate(args, model, 4096)) > psutil.virtual_memory().total
    with pytest.raises(InputError, match=r"GiB is free: .*tiny\.yaml.*--check_free_memory false"):
        refuse_cpu_run_over_free_memory(args, model.config)
    unchecked, _ = course_run(*flags, "--check_free_memory", "false")
    refuse_cpu_run_over_free_memory(unchecked, model.config)
    (tiny,) = PretrainArguments.parse(["--config", str(TINY_CONFIG)])
    refuse_cpu_run_over_free_memory(tiny, meta_model(tiny).config)  # a few MB


def test_the_memory_refusal_comes_before_any_block_is_prepared(
    wos_corpus_dir, tiny_tokenizer_dir, tmp_path, capsys
):
    cache_dir, output_dir = tmp_path / "cache", tmp_path / "run"
    argv = tiny_run_argv(wos_corpus_dir, tiny_tokenizer_dir, cache_dir, output_dir)
    assert run.main([*argv, "--per_device_train_batch_size", str(10**7)]) == 2
    assert "GiB is free: " in capsys.readouterr().err
    assert not cache_dir.exists() and not output_dir.exists()


def test_the_course_config_s_asynchronous_copies_are_off_on_the_cpu(course):
    """They need pinned memory, which transformers turns off there (its notice said so)."""
    args, _ = course
    assert args.training.accelerator_config.non_blocking and args.training.dataloader_pin_memory
    (cpu,) = PretrainArguments.parse(["--config", str(COURSE_CONFIG), "--use_cpu", "true"])
    assert not cpu.training.accelerator_config.non_blocking
    assert not cpu.training.dataloader_pin_memory


def test_memory_grows_with_the_batch_by_the_activations_alone(course):
    states, activations, loss = memory_estimate(*course, 32)
    assert memory_estimate(*course, 64) == [states, 2 * activations, loss]
    args, model = course
    assert states == 18 * sum(p.numel() for p in model.parameters())  # the tied embedding once


def test_the_prediction_is_the_run_s_flops_at_the_stated_share_of_the_matmul_rate(
    tiny_tokenizer_dir,
):
    args, model = course_run("--tokenizer_dir", str(tiny_tokenizer_dir))
    # The model the run builds (its vocabulary from the tokenizer), FLOPs counted as the run's
    # summary counts them.
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    with torch.device("meta"):
        run_model = GPT2LMHeadModel(build_model_config("gpt2-117m", tokenizer, 1024))
    assert flops_per_token(model, 1024) == flops_per_token(run_model, 1024)
    tokens = 184 * 64 * 1024  # the course budget in whole global batches
    seconds = predicted_loop_seconds(tokens, model, 1024, tflops=700.0)
    # At that speed the run's MFU against the measured matmul rate is the stated utilisation.
    mfu = model_flops_utilization(tokens / seconds, flops_per_token(run_model, 1024), 700e12)
    assert mfu == pytest.approx(0.4)
    assert predicted_loop_seconds(tokens, model, 1024, tflops=350.0) == pytest.approx(2 * seconds)


def test_the_sdpa_kernels_that_run_are_those_torch_has_for_the_device():
    # On a CPU: the flash kernel and the math one; the others are CUDA kernels.
    line = sdpa_line(torch.device("cpu"))
    assert line == "SDPA kernels that run (bf16, causal, head size 64): flash_attention, math"


def test_check_gpu_with_a_driver_too_old_is_one_line_and_exit_2(monkeypatch, capsys):
    def init():
        raise RuntimeError(
            "The NVIDIA driver on your system is too old (found version 12040). Please update "
            "your GPU driver by downloading and installing a new version from the URL: ..."
        )

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "init", init)
    assert main([]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith(
        "error: no usable GPU: the NVIDIA driver supports CUDA 12.4, too old for this torch's "
        f"CUDA {torch.version.cuda} (torch {torch.__version__})"
    )


def test_check_gpu_without_a_gpu_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["--per_device_train_batch_size", "32"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "error: no usable GPU: CUDA_VISIBLE_DEVICES is empty, so no GPU is visible: ask the job "
        "for a GPU (sbatch --gres=gpu:1)\n"
    )
    assert captured.out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a usable GPU")
def test_check_gpu_on_this_machine_names_torch_s_reason(monkeypatch, capsys):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main([]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("error: no usable GPU: ")


def test_the_course_prediction_is_left_out_for_another_shape_or_budget_unless_given():
    def prediction(*flags: str) -> tuple[float, float] | None:
        (args,) = PretrainArguments.parse(["--config", str(COURSE_CONFIG), *flags])
        return args.report.prediction

    assert prediction() is not None
    assert prediction("--model-preset", "4x256") is None  # either spelling
    assert prediction("--max_train_tokens=1M") is None
    assert prediction("--model_preset", "4x256", "--expected_final_loss", "5")[0] == 5
