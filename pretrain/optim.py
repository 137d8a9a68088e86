"""`torch.optim.Muon` (momentum orthogonalised by Newton-Schulz) for GPT-2's attention and MLP
matrices, --optim (AdamW) for the tied embedding / head, positions, LayerNorms and biases, as
one optimizer Trainer schedules, clips, accumulates and checkpoints. transformers' --optim names
no Muon (5.24), hence `MuonArguments`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel, Trainer, TrainingArguments
from transformers.hf_argparser import HfArg
from transformers.pytorch_utils import Conv1D

from common.cli import InputError
from pretrain.parallel.strategy import DATA_PARALLEL, SINGLE_PROCESS, Request


@dataclass
class MuonArguments:
    """Muon for the attention and MLP matrices (one process or DDP)."""

    muon: bool = HfArg(default=False, help="Muon for them, --optim for the rest.")
    muon_learning_rate: float = HfArg(
        default=0.02, help="Muon's, x sqrt(max(1, out/in)) a matrix.", metadata={"metavar": "R"}
    )
    muon_momentum: float = HfArg(
        default=0.95, help="Muon's Nesterov momentum.", metadata={"metavar": "M"}
    )
    muon_weight_decay: float = HfArg(
        default=0.0,
        help="Muon's decoupled decay (AdamW's: --weight_decay).",
        metadata={"metavar": "D"},
    )
    embedding_learning_rate: float | None = HfArg(
        default=None,
        help="AdamW's for the tied embedding / head and positions (default --learning_rate).",
        metadata={"metavar": "R"},
    )

    def __post_init__(self) -> None:
        rates = (self.muon_learning_rate, self.muon_weight_decay, self.embedding_learning_rate)
        if min(value or 0 for value in rates) < 0 or not 0 <= self.muon_momentum < 1:
            raise InputError(
                "--muon_* and --embedding_learning_rate must be >= 0, the momentum < 1"
            )

    def identity(self) -> dict:
        """What a checkpoint of a Muon run must share with the run that resumes it."""
        return {"muon": dataclasses.asdict(self)} if self.muon else {}


def check_muon_fits(muon_args: MuonArguments, request: Request) -> None:
    """Refuse Muon where it cannot run as asked: a torch without it, sharded strategies (Muon
    must see each matrix whole, FSDP and ZeRO hand the optimizer shards or flat buffers)."""
    if not muon_args.muon:
        return
    if not hasattr(torch.optim, "Muon"):
        raise InputError(f"--muon needs torch.optim.Muon (torch 2.9+); this is {torch.__version__}")
    if request.distributed_type not in (SINGLE_PROCESS, DATA_PARALLEL):
        raise InputError(
            f"--muon trains with one process or DDP, not {request.distributed_type}: Muon needs "
            "every matrix whole; pass --muon false (AdamW) or drop the FSDP/DeepSpeed config"
        )


class MuonWithAdamW(torch.optim.Optimizer):
    """torch's Muon over `muon_groups` and `adamw_cls` (AdamW) over `adamw_groups`, as one
    optimizer: its param groups (AdamW's first) and state are theirs, so schedulers, clipping
    and state_dict() see one optimizer."""

    def __init__(self, muon_groups, adamw_groups, adamw_cls, adamw_kwargs, **muon_kwargs) -> None:
        self.adamw = adamw_cls(adamw_groups, **adamw_kwargs)
        self.muon = torch.optim.Muon(muon_groups, **muon_kwargs)
        super().__init__([*self.adamw.param_groups, *self.muon.param_groups], {})
        self._share_groups_and_state()

    def _share_groups_and_state(self) -> None:
        groups, split = self.param_groups, len(self.adamw.param_groups)
        self.adamw.param_groups, self.muon.param_groups = groups[:split], groups[split:]
        self.adamw.state = self.muon.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # new group and state objects: share them again
        self._share_groups_and_state()

    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError("MuonWithAdamW takes no closure")
        self.adamw.step()
        self.muon.step()


def decay_parameter_names(model: nn.Module) -> set[str]:
    """Trainer's weight-decay rule (every parameter but biases and norms), for the loops that
    build their optimizer themselves: the method reads nothing of its instance, so none is made."""
    return set(Trainer.get_decay_parameter_names(None, model))


def muon_optimizer(
    model: PreTrainedModel,
    training_args: TrainingArguments,
    muon_args: MuonArguments,
    ns_steps: int = 5,
) -> MuonWithAdamW | None:
    """The optimizer `muon_args` ask for, or None (Trainer then builds --optim's itself);
    `ns_steps` Newton-Schulz iterations a step (torch's default)."""
    if not muon_args.muon:
        return None
    # Muon's: the blocks' 2-D weights (the tied output head is the input embedding). torch's Muon
    # scales a step by sqrt(max(1, rows / columns)) of the tensor as stored, (in, out) in Conv1D:
    # each group's rate carries the true (out, in) shape's factor over the stored one's, its decay
    # the inverse (torch decays by rate x decay): what nanochat's nn.Linear matrices get.
    head = model.get_output_embeddings()
    by_factor: dict[float, list[nn.Parameter]] = {}
    for module in model.modules():
        if isinstance(module, Conv1D):
            rows, columns = module.weight.shape  # (in, out)
            factor = math.sqrt(max(1, columns / rows) / max(1, rows / columns))
        elif isinstance(module, nn.Linear) and module is not head:
            factor = 1.0  # stored as (out, in)
        else:
            continue
        by_factor.setdefault(factor, []).append(module.weight)
    matrices = {matrix for group in by_factor.values() for matrix in group}
    rate, decay_rate = muon_args.muon_learning_rate, muon_args.muon_weight_decay
    muon_groups = [{"params": params, "lr": rate * factor, "weight_decay": decay_rate / factor}
                   for factor, params in sorted(by_factor.items())]  # fmt: skip
    decay = decay_parameter_names(model)
    rest = [(n, p) for n, p in model.named_parameters() if p not in matrices and p.requires_grad]
    embedding_lr = muon_args.embedding_learning_rate
    embedding_lr = training_args.learning_rate if embedding_lr is None else embedding_lr
    adamw_groups = [
        {"params": [p for n, p in rest if n not in decay], "weight_decay": 0.0},
        {"params": [p for n, p in rest if n in decay], "lr": embedding_lr,
         "weight_decay": training_args.weight_decay},
    ]  # fmt: skip
    adamw_cls, adamw_kwargs = Trainer.get_optimizer_cls_and_kwargs(training_args)
    muon_kwargs = {"momentum": muon_args.muon_momentum, "ns_steps": ns_steps}
    return MuonWithAdamW(muon_groups, adamw_groups, adamw_cls, adamw_kwargs, **muon_kwargs)
