"""`torch.optim.Muon` (momentum orthogonalised by Newton-Schulz) for GPT-2's attention and MLP
matrices, --optim (AdamW) for the tied embedding / head, positions, LayerNorms and biases, as
one optimizer Trainer schedules, clips, accumulates and checkpoints. transformers' --optim names
no Muon (5.24), hence `MuonArguments`."""

import dataclasses
import math
from dataclasses import dataclass
from importlib.metadata import version

import torch
from accelerate.utils import DistributedType
from packaging.version import Version
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from transformers import Trainer, TrainingArguments
from transformers.hf_argparser import HfArg
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from transformers.pytorch_utils import Conv1D

from common.cli import InputError
from common.values import BELOW_ONE, NOT_NEGATIVE
from pretrain.parallel.strategy import Request

# DeepSpeed whose Muon runs Newton-Schulz at every ZeRO stage and on zero.Init parameters
DEEPSPEED_MUON = "0.19.8"


@dataclass
class MuonArguments:
    """Muon for the attention and MLP matrices (every strategy)."""

    muon: bool = HfArg(default=False, help="Muon for them, --optim for the rest.")
    muon_learning_rate: float = HfArg(
        default=0.02,
        help="Muon's, x sqrt(max(1, out/in)) a matrix.",
        metadata={"metavar": "R", "range": NOT_NEGATIVE},
    )
    muon_momentum: float = HfArg(
        default=0.95,
        help="Muon's Nesterov momentum.",
        metadata={"metavar": "M", "range": BELOW_ONE},
    )
    muon_weight_decay: float = HfArg(
        default=0.0,
        help="Muon's decoupled decay (AdamW's: --weight_decay).",
        metadata={"metavar": "D", "range": NOT_NEGATIVE},
    )
    embedding_learning_rate: float | None = HfArg(
        default=None,
        help="AdamW's for the tied embedding / head and positions (default --learning_rate).",
        metadata={"metavar": "R", "range": NOT_NEGATIVE},
    )

    def identity(self) -> dict:
        """What a checkpoint of a Muon run must share with the run that resumes it."""
        return {"muon": dataclasses.asdict(self)} if self.muon else {}


def check_muon_fits(
    muon_args: MuonArguments, request: Request, training_args: TrainingArguments
) -> None:
    """Refuse Muon where it cannot run as asked: a torch without it, FSDP1 (flat parameters:
    Muon would see no matrix), a DeepSpeed older than DEEPSPEED_MUON, ZeRO with clipping
    (DeepSpeed clips Muon's orthogonalised update, not the gradient: deepspeed#8439, every step
    shrunk by the norm) or a DeepSpeed config's optimizer; before any data is prepared."""
    if not muon_args.muon:
        return
    if not hasattr(torch.optim, "Muon"):
        raise InputError(f"--muon needs torch.optim.Muon (torch 2.9+); this is {torch.__version__}")
    if request.distributed_type == DistributedType.FSDP.name and request.fsdp_version != 2:
        raise InputError(
            "--muon under FSDP needs fsdp_version: 2 (FSDP1 hands the optimizer flat shards, no "
            "matrices); set it in the accelerate config, as accelerate_configs/fsdp.yaml does"
        )
    if request.distributed_type != DistributedType.DEEPSPEED.name:
        return
    deepspeed = version("deepspeed")  # read before any data is prepared; no import
    if Version(deepspeed) < Version(DEEPSPEED_MUON):
        raise InputError(
            f"--muon under ZeRO needs deepspeed {DEEPSPEED_MUON}+ (earlier ones skip Newton-Schulz "
            f"at some stages); this is {deepspeed}: pip install -r requirements-deepspeed.txt"
        )
    # The config Trainer will train with: TrainingArguments reads it from --deepspeed or from
    # the launch's variables (the accelerate config's deepspeed_config_file or inline keys).
    config = training_args.deepspeed_plugin.deepspeed_config
    clipping = config.get("gradient_clipping", "auto")  # "auto": --max_grad_norm's
    if max(training_args.max_grad_norm, 0 if clipping == "auto" else float(clipping)) > 0:
        raise InputError(
            f"--muon under DeepSpeed ZeRO with gradient clipping (--max_grad_norm "
            f"{training_args.max_grad_norm}, the DeepSpeed config's gradient_clipping {clipping}): "
            "DeepSpeed clips Muon's orthogonalised update instead of the gradient (deepspeed "
            "issue 8439), which shrinks every Muon step; pass --max_grad_norm 0 and set "
            "gradient_clipping to 0 or auto"
        )
    if "optimizer" in config:
        raise InputError(
            "--muon builds DeepSpeed's Muon itself, but the DeepSpeed config names an "
            "optimizer, which would replace it; remove its 'optimizer' section"
        )


class MuonWithAdamW(torch.optim.Optimizer):
    """torch's Muon over `muon_groups` and `adamw_cls` (AdamW) over `adamw_groups` as one optimizer
    for schedulers, clipping, state_dict(): its param groups (AdamW's first), state are theirs."""

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
        # A sharded (DTensor: FSDP2, tensor parallel) matrix's gradient and momentum gathered
        # whole: torch's Muon then orthogonalises it on each process without a collective
        # (on shards, DTensor would split every Newton-Schulz product across the processes:
        # 11-16 collectives a matrix, docs/BENCHMARKS_ARCHIVE.md), and each process keeps its
        # shard of the momentum and applies its shard of the update.
        sharded = [p for g in self.muon.param_groups for p in g["params"] if is_sharded(p.grad)]
        for param in sharded:
            param.grad = whole(param.grad)
            state = self.state[param]
            if "momentum_buffer" in state:
                state["momentum_buffer"] = whole(state["momentum_buffer"])
        self.muon.step()
        for param in sharded:
            state = self.state[param]
            state["momentum_buffer"] = state["momentum_buffer"].redistribute(
                placements=param.placements
            )


def is_sharded(tensor: torch.Tensor | None) -> bool:
    return isinstance(tensor, DTensor) and any(not p.is_replicate() for p in tensor.placements)


def whole(tensor: DTensor) -> DTensor:
    """`tensor` gathered on every process (one all-gather), still a DTensor."""
    return tensor.redistribute(placements=[Replicate()] * tensor.device_mesh.ndim)


def decay_parameter_names(model: nn.Module) -> set[str]:
    """Trainer's weight-decay rule (every parameter but biases and norms), for the loops that
    build their optimizer themselves: the method reads nothing of its instance, so none is made."""
    return set(Trainer.get_decay_parameter_names(None, model))


def split_by_layout(groups: list[dict]) -> list[dict]:
    """Each group split into its sharded (DTensor) and whole parameters, which fused and foreach
    kernels cannot take in one call (tensor parallelism holds both); empty groups dropped."""
    split = [
        {**group, "params": [p for p in group["params"] if isinstance(p, DTensor) == sharded]}
        for group in groups
        for sharded in (False, True)
    ]
    return [group for group in split if group["params"]]


def muon_optimizer(
    model: nn.Module,
    training_args: TrainingArguments,
    muon_args: MuonArguments,
    ns_steps: int = 5,
    deepspeed: bool = False,
) -> torch.optim.Optimizer | None:
    """The optimizer `muon_args` ask for, or None (Trainer then builds --optim's itself);
    `ns_steps` Newton-Schulz iterations a step (torch's default). `model` may be a whole GPT-2,
    one sharded by FSDP2 or tensor parallelism (DTensor matrices, gathered for each step: see
    `MuonWithAdamW.step`) or a pipeline stage. `deepspeed`: DeepSpeed's own Muon, which ZeRO
    orthogonalises on whole gradients before partitioning them (torch's would see flat shards)."""
    if not muon_args.muon:
        return None
    # Muon's: the blocks' 2-D weights (not the output head, a copy of the input embedding in a
    # pipeline's last stage). torch's Muon scales a step by sqrt(max(1, rows / columns)) of the
    # tensor as stored, (in, out) in Conv1D: each group's rate carries the true (out, in)
    # shape's factor over the stored one's, its decay the inverse (torch decays by rate x
    # decay): what nanochat's nn.Linear matrices get. DeepSpeed's Muon scales as torch's does.
    by_factor: dict[float, list[nn.Parameter]] = {}
    blocks = [module for module in model.modules() if isinstance(module, GPT2Block)]
    for module in (layer for block in blocks for layer in block.modules()):
        if isinstance(module, Conv1D):
            # a ZeRO-3 parameter outside forward is an empty placeholder; DeepSpeed gives its
            # shape only as ds_shape (its public getters gather the whole parameter)
            rows, columns = getattr(module.weight, "ds_shape", module.weight.shape)  # (in, out)
            factor = math.sqrt(max(1, columns / rows) / max(1, rows / columns))
        elif isinstance(module, nn.Linear):
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
    adamw_groups = split_by_layout([
        {"params": [p for n, p in rest if n not in decay], "lr": training_args.learning_rate,
         "weight_decay": 0.0},
        {"params": [p for n, p in rest if n in decay], "lr": embedding_lr,
         "weight_decay": training_args.weight_decay},
    ])  # fmt: skip
    adamw_cls, adamw_kwargs = Trainer.get_optimizer_cls_and_kwargs(training_args)
    if deepspeed:
        return deepspeed_muon(muon_groups, adamw_groups, adamw_cls, adamw_kwargs, muon_args)
    muon_kwargs = {"momentum": muon_args.muon_momentum, "ns_steps": ns_steps}
    return MuonWithAdamW(muon_groups, adamw_groups, adamw_cls, adamw_kwargs, **muon_kwargs)


def deepspeed_muon(muon_groups, adamw_groups, adamw_cls, adamw_kwargs, muon_args):
    """DeepSpeed's `MuonWithAuxAdam` over these groups, --optim for AdamW's. ZeRO runs Newton-Schulz
    only on parameters flagged `use_muon` (DeepSpeed's only way to be told; an unflagged one steps
    as SGD, silently), so every matrix is flagged; bf16 Newton-Schulz ("standard") as torch's."""
    # DeepSpeed exports it from nowhere else; ZeRO knows its Muon by this class
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam

    for group in muon_groups:
        group |= {"use_muon": True, "momentum": muon_args.muon_momentum, "ns_method": "standard"}
    for group in adamw_groups:
        group |= {"use_muon": False, "betas": adamw_kwargs["betas"], "eps": adamw_kwargs["eps"]}
    for group in (*muon_groups, *adamw_groups):
        for param in group["params"]:
            param.use_muon = group["use_muon"]
    return MuonWithAuxAdam([*adamw_groups, *muon_groups], adamw_cls, adamw_kwargs)
