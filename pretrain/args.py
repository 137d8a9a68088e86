"""The options of the pretraining stage, all in one place, and what a run changes in them.

Each dataclass checks its own values when it is created (`InputError`), before anything is read
or written. The precision is said once (`resolve_precision`): by the accelerate config when it
names bf16/fp16 (on the CPU, a CPU launch's only), else by `--bf16`/`--fp16`, else by the
hardware (bf16 where the GPU has it, fp16 on older GPUs, fp32 on CPU); the launcher's "no"
means "not decided", not "fp32".
"""

import difflib
import logging
import math
import os
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, NamedTuple, get_type_hints

import torch
from accelerate.utils import parse_flag_from_env
from huggingface_hub import get_token
from huggingface_hub.constants import HF_HUB_OFFLINE
from transformers import GPT2Config, PreTrainedTokenizerBase, TrainingArguments
from transformers.activations import ACT2FN
from transformers.hf_argparser import HfArg
from transformers.integrations import get_available_reporting_integrations
from transformers.utils.import_utils import enable_tf32

from common.cli import CommandLineParser, InputError
from common.corpus import CorpusArguments
from common.values import BELOW_ONE, NOT_NEGATIVE, POSITIVE, Range, at_least
from pretrain.batches import BlockSchedule
from pretrain.blocks.args import DataArguments
from pretrain.loss import LOSS_IMPLEMENTATIONS
from pretrain.model import PRESETS, build_model_config
from pretrain.optim import MuonArguments

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which GPT-2 to build; weights are always random (training from scratch)."""

    model_preset: str = HfArg(
        default="gpt2-117m",
        help=f"Model shape, one of: {', '.join(PRESETS)}; or LxD: L layers, D wide (a multiple "
        "of 64: heads of 64), 1024 positions, e.g. 6x256.",
    )
    vocab_size: int | None = HfArg(
        default=None,
        help="Embedding rows (at least the tokenizer's size). Default: the tokenizer's "
        "size rounded up to a multiple of 128.",
    )
    dropout: float = HfArg(
        default=0.0,
        help="Dropout on embeddings, attention and residuals; 0: one pass over the "
        "data cannot overfit, and dropout slows learning.",
        metadata={"range": BELOW_ONE},
    )
    attn_implementation: str = HfArg(
        default="sdpa",
        help="Attention kernel: 'sdpa' (torch's, flash on recent GPUs), 'eager', or "
        "'flash_attention_2' if installed.",
    )
    loss_implementation: str = HfArg(
        default="hf",
        help="'hf' (transformers' loss over all fp32 logits) or 'chunked' (the same, a "
        "few thousand positions at a time: far less memory; pretrain/loss.py).",
        metadata={"choices": list(LOSS_IMPLEMENTATIONS)},
    )
    compile_regions: bool = HfArg(
        default=True,
        help="With --torch_compile: compile one transformer block and reuse it for all "
        "(accelerate's regional compilation), much sooner than the whole model.",
    )

    activation_function: str = HfArg(
        default="gelu_pytorch_tanh",
        help="The MLP's activation: GPT-2's tanh GELU as one kernel; 'gelu_new' is the "
        "same function in several (GPT-2's code).",
    )
    compile_cache_dir: str | None = HfArg(
        default=None,
        help="Folder of torch.compile's code, reused by the next run of the model. "
        "Default: --cache_dir/compile (or TORCHINDUCTOR_CACHE_DIR if set).",
    )

    def model_config(self, tokenizer: PreTrainedTokenizerBase, block_size: int) -> GPT2Config:
        """The GPT-2 these options ask for, around `tokenizer`, for `block_size` blocks."""
        return build_model_config(
            self.model_preset,
            tokenizer,
            block_size,
            vocab_size=self.vocab_size,
            dropout=self.dropout,
            attn_implementation=self.attn_implementation,
            activation_function=self.activation_function,
        )

    def __post_init__(self) -> None:
        if self.activation_function not in ACT2FN:
            close = difflib.get_close_matches(self.activation_function, list(ACT2FN), n=1)
            raise InputError(
                f"--activation_function {self.activation_function} is not one of transformers' "
                f"activations{f' (did you mean {close[0]}?)' if close else ''}"
            )


@dataclass
class ReportArguments:
    """How the run is measured and judged in TensorBoard and run_summary.json."""

    final_loss_window: int = HfArg(
        default=5,
        help="The final loss is the mean of this many last logged training losses "
        "(each already a mean over --logging_steps steps).",
        metadata={"range": at_least(1)},
    )
    loss_threshold: float = HfArg(
        default=7.0, help="The run passes when its final loss is below this value."
    )
    peak_tflops: float | None = HfArg(
        default=None,
        help="Peak TFLOP/s of one device, for MFU. Default: looked up from the GPU name "
        "(dense 16-bit tensor-core peak); no MFU on CPU unless given.",
        metadata={"range": POSITIVE},
    )
    expected_final_loss: float | None = HfArg(
        default=None,
        help="The final loss predicted for this run (the course config's: the ladder's fit, "
        "docs/BENCHMARKS_ARCHIVE.md), recorded beside the measured one; check-gpu prints it.",
        metadata={"range": POSITIVE},
    )
    expected_final_loss_margin: float = HfArg(
        default=0.0,
        help="Half-width of that prediction's interval, in nats.",
        metadata={"range": NOT_NEGATIVE},
    )

    @property
    def prediction(self) -> tuple[float, float] | None:
        """(the expected final loss, its margin), when the run has a prediction to test."""
        if self.expected_final_loss is None:
            return None
        return self.expected_final_loss, self.expected_final_loss_margin


@dataclass
class GenerateArguments:
    """Which model to sample from, and how."""

    run_dir: str = HfArg(help="Run folder (uses its final/ model) or a model folder (checkpoint).")
    prompt: str = HfArg(default="", help="Text to continue; empty starts from end-of-text.")
    max_new_tokens: int = HfArg(
        default=60, help="Tokens to sample per text.", metadata={"range": at_least(1)}
    )
    num_samples: int = HfArg(
        default=1, help="How many continuations to print.", metadata={"range": at_least(1)}
    )
    temperature: float = HfArg(
        default=0.8,
        help="Softmax temperature: lower is more conservative.",
        metadata={"range": POSITIVE},
    )
    top_k: int = HfArg(
        default=50, help="Sample among the k most likely tokens.", metadata={"range": at_least(1)}
    )
    seed: int = HfArg(default=0, help="Random seed, for repeatable samples.")
    device: str = HfArg(default="auto", help="'auto' (a GPU if there is one), 'cpu' or 'cuda'.")


@dataclass
class PretrainTrainingArguments(TrainingArguments):
    """transformers' `TrainingArguments` with what every pretraining run needs by default; the
    configs in pretrain/configs/ set the recipe on top."""

    # The TrainingArguments that --help names besides those redeclared here: what the configs
    # and the docs set (common/cli.py; --help-all explains every one).
    brief_help_fields: ClassVar[tuple[str, ...]] = (
        ("output_dir", "resume_from_checkpoint", "seed", "use_cpu", "disable_tqdm")
        + (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
        )
        + ("optim", "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay")
        + ("adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "dataloader_num_workers")
        + ("bf16", "fp16", "tf32", "torch_compile", "logging_steps")
        + ("save_strategy", "save_steps", "save_total_limit")
    )
    max_steps: int = HfArg(
        default=-1,
        help="Stop after this many steps (a quick check); default: one pass over the token budget.",
    )
    logging_first_step: bool = HfArg(default=True, help="Log the first step's loss.")
    prediction_loss_only: bool = HfArg(
        default=True,
        help="Evaluation keeps the loss only, not blocks x positions x vocabulary logits.",
    )
    whole_batches: bool = HfArg(
        default=True,
        help="Round --max_train_tokens up to whole global batches: every step has one "
        "shape, compiled once (12M -> 184 x 65,536 tokens); false: the last step smaller.",
    )
    require_gpu: bool = HfArg(
        default=False,
        help="Refuse to start without a usable CUDA GPU, in one line saying why, instead of "
        "training on the CPU; --use_cpu true still trains on the CPU.",
    )
    check_free_memory: bool = HfArg(
        default=True,
        help="On the CPU, refuse a run that needs more memory than is free (false: start it).",
    )
    disable_tqdm: bool | None = HfArg(
        default=None,
        help="Hide the progress bars; default: hidden when stderr is not a terminal (a log "
        "file gets Trainer's loss lines, not bar redraws).",
    )
    report_to: None | str | list[str] = HfArg(
        default="tensorboard",
        help="Where Trainer logs: TensorBoard always (the report reads it), and these.",
    )
    # The numbers our configs give their schedules, which transformers leaves unchecked (a NaN
    # decay trains at rate 0).
    lr_scheduler_kwargs: dict | str | None = HfArg(
        default=None,
        help="The schedule's options: {num_decay_steps: 0.65 (steps, or a share of them), "
        "min_lr_ratio: 0.05}.",
        metadata={
            "range": {
                "num_decay_steps": Range(
                    lambda steps: 0 < steps < 1 or (steps >= 0 and steps == int(steps)),
                    "a whole number of steps or a share of the steps in (0, 1), e.g. 0.65",
                ),
                **dict.fromkeys(
                    ["min_lr_ratio", "min_lr_rate"],
                    Range(lambda ratio: 0 <= ratio <= 1, "a number in [0, 1]"),
                ),
            }
        },
    )

    def __post_init__(self) -> None:
        if self.disable_tqdm is None:
            self.disable_tqdm = not sys.stderr.isatty()
        super().__post_init__()
        if self.use_cpu:  # transformers pins no memory then: no copy to a device to overlap
            self.accelerator_config.non_blocking = False
        if "tensorboard" not in self.report_to:
            self.report_to = [*self.report_to, "tensorboard"]
        # Refused now, not as a traceback when Trainer starts: what needs the network or a
        # package that is not there.
        installed = get_available_reporting_integrations()
        if missing := [name for name in self.report_to if name not in (*installed, "none")]:
            raise InputError(
                f"--report_to {', '.join(missing)} is not installed here (installed: "
                f"{', '.join(installed)}); drop it: TensorBoard logs every run, offline"
            )
        if self.push_to_hub and (HF_HUB_OFFLINE or get_token() is None):
            raise InputError(
                "--push_to_hub needs the network and a Hugging Face token (huggingface-cli "
                "login), and this machine is offline or has none; drop it and upload final/"
            )

    @property
    def global_batch_blocks(self) -> int:
        """Blocks per optimizer step: processes x per-device batch x gradient accumulation."""
        return self.world_size * self.per_device_train_batch_size * self.gradient_accumulation_steps


# The options a predicted final loss was made for (with the recipe's own, which a config sets).
PREDICTION_SCOPE = {"model_preset", "max_train_tokens", "block_size", "vocab_size"}


class PretrainArguments(NamedTuple):
    """Every option of pretrain/run.py, one dataclass per concern."""

    model: ModelArguments
    corpus: CorpusArguments
    data: DataArguments
    report: ReportArguments
    training: PretrainTrainingArguments
    optimizer: MuonArguments

    def to_dict(self, *extra: Any) -> dict[str, dict[str, Any]]:
        """The resolved values, keyed by dataclass name (TrainingArguments hides secrets), the
        `extra` option objects of a loop first."""
        options = (*extra, self.model, self.corpus, self.data, self.report, self.optimizer)
        values = {type(option).__name__: asdict(option) for option in options}
        return values | {"TrainingArguments": self.training.to_dict()}

    @classmethod
    def parse(
        cls,
        argv: list[str] | None,
        extra: tuple[type, ...] = (),
        description: str = "",
        prog: str = "pretrain/run.py",
    ) -> tuple[Any, ...]:
        """A loop's `extra` option objects, then `PretrainArguments`, from flags and `--config`."""
        option_classes = get_type_hints(cls).values()
        parser = CommandLineParser((*extra, *option_classes), description=description, prog=prog)
        values = parser.parse_dataclasses(argv)
        args = cls(*values[len(extra) : len(extra) + len(option_classes)])
        # A config file's prediction is for its own shape and tokens, not one changed by a flag.
        changed = [f"--{name}" for name in sorted(parser.given & PREDICTION_SCOPE)]
        if args.report.prediction and changed and "expected_final_loss" not in parser.given:
            logger.info("no predicted final loss: it is not for this run's %s", ", ".join(changed))
            args.report.expected_final_loss = None
        return (*values[: len(extra)], args)


# --- What the run changes in the options it was given ----------------------------------------


def resolve_steps(
    training_args: TrainingArguments, num_train_blocks: int, batch_blocks: int, block_size: int
) -> BlockSchedule:
    """max_steps, one pass over `num_train_blocks` in global batches of `batch_blocks` (or
    --max_steps), written into `training_args` with the decay steps it implies, and logged."""
    schedule = BlockSchedule.one_pass(
        num_train_blocks, batch_blocks, block_size, training_args.max_steps
    )
    training_args.max_steps = schedule.max_steps
    resolve_decay_steps(training_args)
    logger.info(
        "%s training blocks of %d tokens, global batch %d blocks (%s tokens): %d steps",
        f"{schedule.num_train_blocks:,}", schedule.block_size, schedule.batch_blocks,
        f"{schedule.batch_tokens:,}", schedule.max_steps,
    )  # fmt: skip
    return schedule


def resolve_decay_steps(training_args: TrainingArguments) -> None:
    """warmup_stable_decay's num_decay_steps, given as a share of the steps (0.65) as
    --warmup_steps can be: the steps follow from the budget and the batch, so a count in a config
    breaks when either changes. The decay must fit after the warmup: transformers silently
    starts a longer one below the peak rate."""
    kwargs = training_args.lr_scheduler_kwargs or {}
    decay, steps = kwargs.get("num_decay_steps"), training_args.max_steps
    if decay is None:
        return
    warmup = training_args.get_warmup_steps(steps)
    if 0 < decay < 1:  # rounded up, but never into the warmup (a run of a few steps)
        share, decay = decay, min(math.ceil(decay * steps), steps - warmup)
        training_args.lr_scheduler_kwargs = {**kwargs, "num_decay_steps": decay}
        logger.info("num_decay_steps %s: the last %d of %d steps", share, decay, steps)
    if warmup + decay > steps:
        raise InputError(
            f"--lr_scheduler_kwargs num_decay_steps {kwargs['num_decay_steps']} and {warmup} "
            f"warmup steps do not fit in this run's {steps} steps: give at most "
            f"{steps - warmup} steps, or a share of the steps (e.g. 0.65)"
        )


LAUNCHER_PRECISION_VARIABLE = "ACCELERATE_MIXED_PRECISION"


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run trains in, and who decided it (for the log and the summary)."""

    mixed_precision: str  # "bf16", "fp16" or "no" (fp32)
    source: str
    tf32: bool

    @property
    def name(self) -> str:  # "bf16", "fp16" or "fp32"
        return "fp32" if self.mixed_precision == "no" else self.mixed_precision


def resolve_precision(training_args: TrainingArguments) -> PrecisionChoice:
    """Decide bf16/fp16/fp32 and TF32, write the choice into `training_args`, and return it."""
    launcher = os.environ.get(LAUNCHER_PRECISION_VARIABLE, "no").lower()
    if training_args.device.type != "cuda" and not parse_flag_from_env("ACCELERATE_USE_CPU"):
        launcher = "no"  # a GPU launch's config on the CPU (--use_cpu true): fp32, as CPU launches
    flag = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else None
    if launcher != "no" and flag and launcher != flag:
        raise InputError(
            f"precision set twice: the accelerate config says {launcher} and the command line "
            f"says --{flag}; drop one of them"
        )
    device = training_args.device
    cuda = device.type == "cuda"
    has_bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)
    if launcher != "no":
        mixed_precision, source = launcher, "accelerate config"
    elif flag:
        mixed_precision, source = flag, f"--{flag}"
    elif not cuda:
        mixed_precision, source = "no", f"automatic ({device.type}: fp32)"
    else:
        mixed_precision = "bf16" if has_bf16 else "fp16"
        support = "supports" if has_bf16 else "has no"
        source = f"automatic ({torch.cuda.get_device_name(device)} {support} bf16)"
    if mixed_precision == "bf16" and cuda and not has_bf16:
        raise InputError(
            f"{torch.cuda.get_device_name(device)} has no bf16 but {source} asks for it; use "
            "fp16 (accelerate launch --mixed_precision fp16, or --fp16 without accelerate)"
        )
    training_args.bf16 = mixed_precision == "bf16"
    training_args.fp16 = mixed_precision == "fp16"
    training_args.mixed_precision = mixed_precision

    # TF32 matmuls for whatever stays in fp32 (the optimizer, the loss); TrainingArguments
    # already applied an explicit --tf32, and refuses it on GPUs that lack it.
    tf32 = training_args.tf32
    if tf32 is None:
        tf32 = cuda and torch.cuda.get_device_capability(device)[0] >= 8
        if tf32:
            enable_tf32(True)
    choice = PrecisionChoice(mixed_precision=mixed_precision, source=source, tf32=bool(tf32))
    logger.info("precision: %s (%s), TF32 %s", choice.name, source, "on" if tf32 else "off")
    return choice


def budget_in_whole_batches(args: PretrainArguments, batch_blocks: int) -> DataArguments:
    """The data options with --max_train_tokens rounded up to whole global batches (with
    --whole_batches): every step has the first one's shape, compiled once."""
    data_args, batch_tokens = args.data, batch_blocks * args.data.block_size
    budget = data_args.max_train_tokens
    if budget is None or not args.training.whole_batches or budget % batch_tokens == 0:
        return data_args
    rounded = math.ceil(budget / batch_tokens) * batch_tokens
    logger.info(
        "token budget %s rounded up to %s, %d whole batches of %s tokens (--whole_batches)",
        f"{budget:,}", f"{rounded:,}", rounded // batch_tokens, f"{batch_tokens:,}",
    )  # fmt: skip
    return replace(data_args, max_train_tokens=rounded)
