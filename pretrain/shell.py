"""What both training loops do around their own loop: the random model they start from, the
run's description for its summary; and after the last step, the summary written once, its
headline printed, and a run that diverged failed in one line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import GPT2LMHeadModel, set_seed

from common.cli import RunFailed
from common.files import write_json_atomic
from common.run_contract import GPT_SUMMARY_FILE
from pretrain.args import PrecisionChoice, PretrainArguments
from pretrain.loss import use_chunked_loss
from pretrain.metrics import flops_per_token, job_peak_flops_per_second
from pretrain.model import build_model, count_parameters
from pretrain.parallel.strategy import Strategy
from pretrain.plan import RunPlan
from pretrain.summary import RunSetup, headline, speed_settings

logger = logging.getLogger(__name__)


def build_random_model(args: PretrainArguments, plan: RunPlan) -> GPT2LMHeadModel:
    """The planned GPT-2 with random weights drawn from --seed (the initial weights are part of
    the experiment: both loops start from the same ones), with the loss --loss_implementation
    names."""
    set_seed(args.training.seed)
    model = build_model(plan.model_config)
    if args.model.loss_implementation == "chunked":
        use_chunked_loss(model)
    return model


def describe_run(
    args: PretrainArguments,
    plan: RunPlan,
    model: GPT2LMHeadModel,
    strategy: Strategy,
    accelerator_state: str,
    precision: PrecisionChoice,
    extra_options: Sequence[Any] = (),
) -> RunSetup:
    """The run as its summary records it: options, data, steps, model, parallelism, speed."""
    training_args = args.training
    return RunSetup(
        config={
            **args.to_dict(*extra_options),
            "model_config": model.config.to_dict(),
            "precision_source": precision.source,
        },
        final_loss_window=args.report.final_loss_window,
        loss_threshold=args.report.loss_threshold,
        schedule=plan.schedule,
        data=plan.data,
        num_parameters=count_parameters(model),
        flops_per_token=flops_per_token(model, args.data.block_size),
        peak_flops_per_second=job_peak_flops_per_second(
            args.report.peak_tflops, training_args.device, training_args.world_size
        ),
        strategy=strategy,
        accelerator_state=accelerator_state,
        speed_settings=speed_settings(
            args.model, training_args, precision.name, precision.tf32, model.config
        ),
        token_budget=args.data.max_train_tokens,
        run_identity=plan.identity,
        skipped_checkpoints=plan.skipped_checkpoints,
    )


def finish_run(summary: dict[str, Any], output_dir: Path, is_main: bool) -> None:
    """Write run_summary.json and print its headline (main process); then fail a run that
    diverged in one line, after its summary records it."""
    if is_main:
        write_json_atomic(output_dir / GPT_SUMMARY_FILE, summary)
        print(f"{headline(summary)}; run folder {output_dir}")
    if summary["verdict"] == "diverged":
        raise RunFailed(
            f"training diverged at step {summary['diverged_at_step']} "
            f"({summary['divergence']}) and stopped; {output_dir}/{GPT_SUMMARY_FILE} records the "
            "run as diverged, with no final/ model; lower --learning_rate or lengthen "
            "--warmup_steps, and start a new run"
        )


def nothing_to_resume(finished: dict[str, Any], output_dir: Path, is_main: bool) -> int:
    """Resuming a run that already finished: 0 when it passed or failed, RunFailed (exit 3)
    again when it diverged; its folder is left as it is."""
    if finished["verdict"] == "diverged":
        raise RunFailed(
            f"the run in {output_dir} diverged at step {finished.get('diverged_at_step')} and "
            "cannot be resumed; start a new run in another --output_dir"
        )
    if is_main:
        print(f"run folder {output_dir} holds a finished run ({headline(finished)}); nothing to do")
    return 0
