"""What the probe reads from a pretraining run folder: the final model, the checkpoints saved
on the way, and from `run_summary.json` the block size, the seed and the tokens per step.

The probe never imports pretraining code: everything comes from files. The random network
the probe compares with is the one this run started from: the model shape of `final/` built
from random weights with the run's seed, as pretraining builds it (transformers'
`GPT2LMHeadModel` after `set_seed`), so "random_init" and step 0 of the probe curve are the
weights that pretraining then trained.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model, set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from common.cli import InputError
from common.files import sealed_folder_damage
from common.run_contract import FINAL_MODEL_DIR, GPT_SUMMARY_FILE, read_gpt_summary

CHECKPOINT_NAME = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")


@dataclass(frozen=True)
class PretrainingRun:
    """The facts of one finished pretraining run that the probe needs."""

    run_dir: Path
    block_size: int  # tokens per pretraining sequence: positions beyond were never trained
    seed: int  # the seed the run's random initial weights were drawn with
    global_batch_tokens: int  # tokens per optimizer step
    final_step: int  # optimizer steps of the final/ model

    @property
    def final_model_dir(self) -> Path:
        return self.run_dir / FINAL_MODEL_DIR

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, folder) of every `checkpoint-<step>/` in the run folder, by step; rotation
        (`save_total_limit`) decides which are still there."""
        matches = ((CHECKPOINT_NAME.fullmatch(path.name), path) for path in self.run_dir.iterdir())
        return sorted((int(match[1]), path) for match, path in matches if match and path.is_dir())


def read_pretraining_run(run_dir: str | Path) -> PretrainingRun:
    """The run's facts; raises InputError for a folder that is not a finished run."""
    run_dir = Path(run_dir)
    if not (run_dir / FINAL_MODEL_DIR / "config.json").is_file():
        raise InputError(
            f"{run_dir} has no {FINAL_MODEL_DIR}/ model (what a finished pretraining run "
            "saves last); pass the folder of a finished run of pretrain/run.py as --run_dir"
        )
    damage = sealed_folder_damage(run_dir / FINAL_MODEL_DIR)
    if damage is not None:
        raise InputError(f"{run_dir / FINAL_MODEL_DIR} is damaged: {damage}")
    summary = read_gpt_summary(run_dir)
    try:
        run = PretrainingRun(
            run_dir=run_dir,
            block_size=int(summary["config"]["DataArguments"]["block_size"]),
            seed=int(summary["config"]["TrainingArguments"]["seed"]),
            global_batch_tokens=int(summary["global_batch_tokens"]),
            final_step=int(summary["global_step"]),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise InputError(
            f"{run_dir / GPT_SUMMARY_FILE} lacks the block size, seed or tokens per step the "
            f"probe reads ({type(err).__name__}: {err})"
        ) from None
    return run


def load_model_config(model_dir: Path) -> GPT2Config:
    """The model config of a run's model folder; raises InputError when it is not a GPT-2."""
    try:
        config = GPT2Config.from_pretrained(
            str(model_dir), local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{model_dir} holds no loadable GPT-2 config: {message}") from None
    if config.model_type != "gpt2":
        raise InputError(
            f"{model_dir} holds a {config.model_type} model; the probe reads GPT-2 runs"
        )
    return config


def load_transformer(model_dir: Path) -> GPT2Model:
    """The transformer (no LM head) saved in `model_dir`; InputError when a weight is missing."""
    load_model_config(model_dir)
    damage = sealed_folder_damage(model_dir)
    if damage is not None:
        raise InputError(f"{model_dir} is damaged: {damage}")
    try:
        model, loading = GPT2Model.from_pretrained(
            str(model_dir), local_files_only=True, output_loading_info=True, trust_remote_code=False
        )
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{model_dir} holds no loadable GPT-2 weights: {message}") from None
    # from_pretrained initialises every weight it does not find and only logs it: a model
    # saved under other names would quietly turn the "pretrained" network into a random one.
    if loading["missing_keys"]:
        missing = sorted(loading["missing_keys"])
        raise InputError(
            f"{model_dir} lacks {len(missing)} of the transformer's weights (e.g. {missing[0]}): "
            "it would be probed with random weights; pass the folder of a pretraining run"
        )
    return model


def initial_transformer(run: PretrainingRun) -> GPT2Model:
    """The transformer the run started from: its shape, random weights drawn with its seed."""
    set_seed(run.seed)
    return GPT2LMHeadModel(load_model_config(run.final_model_dir)).transformer
