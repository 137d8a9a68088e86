"""Checkpoints that are whole or ignored, resume only of the same run, and a diverged loss that
stops a run (a signal's stop is pretrain/stops.py's). A checkpoint is complete when its manifest,
written last, is there and every file still matches it: a save cut short never looks complete.
"""

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate.utils import DistributedType
from accelerate.utils.constants import FSDP_MODEL_NAME
from safetensors import safe_open
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer import (
    OPTIMIZER_NAME,
    OPTIMIZER_NAME_BIN,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
)
from transformers.trainer_pt_utils import safe_globals
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, sort_checkpoints

from common.cli import InputError
from common.files import (
    damage_in,
    file_digests,
    read_manifest,
    write_json_atomic,
)
from common.run_contract import (
    CHECKPOINT_MANIFEST_FILE,
    FINAL_MODEL_DIR,
    GPT_SUMMARY_FILE,
)
from pretrain.batches import BlockSchedule
from pretrain.blocks.cache import tokenizer_files_digest
from pretrain.parallel.strategy import (
    DATA_PARALLEL,
    Strategy,
    local_tensor,
    requested_strategy,
)
from pretrain.stops import STOP_GRACE_VARIABLE, stop_grace_seconds

logger = logging.getLogger(__name__)

RESUME_AUTO = "auto"
# The scheme of `run_identity`, recorded in it. 1 (not recorded, releases before it): the
# tokenizer's files hashed by their bytes, not their JSON files by their parsed content.
IDENTITY_VERSION = 2
# What `run_identity` takes from the data settings, the model config and the training options.
IDENTITY_DATA_SETTINGS = ("validation_fraction", "split_seed", "max_train_tokens", "repeat_corpus")
IDENTITY_MODEL_SHAPE = ("vocab_size", "n_layer", "n_embd", "n_head", "n_positions")
IDENTITY_TRAINING_OPTIONS = (
    "optim", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "seed",
)  # fmt: skip


def checkpoint_global_step(checkpoint_dir: Path) -> int | None:
    """The step a checkpoint was saved at, or None if its trainer state is unreadable."""
    try:
        return TrainerState.load_from_json(str(checkpoint_dir / TRAINER_STATE_NAME)).global_step
    except (OSError, ValueError, TypeError):
        return None


def list_checkpoints(output_dir: Path) -> list[Path]:
    """`checkpoint-<step>` folders in `output_dir`, newest (highest step) first."""
    return [Path(path) for path in reversed(sort_checkpoints(str(output_dir)))]


def checkpoint_damage(checkpoint_dir: Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or None when it is whole: its manifest reads,
    every file matches it, and what Trainer resumes from loads as Trainer loads it. A folder
    without a manifest is never resumed from: its files cannot be checked (a save cut short, or
    written by another tool), and a loss that looks right does not prove its weights whole."""
    manifest = read_manifest(checkpoint_dir)
    if manifest is None:
        if (checkpoint_dir / CHECKPOINT_MANIFEST_FILE).exists():
            return f"its {CHECKPOINT_MANIFEST_FILE} is unreadable"
        return f"no {CHECKPOINT_MANIFEST_FILE} (a save cut short, or not written by this toolkit)"
    if TRAINER_STATE_NAME not in manifest["files"]:  # e.g. a run's final/ model
        return f"no {TRAINER_STATE_NAME}: a saved model, not a checkpoint to resume"
    if not isinstance(manifest.get("run_identity"), dict):  # sealed unchecked by older releases
        return "adopted without a manifest by an older release: its files were never checked"
    files = manifest["files"]
    return damage_in(checkpoint_dir, files, CHECKPOINT_MANIFEST_FILE) or load_damage(checkpoint_dir)


# Files that hold a pickle (Trainer's, accelerate's, DeepSpeed's; DCP's `.metadata`, which
# torch unpickles unrestricted): each must load as tensors and plain data only.
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".metadata")
DEEPSPEED_TAG_FILE = "latest"  # names the folder of DeepSpeed's shards, `global_step<N>`


def load_damage(checkpoint_dir: Path) -> str | None:
    """Why a file a resume loads (Trainer, accelerate or DeepSpeed, at any depth) does not load
    as tensors only (a manifest matching a planted file proves nothing), or None: loaded here
    first, `weights_only`, so that no pickle runs as code when the library loads it."""
    allowed = deepspeed_state_classes(checkpoint_dir)
    path = checkpoint_dir / TRAINER_STATE_NAME
    try:
        TrainerState.load_from_json(str(path))
        if (path := checkpoint_dir / DEEPSPEED_TAG_FILE).is_file():
            tag = path.read_text(encoding="utf-8").strip()
            if tag in ("", ".", "..") or Path(tag).name != tag:
                return f"{DEEPSPEED_TAG_FILE} names {tag!r}, not a folder of {checkpoint_dir.name}/"
        for path in sorted(checkpoint_dir.rglob("*")):
            if path.suffix == ".safetensors":
                with safe_open(str(path), "pt") as tensors:
                    tensors.keys()
            elif path.suffix in PICKLED_SUFFIXES and path.name != TRAINING_ARGS_NAME:
                # Trainer never loads its pickled arguments; numpy's arrays are the RNG states.
                with safe_globals(), torch.serialization.safe_globals(allowed):
                    torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as err:  # noqa: BLE001 (each loader has its own errors for a bad file)
        name = path.relative_to(checkpoint_dir).as_posix()
        return f"{name} does not load as tensors only ({type(err).__name__}: {str(err)[:120]})"
    return None


def deepspeed_state_classes(checkpoint_dir: Path) -> list[type]:
    """What DeepSpeed pickles in a ZeRO optimizer's state besides tensors, all plain data: the
    stage (an enum), the loss scale and its settings, each parameter's place in the flat
    partition (numel, start); none for a checkpoint DeepSpeed did not write."""
    if not (checkpoint_dir / DEEPSPEED_TAG_FILE).exists():
        return []
    try:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        raise InputError(
            f"{checkpoint_dir} holds DeepSpeed's shards and DeepSpeed is not installed: resume "
            "it under the ZeRO config it was written with (pip install -r "
            "requirements-deepspeed.txt)"
        ) from None
    return [LossScaler, ZeroStageEnum, fragment_address]


def seal_checkpoint(checkpoint_dir: Path, record: dict[str, Any]) -> None:
    """Write the manifest: every file's size and checksum, and `record`; written last."""
    write_json_atomic(
        checkpoint_dir / CHECKPOINT_MANIFEST_FILE,
        {"files": file_digests(checkpoint_dir, skip=(CHECKPOINT_MANIFEST_FILE,)), **record},
    )


def run_identity(
    training_args: TrainingArguments,
    data: dict[str, Any],
    model_config: GPT2Config,
    schedule: BlockSchedule,
) -> dict[str, Any]:
    """What makes a run this run: a checkpoint continued with any of these changed trains another
    model. The processes and the per-process batch may change, as long as the global batch stays."""
    return {
        "identity_version": IDENTITY_VERSION,
        "corpus": data["corpus_fingerprint"],
        "tokenizer": data["tokenizer_files_sha256"],
        "block_size": schedule.block_size,
        **{name: data["settings"][name] for name in IDENTITY_DATA_SETTINGS},
        "global_batch_blocks": schedule.batch_blocks,
        "max_steps": schedule.max_steps,
        **{name: getattr(model_config, name) for name in IDENTITY_MODEL_SHAPE},
        **{name: getattr(training_args, name) for name in IDENTITY_TRAINING_OPTIONS},
        "optim": str(training_args.optim),
        "lr_scheduler_type": str(training_args.lr_scheduler_type),
    }


def identity_differences(
    saved: dict[str, Any],
    current: dict[str, Any],
    tokenizer_dir: str | Path,
    where: str = "in the checkpoint",
) -> list[str]:
    """`name: X now, Y <where>` for each item of the run identity that differs, the `saved`
    one read in the scheme of the release that wrote it (its `identity_version`)."""
    saved, current = dict(saved), dict(current)
    version = saved.pop("identity_version", 1)
    current.pop("identity_version")
    if not isinstance(version, int) or version > IDENTITY_VERSION:
        raise InputError(f"the run identity {where} is of a newer release: update the toolkit")
    legacy = tokenizer_files_digest(tokenizer_dir, canonical_json=False) if version == 1 else 0
    if saved.get("tokenizer") == legacy:
        saved["tokenizer"] = current["tokenizer"]  # the same files, hashed the older way

    def shown(value: Any) -> str:
        text = json.dumps(value) if isinstance(value, dict | list) else str(value)
        return text[:12] if len(text) == 64 else text  # a SHA-256: its first 12 hex digits

    def differences(saved: dict, current: dict, prefix: str = "") -> Iterator[str]:
        for name in sorted(set(saved) | set(current)):
            was, now = saved.get(name), current.get(name)
            if isinstance(was, dict) and isinstance(now, dict):  # e.g. Muon's: each setting
                yield from differences(was, now, f"{prefix}{name}.")
            elif was != now:
                yield f"{prefix}{name}: {shown(now)} now, {shown(was)} {where}"

    return list(differences(saved, current))


def resolve_resume_checkpoint(
    output_dir: str | Path, requested: str | None, is_main: bool
) -> tuple[Path | None, list[dict[str, str]]]:
    """The checkpoint `requested` by --resume_from_checkpoint (None: a new run, in a folder
    holding no earlier one; "auto": the newest complete one, if any; or a path, which must be
    complete), and those `auto` skipped, each with why and where the main process moved it
    (`damaged-checkpoint-<step>/`, which neither resuming nor rotation reads; never deleted)."""
    output_dir = Path(output_dir)
    checkpoints = list_checkpoints(output_dir)
    if requested is None:
        leftovers = [p.name for p in checkpoints] + [
            name for name in (GPT_SUMMARY_FILE, FINAL_MODEL_DIR) if (output_dir / name).exists()
        ]
        if leftovers:
            raise InputError(
                f"output folder {output_dir} already holds a run ({', '.join(leftovers[:3])}); "
                f"pass --resume_from_checkpoint {RESUME_AUTO} to continue it, or a new --output_dir"
            )
        return None, []
    if requested != RESUME_AUTO:
        path = Path(requested)
        damage = checkpoint_damage(path) if path.is_dir() else "it does not exist"
        if damage is not None:
            raise InputError(
                f"checkpoint {path} cannot be resumed from: {damage}; pass a complete "
                f"checkpoint folder or --resume_from_checkpoint {RESUME_AUTO}"
            )
        return path, []
    skipped = []
    for checkpoint in checkpoints:
        damage = checkpoint_damage(checkpoint)
        if damage is None:
            logger.info("resuming from %s", checkpoint)
            return checkpoint, skipped
        aside = checkpoint.with_name(f"damaged-{checkpoint.name}")
        if is_main:
            while aside.exists():
                aside = aside.with_name(aside.name + "-again")
            checkpoint.rename(aside)
        logger.warning("skipping %s: %s; moved to %s", checkpoint.name, damage, aside.name)
        skipped.append({"checkpoint": checkpoint.name, "damage": damage, "moved_to": aside.name})
    logger.info("no complete checkpoint in %s: starting from step 0", output_dir)
    return None, skipped


def check_same_run(
    checkpoint: Path, identity: dict[str, Any], tokenizer_dir: str | Path, is_main: bool
) -> None:
    """Refuse to resume a checkpoint of another run, naming what differs; the main process
    warns when the checkpoint took longer to save than a stop signal leaves."""
    manifest = read_manifest(checkpoint)
    if is_main and manifest.get("save_seconds") is not None:
        warn_if_longer_than_grace(manifest["save_seconds"], checkpoint)
    if differences := identity_differences(manifest["run_identity"], identity, tokenizer_dir):
        raise InputError(
            f"checkpoint {checkpoint} belongs to another run ({'; '.join(differences)}); "
            "resume it with the settings it was saved with, or start a new run in another "
            "--output_dir"
        )


def warn_if_longer_than_grace(save_seconds: float, checkpoint_dir: Path) -> None:
    """A save on a stop signal would be lost: warn when one took longer than the stop grace."""
    grace = stop_grace_seconds()
    if save_seconds > grace:
        logger.warning(
            "%s took %.0f s to save, longer than the %g s launch-pretraining waits after a stop "
            "signal: raise %s (and the job's --signal lead time to match)",
            checkpoint_dir.name, save_seconds, grace, STOP_GRACE_VARIABLE,
        )  # fmt: skip


# `Strategy.name` in words, for messages.
STRATEGY_WORDS = {
    "single": "one process", "ddp": "DDP", "fsdp1": "FSDP1", "fsdp2": "FSDP2",
    "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
}  # fmt: skip


def launched_strategy(training_args: TrainingArguments) -> dict[str, Any]:
    """The strategy (as `Strategy.name`) and the processes this launch will train with, read
    before Trainer sets them up, as a checkpoint's manifest records them (`written_by`)."""
    request = requested_strategy(training_args)
    if request.distributed_type == DistributedType.DEEPSPEED.name:
        name = f"zero{training_args.deepspeed_plugin.zero_stage}"
    elif request.distributed_type == DistributedType.FSDP.name:
        name = f"fsdp{request.fsdp_version}"
    else:
        name = "ddp" if request.distributed_type == DATA_PARALLEL else "single"
    return {"strategy": name, "num_processes": training_args.world_size}


# The strategies whose checkpoints hold whole tensors, convertible into each other's layout
# (`convert_checkpoint`): FSDP2's full state dict names the optimizer's parameters, the others'
# number them. ZeRO's flat partitions convert to no other.
CONVERTIBLE_STRATEGIES = ("single", "ddp", "fsdp2")
FSDP_MODEL_FILE = f"{FSDP_MODEL_NAME}.bin"


def conversion_needed(checkpoint: Path, launched: dict[str, Any], is_main: bool) -> bool:
    """Whether the checkpoint was written by another strategy or number of processes, which
    `convert_checkpoint` converts; refused where it cannot: ZeRO's, or one whose optimizer's
    parameter names are unrecorded (an earlier release). One of a release that did not record
    its strategy is assumed the same."""
    manifest = read_manifest(checkpoint)
    written_by = manifest.get("written_by")
    if written_by is None:
        if is_main:
            logger.warning(
                "%s does not record the strategy that wrote it (an older release): resuming "
                "it as %s", checkpoint.name, strategy_in_words(launched),
            )  # fmt: skip
        return False
    if written_by == launched:
        return False
    source, name = written_by.get("strategy"), launched["strategy"]
    optimizer_file = OPTIMIZER_NAME_BIN if source == "fsdp2" else OPTIMIZER_NAME
    convertible = {source, name} <= set(CONVERTIBLE_STRATEGIES)
    convertible &= (checkpoint / optimizer_file).is_file()  # not FSDP2's sharded state dict
    unnamed = name == "fsdp2" != source and "optimizer_parameters" not in manifest
    if not convertible or unnamed:
        why = "an earlier release recorded no optimizer parameter names" if convertible else (
            "only one process, DDP and FSDP2 (full state dict) convert into each other"
        )  # fmt: skip
        raise InputError(
            f"{checkpoint.name} was written by {strategy_in_words(written_by)}; this run is "
            f"{strategy_in_words(launched)} ({why}): resume it with the accelerate config it was "
            f"written with and --num_processes {written_by.get('num_processes')}, or start a "
            "new run in another --output_dir"
        )
    return True


def convert_checkpoint(
    checkpoint: Path, launched: dict[str, Any], output_dir: Path, is_main: bool
) -> Path:
    """A sealed copy of `checkpoint` (left as it is) in `output_dir`, in the layout the `launched`
    strategy resumes, written by the main process, checked by all: the weights and the optimizer
    state as FSDP2's full state dict or as safetensors and torch's numbered state, and one RNG
    state a process (the same on every process, as Trainer seeds them)."""
    manifest = read_manifest(checkpoint)
    written_by = manifest["written_by"]
    name, processes = launched["strategy"], launched["num_processes"]
    target = output_dir / f"converted-{checkpoint.name}-for-{name}-on-{processes}"
    if is_main:
        shutil.rmtree(target, ignore_errors=True)  # a conversion cut short
        target.mkdir()
        rng_files = sorted(checkpoint.glob("rng_state*.pth"))
        layout_files = {FSDP_MODEL_FILE, OPTIMIZER_NAME, OPTIMIZER_NAME_BIN}
        for path in checkpoint.iterdir():
            if path.name not in layout_files | {CHECKPOINT_MANIFEST_FILE} and path not in rng_files:
                try:  # the unchanged files: linked, not written again, where the disk allows
                    os.link(path, target / path.name)
                except OSError:
                    shutil.copy2(path, target)
        for rank in range(processes):  # rank r's state where it has one, else the first
            rng_name = "rng_state.pth" if processes == 1 else f"rng_state_{rank}.pth"
            source = checkpoint / f"rng_state_{rank}.pth"
            shutil.copy2(source if source in rng_files[1:] else rng_files[0], target / rng_name)
        source_fsdp, target_fsdp = written_by["strategy"] == "fsdp2", name == "fsdp2"
        optimizer = torch.load(
            checkpoint / (OPTIMIZER_NAME_BIN if source_fsdp else OPTIMIZER_NAME), weights_only=True
        )
        if source_fsdp != target_fsdp:
            flat = [key for group in optimizer["param_groups"] for key in group["params"]]
            keys = manifest["optimizer_parameters"] if target_fsdp else range(len(flat))
            rename = dict(zip(flat, keys, strict=True))
            optimizer = {
                "state": {rename[key]: state for key, state in optimizer["state"].items()},
                "param_groups": [
                    {**group, "params": [rename[key] for key in group["params"]]}
                    for group in optimizer["param_groups"]
                ],
            }
        torch.save(optimizer, target / (OPTIMIZER_NAME_BIN if target_fsdp else OPTIMIZER_NAME))
        if target_fsdp:  # every name of the model's state dict, the tied head's included
            model = AutoModelForCausalLM.from_pretrained(checkpoint, use_safetensors=True)
            torch.save(model.state_dict(), target / FSDP_MODEL_FILE)
        del manifest["files"]
        seal_checkpoint(
            target, manifest | {"written_by": launched, "converted_from": checkpoint.name}
        )
        logger.warning(
            "%s was written by %s: resuming its copy converted for %s, %s",
            checkpoint.name, strategy_in_words(written_by), strategy_in_words(launched),
            target.name,
        )  # fmt: skip
    if (damage := checkpoint_damage(target)) is not None:
        raise InputError(f"the converted copy {target} of {checkpoint.name} is damaged: {damage}")
    return target


def strategy_in_words(record: dict[str, Any]) -> str:
    name, processes = record.get("strategy"), record.get("num_processes")
    return f"{STRATEGY_WORDS.get(name, name)} on {processes} process{'es' * (processes != 1)}"


class CheckpointManifestCallback(TrainerCallback):
    """Seal each checkpoint once every process has written its shards: the main process writes
    the manifest with the run's identity, the `strategy` in force (and the optimizer's parameter
    names, in its order) and the save's seconds, also listed in `saves`."""

    strategy: Strategy | None = None  # set once the loop has set it up

    def __init__(self, identity: dict[str, Any]) -> None:
        self.identity = identity
        self.saves: list[dict[str, float]] = []
        self._step_done = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._step_done = time.perf_counter()

    # Trainer logs, then evaluates, then saves: the save starts after both.
    on_log = on_evaluate = on_step_end

    def on_save(self, args, state, control, **kwargs):
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            dist.barrier()
        seconds = time.perf_counter() - self._step_done
        self.saves.append({"step": state.global_step, "seconds": seconds})
        if state.is_world_process_zero:
            checkpoint_dir = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            strategy = self.strategy
            written_by = {"strategy": strategy.name, "num_processes": strategy.num_processes}
            record = {"run_identity": self.identity, "written_by": written_by}
            if strategy.name in CONVERTIBLE_STRATEGIES:  # the names `convert_checkpoint` needs
                names = {id(param): name for name, param in kwargs["model"].named_parameters()}
                groups = kwargs["optimizer"].param_groups
                record["optimizer_parameters"] = [names[id(p)] for g in groups for p in g["params"]]
            seal_checkpoint(checkpoint_dir, record | {"save_seconds": seconds})
            warn_if_longer_than_grace(seconds, checkpoint_dir)
        if distributed:
            # No process stops (a stop signal) before the manifest is written: the launcher
            # would give the main process only a few seconds more to write it.
            dist.barrier()


# --- Faults: a run that diverged, a signal to stop --------------------------------------------


def divergence(readings: dict[str, float | None]) -> str | None:
    """The readings that are NaN or infinite ("loss nan, grad_norm inf"), or None."""
    bad = [
        f"{name} {value}"
        for name, value in readings.items()
        if value is not None and not math.isfinite(value)
    ]
    return ", ".join(bad) or None


class DivergenceCallback(TrainerCallback):
    """Stop a run whose loss or gradient norm became NaN or infinite, saving no checkpoint of
    it; both readings are the same on every process, so all stop at the same step. Under fp16
    loss scaling an infinite gradient is a skipped step, not a divergence."""

    diverged_at_step: int | None = None
    reading: str | None = None

    def on_log(self, args, state: TrainerState, control: TrainerControl, logs=None, **kwargs):
        if not logs or self.diverged_at_step is not None:
            return
        readings = {"loss": logs.get("loss")}
        if not args.fp16:
            readings["grad_norm"] = logs.get("grad_norm")
        if (reading := divergence(readings)) is None:
            return
        self.diverged_at_step, self.reading = state.global_step, reading
        logger.error("training diverged at step %d (%s): stopping", state.global_step, reading)
        control.should_training_stop = True
        control.should_save = False

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # The logs can miss it (NaN steps logged as 0 by --logging_nan_inf_filter, a skipped
        # fp16 step): the weights cannot.
        if self.diverged_at_step is None and not weights_are_finite(model, args.device):
            self.diverged_at_step, self.reading = state.global_step, "weights nan or inf"
            logger.error("the weights are not finite after step %d", state.global_step)


def weights_are_finite(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether every parameter (this process's shard of it) is finite, on all processes."""
    finite = all(torch.isfinite(local_tensor(p)).all() for p in model.parameters())
    flag = torch.tensor([int(finite)], device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
