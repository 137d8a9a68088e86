"""GPT-2 as a document classifier, fine-tuned from its linear probe with transformers' Trainer.

The classifier reads the pooled final hidden state of a document (probe/features.py),
standardised with the training split's mean and spread, through a linear head that starts
where the linear probe ended ("linear probing, then fine-tuning": Kumar et al., ICLR 2022), so
that a network whose features are better starts ahead.

Each weight tensor's step size is the learning rate times the tensor's root-mean-square at the
start (the idea of Adafactor's `scale_parameter` and LAMB's trust ratio), with AdamW's update
direction. Behind LayerNorm what an update changes is a tensor's size relative to itself, and
pretrained weights grow several times larger than random ones: a step of the same absolute
size would rewrite the random network faster than the pretrained one, and a short budget would
measure that speed, not what pretraining taught (docs/PROBE.md has the measurements).
"""

import tempfile
import time
from typing import Any

import datasets
import numpy as np
import torch
from sklearn.pipeline import Pipeline
from torch import nn
from transformers import DataCollatorWithPadding, GPT2Model, Trainer
from transformers.modeling_outputs import SequenceClassifierOutput

from probe.args import ProbeTrainingArguments
from probe.features import pool_hidden_states


class PooledClassifier(nn.Module):
    """A GPT-2 transformer, one pooled state per document, standardised, a linear head that
    starts as the linear probe (`head_init` "linear_probe") or from small random weights."""

    def __init__(
        self, transformer: GPT2Model, pooling: str, linear_probe: Pipeline, head_init: str
    ):
        super().__init__()
        self.transformer = transformer
        # Trainer reads and sets a few model settings (use_cache) through `config`.
        self.config = transformer.config
        self.pooling = pooling
        scaler, regression = linear_probe[0], linear_probe[-1]
        self.register_buffer("feature_mean", torch.as_tensor(scaler.mean_, dtype=torch.float32))
        self.register_buffer("feature_scale", torch.as_tensor(scaler.scale_, dtype=torch.float32))
        weight, bias = regression.coef_, regression.intercept_
        if len(regression.classes_) == 2:
            # scikit-learn keeps one row for two classes: the logit of the second; the first's
            # logit is 0, which gives the same softmax.
            weight, bias = np.vstack([np.zeros_like(weight), weight]), np.append(0.0, bias)
        self.head = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            if head_init == "random":  # as transformers starts a new head
                self.head.weight.normal_(std=transformer.config.initializer_range)
                self.head.bias.zero_()
            else:
                self.head.weight.copy_(torch.as_tensor(weight))
                self.head.bias.copy_(torch.as_tensor(bias))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> SequenceClassifierOutput:
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask)
        pooled = pool_hidden_states(hidden.last_hidden_state, attention_mask, self.pooling)
        logits = self.head((pooled - self.feature_mean) / self.feature_scale)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


# Root-mean-square below which a tensor counts as this size: zero-initialised biases still move.
MIN_PARAMETER_SCALE = 1.0e-3


def relative_step_optimizer(
    model: nn.Module, training_args: ProbeTrainingArguments
) -> torch.optim.AdamW:
    """AdamW with one parameter group per weight tensor whose learning rate is
    `training_args.learning_rate` times the tensor's root-mean-square now; Trainer's schedule
    (warm-up, decay) scales every group alike. Weight decay on matrices only, as Trainer does."""
    groups = []
    for parameter in model.parameters():
        scale = parameter.detach().float().pow(2).mean().sqrt().item()
        groups.append(
            {
                "params": [parameter],
                "lr": training_args.learning_rate * max(scale, MIN_PARAMETER_SCALE),
                "weight_decay": training_args.weight_decay if parameter.ndim >= 2 else 0.0,
            }
        )
    return torch.optim.AdamW(
        groups,
        betas=(training_args.adam_beta1, training_args.adam_beta2),
        eps=training_args.adam_epsilon,
    )


def fine_tune_and_predict(
    model: PooledClassifier,
    tokenizer,
    train_dataset: datasets.Dataset,
    test_dataset: datasets.Dataset,
    training_args: ProbeTrainingArguments,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Train on `train_dataset` for the budget in `training_args`, predict `test_dataset`: the
    class of each test document, and the training's seconds, steps and logged losses."""
    with tempfile.TemporaryDirectory(prefix="probe-trainer-") as scratch:
        if not training_args.keeps_trainer_files:
            training_args.output_dir = scratch
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train_dataset,
            data_collator=DataCollatorWithPadding(tokenizer),
            processing_class=tokenizer,
            optimizers=(
                relative_step_optimizer(model, training_args)
                if training_args.relative_learning_rate
                else None,
                None,
            ),
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
    return np.asarray(logits).argmax(axis=-1), {
        "train_seconds": train_seconds,
        "num_steps": trainer.state.global_step,
        "train_losses": losses,
    }
