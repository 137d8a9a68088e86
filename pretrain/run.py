"""Pretrain GPT-2 from scratch on packed Web of Science blocks with transformers' Trainer.

    launch-pretraining [--config_file accelerate_configs/X.yaml] pretrain/run.py \\
        --config pretrain/configs/gpt2_117m.yaml [--flag value ...]
    python pretrain/run.py --config pretrain/configs/tiny.yaml --corpus ... --tokenizer_dir ...

The run folder (`--output_dir`) receives `checkpoint-<step>/`, `tensorboard/`,
`nvidia-smi.txt` (with a GPU), `final/` (model + tokenizer, loadable with
`AutoModelForCausalLM`) and, last, `run_summary.json`.
"""

import logging
import sys
from contextlib import nullcontext

try:  # `python pretrain/run.py` with a Python that lacks the venv: one line, not a traceback
    import common  # noqa: F401, I001 (first: Ctrl-C while torch imports is one line)
    import torch

    from pretrain.batches import collate_blocks
except ModuleNotFoundError as missing:
    print(
        f"error: {sys.executable} lacks the toolkit's packages ({missing.name}): run "
        ".venv/bin/python pretrain/run.py, or activate the venv first (source "
        ".venv/bin/activate; make install creates it)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None
from torch.utils.data import DataLoader
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import GPT2LMHeadModel, Trainer

from pretrain.args import PrecisionChoice, resolve_precision
from pretrain.metrics import clock_trainer
from pretrain.optim import MuonArguments, check_muon_fits, muon_optimizer
from pretrain.parallel.strategy import (
    Strategy,
    check_request_fits_device,
    check_strategy,
    requested_strategy,
)
from pretrain.shell import RunShell, command
from pretrain.summary import LoopResult, replica_checksums

logger = logging.getLogger(__name__)


class TrainerRun(RunShell):
    """The random model in transformers' Trainer with the shell's callbacks; the strategy
    accelerate set up is checked against the one the launch asked for."""

    description = "Pretrain GPT-2 from scratch on packed blocks (transformers Trainer)."
    checkpoints = True

    def check_launch(self) -> None:
        # Read before Trainer exists: its Accelerator rewrites the launcher's variables.
        self.request = requested_strategy(self.training_args)
        check_request_fits_device(self.request, self.training_args.device)
        check_muon_fits(self.args.optimizer, self.request, self.training_args)

    def precision(self) -> PrecisionChoice:
        return resolve_precision(self.training_args)

    def build(self, model: GPT2LMHeadModel) -> tuple[Strategy, str]:
        plan = self.plan
        self.trainer = trainer = MuonTrainer(
            muon_args=self.args.optimizer,
            model=model,
            args=self.training_args,
            train_dataset=plan.blocks["train"],
            eval_dataset=plan.blocks["validation"],
            data_collator=collate_blocks,
            processing_class=plan.tokenizer,
            callbacks=[self.stop_on_signal, self.divergence, self.manifests],
        )
        # From here accelerate has set up the processes, devices and precision it will train with.
        accelerator_state = str(trainer.accelerator.state)
        logger.info("accelerator state:\n%s", accelerator_state)
        strategy = check_strategy(self.request, trainer.accelerator)
        logger.info(
            "parallelism: %s (%s, %d processes), as requested",
            strategy.name, strategy.distributed_type, strategy.num_processes,
        )  # fmt: skip
        clock_trainer(trainer, self.clock, self.tensorboard_dir, plan.resumed_from_step)
        return strategy, accelerator_state

    def train(self) -> None:
        resume = self.plan.resume_checkpoint
        # Log lines above a terminal's bar, not through it; without a bar, logging as it is (the
        # redirect adds a handler of its own even where the root logger had none).
        with nullcontext() if self.trainer.args.disable_tqdm else logging_redirect_tqdm():
            self.trainer.train(resume_from_checkpoint=str(resume) if resume else None)

    def write_final_model(self, directory: str) -> None:
        self.trainer.save_model(directory)

    def measure(self, evaluate: bool) -> LoopResult:
        trainer = self.trainer
        return LoopResult(
            global_step=trainer.state.global_step,
            logged_losses=[entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
            eval_loss=evaluate_blocks(trainer) if evaluate else None,
            replica_checksums=replica_checksums(
                trainer.accelerator.unwrap_model(trainer.model),
                sharded=trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled,
            ),
        )


class MuonTrainer(Trainer):
    """Trainer building `muon_optimizer`'s optimizer where it builds its own: FSDP and DeepSpeed
    refuse one passed in (DeepSpeed replaces it with AdamW, without a word)."""

    def __init__(self, muon_args: MuonArguments, **kwargs) -> None:
        super().__init__(**kwargs)
        self.muon_args = muon_args
        plugin = self.accelerator.state.deepspeed_plugin
        if muon_args.muon and plugin is not None and plugin.zero_stage == 3:
            # ZeRO-3 runs Muon on all-reduced gradients only (it refuses reduce-scatter): the
            # same sums, more bytes; accelerate's config keys cannot set it.
            plugin.deepspeed_config["zero_optimization"]["reduce_scatter"] = False

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            self.optimizer = muon_optimizer(
                self.model if model is None else model,
                self.args,
                self.muon_args,
                deepspeed=self.is_deepspeed_enabled,
            )
        return super().create_optimizer(model)


@torch.no_grad()
def evaluate_blocks(trainer: Trainer) -> float:
    """The validation loss: the mean of each block's loss, whatever the number of processes
    (Trainer's averages batch means, counting the blocks accelerate repeats to pad the last;
    `gather_for_metrics` drops them). Eager: compiled, no-grad is a new graph for one pass."""
    blocks = DataLoader(trainer.eval_dataset, batch_size=1, collate_fn=collate_blocks)
    model = trainer.model_wrapped
    model.eval()
    losses = []
    with torch.compiler.set_stance("force_eager"):
        for batch in trainer.accelerator.prepare(blocks):
            losses.append(trainer.accelerator.gather_for_metrics(model(**batch).loss[None]))
    eval_loss = torch.cat(losses).float().mean().item()
    trainer.log({"eval_loss": eval_loss})  # TensorBoard's eval/loss, the log history
    return eval_loss


def parse_pretrain_args(argv: list[str] | None = None):
    """The `PretrainArguments` (model, corpus, data, report, training) from flags and `--config`."""
    return TrainerRun.parse(argv)[0]


main = command(TrainerRun)

if __name__ == "__main__":
    sys.exit(main())
