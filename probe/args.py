"""Options of the classification probe: what to probe and on which labels, and the fine-tuning
budget (transformers' `TrainingArguments`, with the probe's own defaults)."""

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

from torch import cuda
from transformers import TrainingArguments
from transformers.hf_argparser import HfArg
from transformers.trainer_utils import SaveStrategy

from common.cli import InputError
from common.corpus import CorpusArguments
from common.run_contract import PROBE_METHODS
from common.values import SHARE, at_least
from probe.features import MEAN, Pooling

LabelLevel = Literal["domain", "area", "combined"]
HeadInit = Literal["linear_probe", "random"]
# Tokens per document unless the run's blocks are shorter: an abstract's first ~190 words.
DEFAULT_MAX_LENGTH = 256


@dataclass
class ProbeArguments:
    """Which run to probe, on which labels, how the documents are split and cut."""

    run_dir: str = HfArg(
        help="Folder of a finished pretraining run: its final/ model and tokenizer are "
        "probed, its checkpoint-<step>/ folders give the probe curve, and the results are "
        "written to its probe/ folder."
    )
    label_level: LabelLevel = HfArg(
        default="domain",
        help="Labels to predict: domain (YL1.txt, 7 classes in WOS46985), area (the pair "
        "YL1, YL2: YL2 numbers the areas within their domain; 134 classes) or combined (Y.txt "
        "as given; on WoS the same 134 areas, numbered across domains).",
    )
    label_names_file: str | None = HfArg(
        default=None,
        help="Data.xlsx with the class names (columns Y1 Y2 Y Domain area); default: "
        "Meta-data/Data.xlsx of the corpus when it has one, else classes are numbers.",
    )
    test_fraction: float = HfArg(
        default=0.2,
        help="Share of each class's documents held out for testing.",
        metadata={"range": SHARE},
    )
    split_seed: int = HfArg(
        default=0, help="Key of the document hash that orders each class for the split."
    )
    max_length: int | None = HfArg(
        default=None,
        help="Tokens per document, end-of-text included: longer documents keep their "
        f"beginning. Default: the run's pretraining block size, at most {DEFAULT_MAX_LENGTH}; "
        "more is refused (positions past the block size were never trained).",
        metadata={"range": at_least(2)},
    )
    pooling: Pooling = HfArg(
        default=MEAN,
        help="Which final hidden states make a document's vector: mean (over its "
        "tokens), last_token (its last word) or end_of_text (the end-of-text appended to "
        "it, as GPT2ForSequenceClassification reads); docs/PROBE.md has the measurements.",
    )
    head_init: HeadInit = HfArg(
        default="linear_probe",
        help="Where fine-tuning starts the head: linear_probe (the logistic regression "
        "fitted on the same network's frozen features) or random (small random weights, "
        "as a new classification head usually starts).",
    )
    curve: bool = HfArg(
        default=True,
        help="Also the probe curve: the linear probe of the run's random initial weights "
        "and of every checkpoint-<step>/ the run folder still holds, against pretraining "
        "tokens.",
    )
    methods: list[str] = HfArg(
        default_factory=lambda: list(PROBE_METHODS),
        help="Which classifiers to train and test on the same split: pretrained (the "
        "run's weights, fine-tuned), random_init (the network the run started from, same "
        "budget), pretrained_linear and random_init_linear (logistic regression on each "
        "network's frozen, standardised features), tfidf (TF-IDF + logistic regression).",
        metadata={"choices": list(PROBE_METHODS)},
    )
    overwrite: bool = HfArg(
        default=False, help="Replace the results of an earlier probe of the same label level."
    )

    def __post_init__(self) -> None:
        if not self.methods:  # a config file's []; the parser checks each method
            raise InputError(f"--methods is empty; give one or more of {', '.join(PROBE_METHODS)}")


@dataclass
class ProbeTrainingArguments(TrainingArguments):
    """`TrainingArguments` whose defaults are the probe's fine-tuning budget (docs/PROBE.md has
    the measurements behind them), no checkpoints. The learning rate is relative: each weight
    tensor steps by it times the tensor's size (probe/classifier.py)."""

    # Besides the fields above, the TrainingArguments that --help names (common/cli.py).
    brief_help_fields: ClassVar = ("gradient_accumulation_steps", "max_steps", "fp16", "use_cpu")

    output_dir: str | None = HfArg(
        default=None,
        help="Folder for the Trainer's own files (checkpoints, logs) if you want them; "
        "default: a temporary folder, deleted at the end. The results always go to "
        "RUN_DIR/probe/.",
    )
    num_train_epochs: float = HfArg(default=3.0, help="Passes over the probe's training split.")
    learning_rate: float = HfArg(
        default=1.0e-2,
        help="Peak learning rate; with --relative_learning_rate (the default) a step "
        "size relative to each weight tensor's root-mean-square at the start of "
        "fine-tuning: 1e-2 moves a tensor by about a hundredth of its size per step, for "
        "the small random weights and the larger pretrained ones alike.",
    )
    relative_learning_rate: bool = HfArg(
        default=True,
        help="Scale each weight tensor's learning rate by its root-mean-square; false: "
        "the same absolute rate for every weight (Trainer's AdamW).",
    )
    per_device_train_batch_size: int = HfArg(
        default=32, help="Documents per training step and device."
    )
    per_device_eval_batch_size: int = HfArg(
        default=64, help="Documents per prediction step and device."
    )
    warmup_steps: float = HfArg(
        default=0.06, help="Linear warm-up: steps, or a fraction (< 1) of all steps."
    )
    weight_decay: float = HfArg(default=0.01, help="AdamW weight decay.")
    logging_steps: float = HfArg(default=10, help="Training loss logged every this many steps.")
    save_strategy: SaveStrategy | str = HfArg(
        default="no", help="Checkpoints: none by default (the probe keeps no model)."
    )
    seed: int = HfArg(
        default=0,
        help="Seed of the order of the training batches. (The random network is the one "
        "the run started from, drawn with the run's own seed.)",
    )
    bf16: bool | None = HfArg(
        default=None,
        help="bf16 mixed precision; default: on when training on a GPU that has it "
        "(Ampere and newer), as pretraining does, else fp32.",
    )

    def __post_init__(self) -> None:
        self.keeps_trainer_files = self.output_dir is not None
        if self.bf16 is None:
            self.bf16 = not self.use_cpu and cuda.is_available() and cuda.is_bf16_supported()
        super().__post_init__()


class ProbeCommand(NamedTuple):
    """Every option of probe/run.py."""

    probe: ProbeArguments
    corpus: CorpusArguments
    training: ProbeTrainingArguments

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The resolved values, keyed by dataclass name (TrainingArguments hides secrets)."""
        return {
            "ProbeArguments": dataclasses.asdict(self.probe),
            "CorpusArguments": dataclasses.asdict(self.corpus),
            "ProbeTrainingArguments": self.training.to_dict(),
        }
