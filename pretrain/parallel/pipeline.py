"""Pipeline parallelism for transformers' GPT-2 with `torch.distributed.pipelining`.

The layers are cut into consecutive stages, one per process, the embeddings on the first, the
final norm and the output layer on the last. A batch's microbatches flow through the stages in
the schedule's order: GPipe runs every forward, then every backward (all activations held at
once); 1F1B alternates them as soon as the last stage can (at most `num_stages` microbatches'
activations held per stage). Both give the whole batch's gradients (equal microbatches).

GPT-2 ties the output layer to the token embedding, on the first and the last stage: the last
holds a copy, and after each backward the two sum the pair's gradients (the lookup's and the
logits' parts of the tied weight's one gradient), so both copies take the same step.
"""

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from transformers import GPT2LMHeadModel
from transformers.masking_utils import create_causal_mask

from common.cli import InputError

PIPELINE_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_layers(num_layers: int, num_stages: int, stage_index: int) -> range:
    """The transformer blocks of one stage: consecutive, the first stages one longer when the
    layers do not divide evenly."""
    base, extra = divmod(num_layers, num_stages)
    start = stage_index * base + min(stage_index, extra)
    return range(start, start + base + (stage_index < extra))


class GPT2PipelineStage(nn.Module):
    """One stage's blocks of a GPT-2, the embeddings on the first stage, the final norm and the
    output layer (a copy of the tied embedding) on the last: ids (B, T) or hidden states
    (B, T, H) in, hidden states or (last stage) logits (B, T, V) out."""

    def __init__(self, model: GPT2LMHeadModel, stage_index: int, num_stages: int) -> None:
        super().__init__()
        body = model.transformer
        self.config = model.config
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        first = (body.wte, body.wpe, body.drop) if self.is_first else (None, None, None)
        self.wte, self.wpe, self.drop = first
        self.h = nn.ModuleList(
            body.h[i] for i in stage_layers(len(body.h), num_stages, stage_index)
        )
        self.ln_f = body.ln_f if self.is_last else None
        self.lm_head = None
        if self.is_last:
            self.lm_head = nn.Linear(body.embed_dim, model.config.vocab_size, bias=False)
            self.lm_head.weight = nn.Parameter(body.wte.weight.detach().clone())

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        position_ids = torch.arange(inputs.shape[1], device=inputs.device)[None]  # (1, T)
        # The first stage embeds ids (B, T); the others get hidden states (B, T, H).
        hidden = self.drop(self.wte(inputs) + self.wpe(position_ids)) if self.is_first else inputs
        # As GPT2Model builds it: None for SDPA (its causal kernel), a mask tensor for eager.
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=None,
            cache=None,
            position_ids=position_ids,
        )
        for block in self.h:
            hidden = block(hidden, None, mask, position_ids=position_ids)
        return self.lm_head(self.ln_f(hidden)) if self.is_last else hidden  # logits: (B, T, V)

    def tied_weight(self) -> nn.Parameter | None:
        """This stage's member of the tied embedding/output pair, if it holds one."""
        return self.wte.weight if self.is_first else self.lm_head.weight if self.is_last else None


@dataclass
class GPT2Pipeline:
    """This process's stage (`module`), its schedule, and the group of the tied pair."""

    module: GPT2PipelineStage
    schedule: ScheduleGPipe | Schedule1F1B
    num_microbatches: int
    tied_group: dist.ProcessGroup  # the first stage (rank 0) and the last

    def forward_backward(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """One batch through the pipeline, gradients accumulated (averaged over microbatches)
        and the tied pair's gradients summed; the batch's mean loss on the last stage."""
        losses: list[torch.Tensor] = []
        self.schedule.step(input_ids, target=input_ids, losses=losses, return_outputs=False)
        tied = self.module.tied_weight()
        if tied is not None:
            dist.all_reduce(tied.grad, group=self.tied_group)
        return torch.stack(losses).mean().detach() if losses else None

    def evaluate(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """Each block's mean loss on the last stage (None on the others), `num_microbatches`
        blocks at a time, a shorter last chunk padded with copies of its last block."""
        losses: list[torch.Tensor] = []
        for chunk in input_ids.split(self.num_microbatches):
            padded = torch.cat([chunk, chunk[-1:].expand(self.num_microbatches - len(chunk), -1)])
            chunk_losses: list[torch.Tensor] = []
            self.schedule.eval(padded, target=padded, losses=chunk_losses)
            losses += chunk_losses[: len(chunk)]
        return torch.stack(losses).detach() if losses else None

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip every stage's gradients by the whole model's gradient norm; return it: the sum
        over stages of each one's squares, the tied pair counted once (on the first stage)."""
        tied_copy = self.module.tied_weight() if self.module.is_last else None
        grads = [p.grad for p in self.module.parameters() if p is not tied_copy]
        squares = torch.nn.utils.get_total_norm([g for g in grads if g is not None]).square()
        dist.all_reduce(squares)
        total_norm = squares.sqrt()
        torch.nn.utils.clip_grads_with_norm_(self.module.parameters(), max_norm, total_norm)
        return total_norm

    def checks(self) -> dict[str, float]:
        """The largest absolute difference between the tied weight's two copies, on the last
        stage (nothing on the others)."""
        tied = self.module.tied_weight()
        if tied is not None:
            first_copy = tied.detach().clone()
            dist.broadcast(first_copy, src=0, group=self.tied_group)
            if self.module.is_last:
                return {"tied_weight_max_difference": (first_copy - tied).abs().max().item()}
        return {}


def check_pipeline_arguments(
    num_layers: int,
    num_stages: int,
    schedule_name: str,
    num_microbatches: int,
    batch_size: int,
    last_batch_blocks: int | None = None,
) -> None:
    """Refuse a pipeline that cannot run, or would not train like one process (a pipeline of
    one process is refused before, with any --strategy that splits the model)."""
    if num_stages > num_layers:
        raise InputError(
            f"{num_stages} pipeline stages for a model of {num_layers} layers leave a stage "
            f"without a layer; use at most {num_layers} processes or a deeper --model_preset"
        )
    if schedule_name == "1f1b" and num_microbatches < num_stages:
        raise InputError(
            f"the 1F1B schedule needs at least as many microbatches as stages ({num_stages}); "
            f"pass --num_microbatches {num_stages} or more"
        )
    if num_microbatches < 1 or batch_size % num_microbatches:
        raise InputError(
            f"--num_microbatches {num_microbatches} must divide the batch of {batch_size} "
            "blocks (--per_device_train_batch_size) into equal microbatches"
        )
    if last_batch_blocks is not None and last_batch_blocks % num_microbatches:
        raise InputError(
            f"the last step has the {last_batch_blocks} blocks left of one pass, which "
            f"--num_microbatches {num_microbatches} does not divide; make --max_train_tokens a "
            f"multiple of {batch_size} blocks (--per_device_train_batch_size x --block_size)"
        )


def build_gpt2_pipeline(
    model: GPT2LMHeadModel, device: torch.device, schedule_name: str, num_microbatches: int
) -> GPT2Pipeline:
    """This process's stage of `model` (stage = rank) and its schedule, with the model's own
    loss; every process passes the same freshly built model (same seed)."""
    stage_index, num_stages = dist.get_rank(), dist.get_world_size()
    stage_module = GPT2PipelineStage(model, stage_index, num_stages).to(device)
    stage = PipelineStage(stage_module, stage_index, num_stages, device)
    loss_function = functools.partial(model.loss_function, vocab_size=model.config.vocab_size)
    schedule = PIPELINE_SCHEDULES[schedule_name](
        stage, n_microbatches=num_microbatches, loss_fn=loss_function
    )
    # Every process must take part in creating a group, also those outside it.
    tied_group = dist.new_group([0, num_stages - 1])
    return GPT2Pipeline(stage_module, schedule, num_microbatches, tied_group)
