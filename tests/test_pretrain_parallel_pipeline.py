"""Pipeline parallelism: two CPU processes, one stage each, train the tiny GPT-2 like one with
either schedule, and the two copies of the tied embedding stay equal."""

import pytest
from parallel_runs import (
    BATCH_BLOCKS,
    NUM_PROCESSES,
    NUM_STEPS,
    launch_model_parallel,
    logged_scalars,
    model_parallel_argv,
    trainer_reference,
)
from pretrain_runs import BLOCK_SIZE, TINY_CONFIG, read_summary, shared_data_paths
from transformers import GPT2LMHeadModel

from common.cli import InputError
from common.run_contract import GRAD_NORM, TRAIN_LOSS
from common.tokenization import load_tokenizer
from pretrain.args import PretrainArguments
from pretrain.metrics import parameter_bytes
from pretrain.model import build_model_config
from pretrain.parallel.pipeline import check_pipeline_arguments, stage_layers
from pretrain.run_model_parallel import ParallelArguments

NUM_MICROBATCHES = 4


@pytest.fixture(scope="module")
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def reference(data_paths, tmp_path_factory):
    return trainer_reference(data_paths, tmp_path_factory)


@pytest.mark.multiprocess
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_pipeline_stages_train_like_pretrain_run_in_one_process(
    schedule, reference, data_paths, tiny_tokenizer_dir, tmp_path
):
    argv = model_parallel_argv(
        data_paths,
        tmp_path,
        strategy="pp",
        pipeline_schedule=schedule,
        num_microbatches=NUM_MICROBATCHES,
    )
    result = launch_model_parallel(argv)
    assert result.returncode == 0, result.stderr[-3000:]
    pipeline, single = read_summary(tmp_path), read_summary(reference)

    assert pipeline["parallelism"]["strategy"] == f"pp-{schedule}"
    assert pipeline["config"]["ParallelArguments"]["num_microbatches"] == NUM_MICROBATCHES
    assert pipeline["num_processes"] == NUM_PROCESSES
    losses = logged_scalars(tmp_path, TRAIN_LOSS)
    assert len(losses) == NUM_STEPS
    assert losses == pytest.approx(logged_scalars(reference, TRAIN_LOSS), abs=1e-4)
    assert pipeline["final_loss"] == pytest.approx(single["final_loss"], abs=1e-4)
    assert pipeline["eval_loss"] == pytest.approx(single["eval_loss"], abs=1e-4)
    # Clipped by the norm over both stages, the tied pair counted once.
    norms = logged_scalars(tmp_path, GRAD_NORM)
    assert norms == pytest.approx(logged_scalars(reference, GRAD_NORM), rel=1e-4)
    assert pipeline["parallelism"]["tied_weight_max_difference"] == 0.0

    # Each stage holds its layers; together they hold the model plus the output layer's copy
    # of the tied embedding.
    model = GPT2LMHeadModel(
        build_model_config("tiny", load_tokenizer(tiny_tokenizer_dir), BLOCK_SIZE)
    )
    tied_copy = parameter_bytes([model.transformer.wte.weight])
    stages = pipeline["parallelism"]["ranks"]
    (whole,) = single["parallelism"]["ranks"]
    assert sum(stage["parameter_bytes"] for stage in stages) == whole["parameter_bytes"] + tied_copy
    assert all(stage["parameter_bytes"] < whole["parameter_bytes"] for stage in stages)
    assert all(stage["optimizer_state_bytes"] >= 2 * stage["parameter_bytes"] for stage in stages)


@pytest.mark.parametrize(("num_layers", "num_stages"), [(2, 2), (12, 4), (7, 3), (5, 5)])
def test_stages_cover_every_layer_once_in_order_and_balanced(num_layers, num_stages):
    stages = [stage_layers(num_layers, num_stages, index) for index in range(num_stages)]
    assert [layer for stage in stages for layer in stage] == list(range(num_layers))
    sizes = [len(stage) for stage in stages]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@pytest.mark.parametrize(
    ("schedule", "num_microbatches", "message"),
    [
        ("1f1b", 1, "at least as many microbatches as stages"),
        ("gpipe", 3, f"must divide the batch of {BATCH_BLOCKS}"),
    ],
)
def test_a_pipeline_that_cannot_train_like_one_process_is_refused(
    schedule, num_microbatches, message
):
    with pytest.raises(InputError, match=message):
        check_pipeline_arguments(2, NUM_PROCESSES, schedule, num_microbatches, BATCH_BLOCKS)


def test_an_unknown_schedule_is_refused():
    argv = ["--config", str(TINY_CONFIG), "--strategy", "pp", "--pipeline_schedule", "zero_bubble"]
    with pytest.raises(InputError, match="--pipeline_schedule: invalid choice: 'zero_bubble'"):
        PretrainArguments.parse(argv, (ParallelArguments,))


def test_more_stages_than_layers_are_refused():
    with pytest.raises(InputError, match="leave a stage without a layer"):
        check_pipeline_arguments(2, 3, "gpipe", 4, BATCH_BLOCKS)
