"""Tensor parallelism: two CPU processes train the tiny GPT-2 like one, each holding half of
every split matrix."""

import re

import pytest
import torch
from parallel_runs import (
    NUM_PROCESSES,
    NUM_STEPS,
    launch_model_parallel,
    logged_scalars,
    model_parallel_argv,
    trainer_reference,
)
from pretrain_runs import BLOCK_SIZE, read_summary, shared_data_paths
from torch import nn
from transformers import GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D

from common.cli import InputError
from common.run_contract import GRAD_NORM, TRAIN_LOSS
from common.tokenization import load_tokenizer
from pretrain.metrics import parameter_bytes
from pretrain.model import build_model_config
from pretrain.parallel.tensor import (
    check_tensor_parallel_size,
    clip_grad_norm_,
    conv1d_to_linear,
    group_qkv_by_rank,
)
from pretrain.run_model_parallel import ModelParallelRun, main
from report.build import write_report
from report.run_folder import load_run

# What GPT2_TP_PLAN leaves whole on every rank; every other parameter is split in two.
REPLICATED_PARAMETERS = ("wpe.", ".ln_", "c_proj.bias")


@pytest.fixture(scope="module")
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def reference(data_paths, tmp_path_factory):
    return trainer_reference(data_paths, tmp_path_factory)


@pytest.fixture(scope="module")
def tensor_parallel(data_paths, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("tensor_parallel")
    result = launch_model_parallel(model_parallel_argv(data_paths, output_dir, strategy="tp"))
    assert result.returncode == 0, result.stderr[-3000:]
    # A progress line per logged step from the loss rank alone, not one per process.
    progress = re.findall(rf" INFO \S+: step (\d+)/{NUM_STEPS}: loss ", result.stderr)
    assert [int(step) for step in progress] == list(range(1, NUM_STEPS + 1))
    return output_dir


@pytest.mark.multiprocess
def test_two_tensor_parallel_processes_train_like_pretrain_run_in_one(reference, tensor_parallel):
    summary, single = read_summary(tensor_parallel), read_summary(reference)
    assert summary["parallelism"]["strategy"] == "tp"
    assert summary["num_processes"] == NUM_PROCESSES
    losses, single_losses = (
        logged_scalars(run, TRAIN_LOSS) for run in (tensor_parallel, reference)
    )
    assert len(losses) == len(single_losses) == NUM_STEPS
    assert losses == pytest.approx(single_losses, abs=1e-4)
    assert summary["final_loss"] == pytest.approx(single["final_loss"], abs=1e-4)
    assert summary["eval_loss"] == pytest.approx(single["eval_loss"], abs=1e-4)
    # The loss fell, and the gradient was clipped (max_grad_norm 1 in tiny.yaml) at least once:
    # the norm over sharded and whole parameters is the one-process norm.
    assert single_losses[-1] < single_losses[0] - 0.2
    single_norms = logged_scalars(reference, GRAD_NORM)
    assert max(single_norms) > 1.0
    assert logged_scalars(tensor_parallel, GRAD_NORM) == pytest.approx(single_norms, rel=1e-4)
    assert summary["tokens_per_second"] > 0
    assert summary["global_batch_tokens"] == single["global_batch_tokens"]


@pytest.mark.multiprocess
def test_the_report_shows_a_tensor_parallel_run_like_any_other(
    reference, tensor_parallel, tmp_path
):
    record = load_run(tensor_parallel)
    assert record.kind == "gpt" and record.notes == []  # nothing missing from its folder
    text = write_report([reference, tensor_parallel], tmp_path / "report").read_text()
    assert "## GPT-2 pretraining" in text and f"`{tensor_parallel.name}`" in text
    assert (tmp_path / "report" / "gpt_loss.png").is_file()


@pytest.mark.multiprocess
def test_each_process_holds_half_of_every_split_parameter(
    reference, tensor_parallel, tiny_tokenizer_dir
):
    config = build_model_config("tiny", load_tokenizer(tiny_tokenizer_dir), BLOCK_SIZE)
    model = GPT2LMHeadModel(config)
    replicated = parameter_bytes(
        p for name, p in model.named_parameters() if any(s in name for s in REPLICATED_PARAMETERS)
    )
    (whole,) = read_summary(reference)["parallelism"]["ranks"]
    assert whole["parameter_bytes"] == parameter_bytes(model.parameters())
    ranks = read_summary(tensor_parallel)["parallelism"]["ranks"]
    assert [rank["rank"] for rank in ranks] == [0, 1]
    expected = replicated + (whole["parameter_bytes"] - replicated) // NUM_PROCESSES
    assert [rank["parameter_bytes"] for rank in ranks] == [expected, expected]
    assert expected < 0.6 * whole["parameter_bytes"]
    # AdamW keeps two moments per parameter element, shards for the split parameters.
    for rank in ranks:
        assert 2 * rank["parameter_bytes"] <= rank["optimizer_state_bytes"]
        assert rank["optimizer_state_bytes"] < 0.6 * whole["optimizer_state_bytes"]
        assert rank["peak_memory_source"] == "process_max_rss"
        assert rank["peak_memory_bytes"] > 10 * 2**20


def test_conv1d_becomes_an_equal_linear():
    torch.manual_seed(0)
    conv = Conv1D(24, 8)  # 8 in, 24 out, weight stored (in, out)
    nn.init.normal_(conv.weight)
    nn.init.normal_(conv.bias)
    inputs = torch.randn(2, 5, 8)
    torch.testing.assert_close(conv1d_to_linear(conv)(inputs), conv(inputs))


def test_fused_qkv_rows_are_grouped_so_each_rank_slice_holds_whole_heads():
    hidden_size, num_ranks = 4, 2
    c_attn = nn.Linear(hidden_size, 3 * hidden_size)
    with torch.no_grad():
        # Row i of [q | k | v] holds the value i everywhere.
        c_attn.weight.copy_(torch.arange(3 * hidden_size).float()[:, None].expand(-1, hidden_size))
        c_attn.bias.copy_(torch.arange(3 * hidden_size).float())
    group_qkv_by_rank(c_attn, num_ranks)
    # Rank 0 takes rows 0-5: q rows 0-1, k rows 4-5, v rows 8-9; rank 1 the other halves.
    expected = [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
    assert c_attn.bias.tolist() == expected
    assert c_attn.weight[:, 0].tolist() == expected


def test_clip_grad_norm_of_whole_parameters_equals_torch():
    torch.manual_seed(0)
    ours, reference = nn.Linear(6, 5), nn.Linear(6, 5)
    reference.load_state_dict(ours.state_dict())
    inputs = torch.randn(3, 6) * 10
    for model in (ours, reference):
        model(inputs).square().sum().backward()
    norm = clip_grad_norm_(ours.parameters(), 1.0)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    assert norm.item() == pytest.approx(expected.item(), rel=1e-6) and norm > 1.0
    for got, want in zip(ours.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_a_head_count_the_processes_do_not_divide_is_refused():
    with pytest.raises(InputError, match="the model has 3 heads"):
        check_tensor_parallel_size(3, 2)
    check_tensor_parallel_size(12, 4)


def test_tensor_parallel_in_one_process_is_refused(data_paths, tmp_path, capsys):
    output_dir = tmp_path / "run"
    assert main(model_parallel_argv(data_paths, output_dir, strategy="tp")) == 2
    assert "torchrun --standalone --nproc_per_node 2" in capsys.readouterr().err
    assert not output_dir.exists()


def test_the_loop_trains_in_fp32_eagerly_and_names_the_options_it_does_not_apply(
    data_paths, tmp_path, caplog
):
    options = {"torch_compile": "true", "loss_implementation": "chunked", "save_strategy": "steps"}
    run = ModelParallelRun(model_parallel_argv(data_paths, tmp_path / "run", **options))
    with caplog.at_level("WARNING", logger="pretrain.run_model_parallel"):
        precision = run.precision()
    assert (precision.name, precision.tf32) == ("fp32", False)
    assert not run.training_args.torch_compile and run.args.model.loss_implementation == "hf"
    (warning,) = [record.getMessage() for record in caplog.records]
    assert warning.startswith("not applied by this loop: --loss_implementation chunked")
    assert "--torch_compile" in warning and "--save_strategy steps" in warning
