"""GPT-2 as a sequence classifier: from the run's weights or from random ones, fine-tuned with
transformers' Trainer on the probe's training split, then asked for the test split's classes.

`GPT2ForSequenceClassification` puts a linear head (`score`, no bias) on the hidden state of
each document's last non-pad token: the end-of-text the probe appends, which has read the
whole document. Both networks get the same head initialisation (same seed), budget and order
of batches; only the transformer's starting weights differ.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
from transformers import (
    DataCollatorWithPadding,
    GPT2Config,
    GPT2ForSequenceClassification,
    Trainer,
    set_seed,
)

from common.cli import InputError
from probe.args import ProbeTrainingArguments

logger = logging.getLogger(__name__)

# The classification head: new in the pretrained model, so the only weights it may lack.
HEAD_PARAMETERS = frozenset({"score.weight"})


@dataclass
class FineTuneOutcome:
    predictions: np.ndarray  # class per test document
    train_seconds: float
    num_steps: int
    train_losses: list[dict[str, float]]  # {"step", "loss"} per logging step


def load_model_config(model_dir: Path) -> GPT2Config:
    """The run's model config; raises InputError when it is not a GPT-2."""
    try:
        config = GPT2Config.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{model_dir} holds no loadable GPT-2 config: {message}") from None
    if config.model_type != "gpt2":
        raise InputError(
            f"{model_dir} holds a {config.model_type} model; the probe fine-tunes GPT-2 runs"
        )
    return config


def build_classifier(
    model_dir: Path,
    class_names: list[str],
    pad_token_id: int,
    pretrained: bool,
    seed: int,
) -> GPT2ForSequenceClassification:
    """GPT-2 with a classification head for `class_names`, from `model_dir`'s weights or, with
    `pretrained` false, from random weights of the same shape."""
    options = {
        "num_labels": len(class_names),
        "id2label": dict(enumerate(class_names)),
        "label2id": {name: index for index, name in enumerate(class_names)},
        "pad_token_id": pad_token_id,
        "use_cache": False,
    }
    set_seed(seed)
    if not pretrained:
        config = load_model_config(model_dir)
        for name, value in options.items():
            setattr(config, name, value)
        return GPT2ForSequenceClassification(config)
    model, loading = GPT2ForSequenceClassification.from_pretrained(
        str(model_dir), local_files_only=True, output_loading_info=True, **options
    )
    # from_pretrained initialises every weight it does not find and only logs it: a checkpoint
    # saved under other names would quietly turn the "pretrained" row into a random one.
    missing = set(loading["missing_keys"]) - HEAD_PARAMETERS
    if missing:
        raise InputError(
            f"{model_dir} lacks {len(missing)} of the transformer's weights (e.g. "
            f"{sorted(missing)[0]}): it would be fine-tuned from random weights; pass the "
            "final/ folder of a pretraining run"
        )
    return model


def fine_tune_and_predict(
    model: GPT2ForSequenceClassification,
    tokenizer,
    train_dataset: datasets.Dataset,
    test_dataset: datasets.Dataset,
    training_args: ProbeTrainingArguments,
) -> FineTuneOutcome:
    """Train on `train_dataset` for the budget in `training_args`, predict `test_dataset`."""
    with tempfile.TemporaryDirectory(prefix="probe-trainer-") as scratch:
        if not training_args.keeps_trainer_files:
            training_args.output_dir = scratch
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train_dataset,
            data_collator=DataCollatorWithPadding(tokenizer),
            processing_class=tokenizer,
        )
        started = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - started
        logits = trainer.predict(test_dataset).predictions
    losses = [
        {"step": entry["step"], "loss": entry["loss"]}
        for entry in trainer.state.log_history
        if "loss" in entry
    ]
    return FineTuneOutcome(
        predictions=np.asarray(logits).argmax(axis=-1),
        train_seconds=train_seconds,
        num_steps=trainer.state.global_step,
        train_losses=losses,
    )
