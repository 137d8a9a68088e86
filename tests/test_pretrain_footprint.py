"""What a process holds: parameters once each, AdamW's state, master copies, the peak."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from pretrain.footprint import gather_footprints, parameter_bytes, rank_footprint

FP32_BYTES = 4


@pytest.fixture
def model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=128)
    return GPT2LMHeadModel(config)


def take_one_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    input_ids = torch.randint(0, 128, (2, 16))
    model(input_ids=input_ids, labels=input_ids).loss.backward()
    optimizer.step()


def test_tied_weight_counts_once(model):
    assert model.lm_head.weight is model.transformer.wte.weight
    num_elements = sum(p.numel() for p in model.parameters())  # distinct parameters
    record = rank_footprint(model, torch.optim.AdamW(model.parameters()), torch.device("cpu"))
    assert record["parameter_bytes"] == num_elements * FP32_BYTES
    assert parameter_bytes([model.lm_head.weight, model.transformer.wte.weight]) == (
        model.lm_head.weight.numel() * FP32_BYTES
    )


def test_adamw_state_is_two_moments_and_a_step_per_parameter(model):
    optimizer = torch.optim.AdamW(model.parameters())
    assert rank_footprint(model, optimizer, torch.device("cpu"))["optimizer_state_bytes"] == 0
    take_one_step(model, optimizer)
    record = rank_footprint(model, optimizer, torch.device("cpu"))
    num_tensors = len(list(model.parameters()))
    assert record["optimizer_state_bytes"] == (
        2 * record["parameter_bytes"] + num_tensors * FP32_BYTES  # exp_avg, exp_avg_sq, step
    )


def test_master_copies_of_a_half_precision_model_count_as_optimizer_state(model):
    model.to(torch.bfloat16)
    master_copies = [p.detach().float().requires_grad_() for p in model.parameters()]
    optimizer = torch.optim.AdamW(master_copies)
    for copy in master_copies:
        copy.grad = torch.ones_like(copy)
    optimizer.step()
    record = rank_footprint(model, optimizer, torch.device("cpu"))
    num_elements = sum(p.numel() for p in model.parameters())
    assert record["parameter_bytes"] == num_elements * 2  # bf16
    # fp32 master weights + two fp32 moments per element + one step per tensor.
    assert record["optimizer_state_bytes"] == (
        3 * num_elements * FP32_BYTES + len(master_copies) * FP32_BYTES
    )


def test_peak_memory_of_a_cpu_process_is_its_resident_set(model):
    record = rank_footprint(model, torch.optim.AdamW(model.parameters()), torch.device("cpu"))
    assert record["peak_memory_source"] == "process_max_rss"
    # The interpreter and torch alone take tens of MiB; no process holds a terabyte.
    assert 20 * 2**20 < record["peak_memory_bytes"] < 2**40
    assert record["rank"] == 0


def test_one_process_gathers_its_own_record(model):
    record = rank_footprint(model, torch.optim.AdamW(model.parameters()), torch.device("cpu"))
    assert gather_footprints(record) == [record]
