"""The run folder's guarantees: one run per folder (a lock the kernel drops for a killed
process), a final model written whole, saves that fail in one line.
"""

import errno
import logging
import os
import resource
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch.distributed as dist
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from transformers import TrainingArguments

from common.cli import InputError, RunFailed, exception_chain
from common.files import LOCK_FILE, LockHeld, exclusive_lock, read_manifest, replace_dir
from common.run_contract import FINAL_MODEL_DIR, PEER_STOPPED
from pretrain.checkpoints import RESUME_AUTO, list_checkpoints, seal_checkpoint
from pretrain.stops import StopRequested

logger = logging.getLogger(__name__)


@contextmanager
def hold_run_folder(output_dir: Path, training_args: TrainingArguments) -> Iterator[None]:
    """One run per folder: the main process holds its lock while the block runs, and every
    process stops in one line naming the holder when another run has it. A folder created here
    is removed when the block fails holding only the lock (bad input found late), and when a
    stop comes before the loop (its set-up's files: no checkpoint yet), from its mkdir on."""
    is_main = training_args.process_index == 0
    created = is_main and not output_dir.exists()
    with ExitStack() as stack:
        try:
            refusal = None
            if is_main:
                try:
                    output_dir.mkdir(parents=True, exist_ok=True)
                    stack.enter_context(exclusive_lock(output_dir / LOCK_FILE, wait=False))
                except LockHeld as held:
                    refusal = (
                        f"output folder {output_dir} is in use by another run ({held}); "
                        "wait for it to end, or pass another --output_dir"
                    )
                except OSError as err:
                    refusal = f"cannot write to output folder {output_dir}: {err.strerror}"
            (refusal,) = broadcast_object_list([refusal])
            if refusal is not None:
                raise InputError(refusal)
            yield
        except BaseException as err:
            if created and output_dir.is_dir():
                only_lock = {path.name for path in output_dir.iterdir()} <= {LOCK_FILE}
                if only_lock or isinstance(err, StopRequested):
                    shutil.rmtree(output_dir, ignore_errors=True)
            raise


def unfinished_saves(output_dir: Path) -> set[Path]:
    """What a save cut short leaves: unsealed checkpoints, the final model's staging folder."""
    staging = staging_dir_of(output_dir / FINAL_MODEL_DIR)
    return {path for path in list_checkpoints(output_dir) if read_manifest(path) is None} | (
        {staging} if staging.exists() else set()
    )


def staging_dir_of(final_dir: Path) -> Path:
    return final_dir.with_name(f".{final_dir.name}.tmp")


@contextmanager
def failures_in_one_line(output_dir: Path, weight_bytes: int, is_main: bool) -> Iterator[None]:
    """Turn a failed save (unfinished files left, removed; or a full disk) and a stopped peer
    process into `RunFailed`, one line; bugs pass through. A failure with less free than the
    save takes (`weight_bytes` for final/; a checkpoint adds AdamW's two moments) is a full
    disk, whatever the writer says ("unexpected pos")."""
    earlier = unfinished_saves(output_dir)
    try:
        yield
    except RunFailed:  # already one line
        raise
    except Exception as err:
        chain = exception_chain(err)
        peer_failure = next((e for e in chain if is_peer_failure(e)), None)
        unfinished = unfinished_saves(output_dir) - earlier
        disk_full = any(
            isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain
        )
        if peer_failure is None and not unfinished and not disk_full:
            raise
        if is_main:
            for path in unfinished:
                shutil.rmtree(path, ignore_errors=True)
        names = ", ".join(sorted(path.name for path in unfinished))
        kept = f"; removed the unfinished {names}" if unfinished else ""
        if peer_failure is not None:
            raise RunFailed(
                f"{PEER_STOPPED} ({type(peer_failure).__name__}: "
                f"{' '.join(str(peer_failure).split())[:160]}){kept}; its own error line, or "
                f"the launcher's, says why; continue with --resume_from_checkpoint {RESUME_AUTO}"
            ) from err
        final = staging_dir_of(output_dir / FINAL_MODEL_DIR) in unfinished
        saved, copies = (f"{FINAL_MODEL_DIR}/", 1) if final else ("a checkpoint", 3)
        cause, fix = save_failure_cause(chain, output_dir, saved, copies * weight_bytes)
        raise RunFailed(
            f"cannot save in {output_dir}: {cause}{kept}; {fix} (or pass another "
            f"--output_dir) and continue with --resume_from_checkpoint {RESUME_AUTO}"
        ) from err


# gloo (CPU processes) raises a plain RuntimeError when a peer's connection drops; NCCL a
# torch.distributed.DistError.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


def is_peer_failure(err: BaseException) -> bool:
    """Whether `err` is a collective that failed because another process stopped."""
    return isinstance(err, dist.DistError) or (
        isinstance(err, RuntimeError) and any(text in str(err) for text in PEER_GONE)
    )


def save_failure_cause(
    chain: list[BaseException], output_dir: Path, saved: str, save_bytes: int
) -> tuple[str, str]:
    """What made a save fail, in words, and what to do. torch's writer names no cause ("unexpected
    pos"): a file-size limit or a disk short of the `saved` save's bytes is taken for one."""
    for exception in chain:
        if isinstance(exception, OSError) and exception.errno:
            where = f" ({exception.filename})" if exception.filename else ""
            short = exception.errno in (errno.ENOSPC, errno.EDQUOT)
            return os.strerror(exception.errno).lower() + where, FREE if short else "mend that"
    size = f"{saved} takes about {save_bytes / 2**20:,.1f} MiB"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and limit < save_bytes:
        cause = f"this process may write files of at most {limit / 2**20:,.1f} MiB (ulimit -f)"
        return f"{os.strerror(errno.EFBIG).lower()}: {cause}, {size}", "raise that limit"
    free = shutil.disk_usage(output_dir).free
    if free < save_bytes:
        return f"{os.strerror(errno.ENOSPC).lower()} ({free / 2**20:,.1f} MiB free, {size})", FREE
    return f"{type(chain[0]).__name__}: {' '.join(str(chain[0]).split())[:200]}", "mend that"


FREE = "free space"


def save_final_model(write_model: Callable[[str], None], final_dir: Path, is_main: bool) -> None:
    """What `write_model` writes into a folder (the model in safetensors and its tokenizer) into
    `final_dir`, sealed by a manifest, staged, then renamed: whole or absent, never half there."""
    staging_dir = staging_dir_of(final_dir)
    if is_main and staging_dir.exists():
        shutil.rmtree(staging_dir)
    processes = PartialState()  # the launch's processes, the ones Trainer's accelerator waits on
    processes.wait_for_everyone()
    # Every rank (FSDP gathers the shards here); a failure leaves the staging folder to
    # `failures_in_one_line`, which removes it.
    write_model(str(staging_dir))
    processes.wait_for_everyone()
    if is_main:
        seal_checkpoint(staging_dir, {})
        replace_dir(staging_dir, final_dir)
        logger.info("final model and tokenizer saved in %s", final_dir)
