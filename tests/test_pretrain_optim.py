"""Muon for the hidden matrices, AdamW for the rest, as one optimizer (pretrain/optim.py)."""

import copy
import json
import math
import re

import pytest
import torch
from pretrain_runs import read_summary, shared_data_paths, tiny_run_argv
from sharded_runs import CONFIG_DIR, launch_two_processes
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments, get_scheduler
from transformers.pytorch_utils import Conv1D
from transformers.trainer import TRAINER_STATE_NAME

from common.cli import InputError
from pretrain.optim import MuonArguments, check_muon_fits, muon_optimizer
from pretrain.parallel.pipeline import GPT2PipelineStage
from pretrain.parallel.strategy import DATA_PARALLEL, SINGLE_PROCESS, Request
from pretrain.parallel.tensor import conv1d_to_linear
from pretrain.run import main
from pretrain.run_model_parallel import build_optimizer

MUON = MuonArguments(
    muon=True, muon_learning_rate=0.05, muon_weight_decay=0.3, embedding_learning_rate=3e-3
)


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    return GPT2LMHeadModel(config)


def training_args(tmp_path, **options) -> TrainingArguments:
    options = {"learning_rate": 1e-3, "weight_decay": 0.1, "use_cpu": True, **options}
    return TrainingArguments(output_dir=str(tmp_path), report_to=[], **options)


def backward(model: GPT2LMHeadModel, seed: int = 0) -> None:
    ids = torch.randint(0, 96, (3, 16), generator=torch.Generator().manual_seed(seed))
    model(input_ids=ids, labels=ids).loss.backward()


def test_groups_cover_every_parameter_once_with_its_rate_and_decay(tmp_path):
    model = tiny_gpt2()
    optimizer = muon_optimizer(model, training_args(tmp_path), MUON)
    seen = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(seen) == len(set(seen)) == len(list(model.parameters()))
    group_of = {p: group for group in optimizer.param_groups for p in group["params"]}
    matrices = {m.weight for m in model.modules() if isinstance(m, Conv1D)}
    assert set(optimizer.muon.param_groups[0]["params"]) <= matrices
    assert {p for g in optimizer.muon.param_groups for p in g["params"]} == matrices
    # The tied embedding / head and the positions: AdamW at the embedding rate, decayed.
    wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
    assert model.lm_head.weight is wte
    for embedding in (wte, wpe):
        assert (group_of[embedding]["lr"], group_of[embedding]["weight_decay"]) == (3e-3, 0.1)
    # LayerNorms and biases: AdamW at --learning_rate, not decayed; Trainer logs the first
    # group's rate, which is --learning_rate's.
    for norm_or_bias in (model.transformer.ln_f.weight, model.transformer.h[0].attn.c_attn.bias):
        assert (group_of[norm_or_bias]["lr"], group_of[norm_or_bias]["weight_decay"]) == (1e-3, 0)
    assert optimizer.param_groups[0] is group_of[model.transformer.ln_f.weight]


@pytest.mark.parametrize("ns_steps", [0, 5])
def test_each_conv1d_matrix_steps_as_torch_muon_steps_the_same_linear_matrix(tmp_path, ns_steps):
    """Conv1D stores (in, out); Muon's step, scaled by the shape, must be that of the
    nn.Linear (out, in) it stands for: the reference, torch's own Muon on the transpose.

    Without Newton-Schulz iterations the two are equal to the bit; with them, bf16 rounds the
    products of a matrix and of its transpose differently (a few percent of the step), while a
    wrong shape would be off by a factor of 2 or more (sqrt(out / in))."""
    model = tiny_gpt2()
    optimizer = muon_optimizer(model, training_args(tmp_path), MUON, ns_steps=ns_steps)
    conv1ds = [m for m in model.modules() if isinstance(m, Conv1D)]
    assert {tuple(m.weight.shape) for m in conv1ds} == {(32, 96), (32, 32), (32, 128), (128, 32)}
    backward(model)
    before = [module.weight.detach().clone() for module in conv1ds]
    references = []
    for module in conv1ds:
        linear = torch.nn.Parameter(module.weight.detach().T.clone())
        linear.grad = module.weight.grad.T.clone()
        references.append(linear)
    reference = torch.optim.Muon(references, lr=0.05, weight_decay=0.3, ns_steps=ns_steps)
    for _ in range(2):  # the second step also checks the momentum
        optimizer.step()
        reference.step()
    for module, start, linear in zip(conv1ds, before, references, strict=True):
        step, expected = module.weight.detach() - start, linear.detach().T - start
        error = (step - expected).norm() / expected.norm()
        assert error <= (1e-6 if ns_steps == 0 else 0.1), tuple(module.weight.shape)


def test_state_dict_round_trip_continues_exactly(tmp_path):
    model = tiny_gpt2()
    optimizer = muon_optimizer(model, training_args(tmp_path, optim="adamw_torch"), MUON)
    backward(model)
    optimizer.step()
    saved_model, saved_state = copy.deepcopy(model), copy.deepcopy(optimizer.state_dict())
    assert len(saved_state["state"]) == len(list(model.parameters()))  # both optimizers'
    resumed = muon_optimizer(saved_model, training_args(tmp_path, optim="adamw_torch"), MUON)
    resumed.load_state_dict(saved_state)
    for run, opt in ((model, optimizer), (saved_model, resumed)):
        opt.zero_grad()
        backward(run, seed=1)
        opt.step()
    for (name, weight), resumed_weight in zip(
        model.named_parameters(), saved_model.parameters(), strict=True
    ):
        torch.testing.assert_close(weight, resumed_weight, rtol=0, atol=0, msg=name)


def test_trainer_schedule_scales_every_group_alike(tmp_path):
    model = tiny_gpt2()
    optimizer = muon_optimizer(model, training_args(tmp_path), MUON)
    peaks = [group["lr"] for group in optimizer.param_groups]
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=2, num_training_steps=10)
    for _ in range(6):
        optimizer.step()
        scheduler.step()
    factors = [
        group["lr"] / peak for group, peak in zip(optimizer.param_groups, peaks, strict=True)
    ]
    assert factors == pytest.approx([0.5] * len(peaks))


def test_muon_is_refused_where_it_cannot_train_as_asked(tmp_path):
    unclipped = training_args(tmp_path, max_grad_norm=0.0)
    for accepted in (SINGLE_PROCESS, DATA_PARALLEL):
        check_muon_fits(MUON, Request(accepted), unclipped)
    check_muon_fits(MUON, Request("FSDP", fsdp_version=2), training_args(tmp_path))
    with pytest.raises(InputError, match="--muon under FSDP needs fsdp_version: 2"):
        check_muon_fits(MUON, Request("FSDP", fsdp_version=1), training_args(tmp_path))
    check_muon_fits(
        MuonArguments(), Request("FSDP", fsdp_version=1), training_args(tmp_path)
    )  # AdamW: nothing to refuse


def deepspeed_launch(monkeypatch, tmp_path, config: dict | None = None, **variables: str):
    """The variables accelerate launch sets for a DeepSpeed config: `config` as its
    deepspeed_config_file, `variables` as its inline keys (ACCELERATE_<name>)."""
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    if config is not None:
        config_file = tmp_path / "deepspeed.json"
        config_file.write_text(json.dumps({"zero_optimization": {"stage": 2}, **config}))
        monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(config_file))
    for name, value in variables.items():
        monkeypatch.setenv(f"ACCELERATE_{name}", value)


@pytest.mark.parametrize(
    ("config", "variables", "refusal"),
    [
        (None, {}, None),  # accelerate's inline config clips as --max_grad_norm: 0
        ({"gradient_clipping": "auto"}, {}, None),
        ({"gradient_clipping": 0.0}, {}, None),
        (None, {"GRADIENT_CLIPPING": "1.0"}, "config's gradient_clipping 1.0)"),
        ({"gradient_clipping": 0.5}, {}, "config's gradient_clipping 0.5)"),
        ({"optimizer": {"type": "AdamW"}}, {}, "remove its 'optimizer' section"),
    ],
)
def test_muon_is_refused_a_deepspeed_config_that_clips_or_names_an_optimizer(
    config, variables, refusal, monkeypatch, tmp_path
):
    """Both replace what Muon steps by (DeepSpeed clips the orthogonalised update; its own
    optimizer replaces Muon): refused from the launch's variables, before Trainer exists."""
    deepspeed_launch(monkeypatch, tmp_path, config, **variables)
    unclipped = training_args(tmp_path, max_grad_norm=0.0)
    if refusal is None:
        check_muon_fits(MUON, Request("DEEPSPEED"), unclipped)
    else:
        with pytest.raises(InputError, match=re.escape(refusal)):
            check_muon_fits(MUON, Request("DEEPSPEED"), unclipped)
    with pytest.raises(InputError, match=r"gradient clipping \(--max_grad_norm 1\.0"):
        check_muon_fits(MUON, Request("DEEPSPEED"), training_args(tmp_path, max_grad_norm=1.0))
    check_muon_fits(MuonArguments(), Request("DEEPSPEED"), unclipped)  # AdamW: nothing to refuse


@pytest.fixture
def data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory):
    return shared_data_paths(wos_corpus_dir, tiny_tokenizer_dir, tmp_path_factory)


def test_a_deepspeed_optimizer_is_refused_for_muon_before_any_data_is_prepared(
    data_paths, monkeypatch, tmp_path, capsys
):
    deepspeed_launch(monkeypatch, tmp_path, {"optimizer": {"type": "AdamW"}})
    paths = data_paths | {"cache_dir": tmp_path / "cache"}
    argv = tiny_run_argv(**paths, output_dir=tmp_path / "run")
    assert main([*argv, "--muon", "true", "--max_grad_norm", "0"]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("error: --muon") and "remove its 'optimizer' section" in error
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


@pytest.mark.multiprocess
def test_muon_under_zero_with_clipping_is_refused_in_one_line(data_paths, tmp_path):
    """DeepSpeed would clip Muon's orthogonalised update by the norm, shrinking every step."""
    config = CONFIG_DIR / "cpu_deepspeed_zero2.yaml"
    result = launch_two_processes(config, data_paths, tmp_path / "run", "--muon", "true")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and errors[0] == errors[1]  # one line from each process
    assert "DeepSpeed clips Muon's orthogonalised update" in errors[0]
    assert "pass --max_grad_norm 0" in errors[0]
    assert re.search(r"exitcode\s*:\s*2\b", result.stderr)
    assert not (tmp_path / "run").exists()


def test_tensor_parallel_linear_matrices_step_with_muon_at_their_own_shape(tmp_path):
    """Tensor parallelism turns each Conv1D into an equal nn.Linear, stored (out, in): every
    block matrix is still on Muon, its rate no longer carrying a transpose's factor."""
    model = tiny_gpt2()
    for block in model.transformer.h:
        for parent, name in ((block.attn, "c_attn"), (block.attn, "c_proj"),
                             (block.mlp, "c_fc"), (block.mlp, "c_proj")):  # fmt: skip
            setattr(parent, name, conv1d_to_linear(getattr(parent, name)))
    optimizer = build_optimizer(model, training_args(tmp_path), MUON)
    linears = {m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    linears.discard(model.lm_head.weight)  # the tied embedding: AdamW
    (group,) = optimizer.muon.param_groups
    assert set(group["params"]) == linears and len(linears) == 8
    assert group["lr"] == MUON.muon_learning_rate


def test_a_pipeline_stage_trains_its_own_matrices_with_muon(tmp_path):
    """The last stage's output layer (a copy of the tied embedding) stays on AdamW at the
    embedding rate; every matrix of the stage's blocks is on Muon."""
    model = tiny_gpt2()
    for stage_index in (0, 1):
        stage = GPT2PipelineStage(model, stage_index, num_stages=2)
        optimizer = muon_optimizer(stage, training_args(tmp_path), MUON)
        on_muon = {p for group in optimizer.muon.param_groups for p in group["params"]}
        assert on_muon == {m.weight for m in stage.modules() if isinstance(m, Conv1D)}
        assert len(on_muon) == 4
        if stage.is_last:
            head = stage.lm_head.weight
            (head_group,) = [
                g for g in optimizer.param_groups if any(p is head for p in g["params"])
            ]
            assert (head_group["lr"], head_group["weight_decay"]) == (3e-3, 0.1)


@pytest.mark.slow
def test_trainer_accumulates_clips_and_schedules_a_muon_run(data_paths, tmp_path):
    """Trainer's loop around the optimizer, clipping on: a batch in two accumulated halves
    trains like the whole batch, and the warmup applies (the logged rate is --learning_rate's)."""
    options = {"muon": "true", "max_grad_norm": 0.5, "warmup_steps": 4, "logging_steps": 1}
    options |= {"lr_scheduler_type": "constant_with_warmup", "learning_rate": 2e-3}
    runs = {}
    for batch, accumulation in ((4, 1), (2, 2)):
        output_dir = tmp_path / f"{batch}x{accumulation}"
        argv = tiny_run_argv(**data_paths, output_dir=output_dir, num_blocks=48, **options)
        argv += ["--per_device_train_batch_size", str(batch)]
        assert main([*argv, "--gradient_accumulation_steps", str(accumulation)]) == 0
        runs[accumulation] = read_summary(output_dir)
    whole, halves = runs[1], runs[2]
    assert halves["eval_loss"] == pytest.approx(whole["eval_loss"], abs=1e-3)
    assert whole["eval_loss"] < math.log(whole["config"]["model_config"]["vocab_size"]) - 0.5
    state = json.loads((tmp_path / "4x1" / "checkpoint-12" / TRAINER_STATE_NAME).read_text())
    rates = [entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry]
    assert rates[:5] == pytest.approx([0.0, 5e-4, 1e-3, 1.5e-3, 2e-3]) and max(rates) == 2e-3
