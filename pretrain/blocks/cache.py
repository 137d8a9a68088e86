"""The packed-block cache (made by `prepare-blocks`): tokenize the corpus once and keep its
blocks as Arrow, reused while its inputs are the same and its files whole.

The cache folder's name is a hash of the corpus fingerprint, the tokenizer files' content, the
block size, the split and budget settings and `PIPELINE_VERSION`; it is written under a
temporary name and renamed when complete, so an interrupted build is never reused. Its
`stats.json` (pretrain/blocks/packing.py), written last, records the size and checksum of every
other file: each reuse checks them, and a damaged cache is built again. One process builds a
given cache at a time (a lock beside it); the others wait and reuse it.
"""

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets

from common.cli import InputError, RunFailed
from common.corpus import CorpusArguments, corpus_fingerprint
from common.files import atomic_dir, exclusive_lock, sealed_folder_damage
from common.run_contract import DOCUMENT_SPLIT_FILE
from common.tokenization import check_tokenizer_dir, load_tokenizer
from pretrain.blocks.args import DataArguments
from pretrain.blocks.packing import BLOCKS_FILE, PIPELINE_VERSION, SPLITS, STATS_FILE, build_blocks

logger = logging.getLogger(__name__)

CACHE_FOLDER_PREFIX = "blocks"
# What a run reads of stats.json besides its files (pretrain/checkpoints.run_identity).
STATS_KEY_TYPES = {"corpus_fingerprint": str, "tokenizer_files_sha256": str, "settings": dict}
# The files that define a tokenizer (whichever of them a folder has); model weights saved in the
# same folder do not change the token ids and are not hashed.
TOKENIZER_FILE_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
                        "tokenizer.model", "spiece.model")  # fmt: skip


def prepare_blocks(corpus_args: CorpusArguments, data_args: DataArguments, tokenizer=None) -> Path:
    """Build (or reuse) the Arrow cache of packed blocks; return its folder. `tokenizer`: the
    caller's, loaded from `data_args.tokenizer_dir`; else it is loaded only to build (a cache
    hit needs only the tokenizer files' bytes). The checks that need no tokenization run first."""
    check_tokenizer_dir(data_args.tokenizer_dir)
    cache_root = Path(data_args.cache_dir)
    try:  # fail now, not after tokenizing, when the cache cannot be written
        cache_root.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=cache_root).close()
    except OSError as err:
        raise InputError(
            f"cache folder {cache_root} is not writable ({err.strerror}); "
            "pass --cache_dir with a folder you can write to"
        ) from None
    fingerprint = corpus_fingerprint(corpus_args)
    tokenizer_digest = tokenizer_files_digest(data_args.tokenizer_dir)
    key = cache_key(fingerprint, tokenizer_digest, data_args)
    folder = cache_root / f"{CACHE_FOLDER_PREFIX}-{data_args.block_size}-{key}"
    lock = cache_root / f".{folder.name}.lock"
    with full_disk_as_run_failed(cache_root), exclusive_lock(lock, wait=True):
        if (folder / STATS_FILE).is_file():
            damage = sealed_folder_damage(folder, STATS_FILE, STATS_KEY_TYPES)
            if damage is None:
                logger.info("reusing packed blocks in %s", folder)
                return folder
            logger.warning(
                "packed blocks in %s are damaged (%s): building them again", folder, damage
            )
            shutil.rmtree(folder)
        elif folder.exists():
            raise InputError(
                f"cache folder {folder} exists but has no {STATS_FILE} (not written by this "
                "program); delete it and run again"
            )
        unfinished = sorted(cache_root.glob(f".{CACHE_FOLDER_PREFIX}-*.tmp-*"))
        if unfinished:
            logger.warning(
                "ignoring %d unfinished cache folder(s) (%s): left by interrupted builds, or "
                "being written by a build still running; delete them once none runs",
                len(unfinished),
                ", ".join(path.name for path in unfinished),
            )
        if tokenizer is None:
            tokenizer = load_tokenizer(data_args.tokenizer_dir)
        context = {
            "cache_key": key,
            "corpus_fingerprint": fingerprint,
            "tokenizer_files_sha256": tokenizer_digest,
        }
        # Imported here: a cache hit stays free of torch, which the stops' Trainer callback needs.
        from pretrain.stops import STOP_SIGNALS, signals_handled, stop_on_termination

        with atomic_dir(folder) as tmp_dir, signals_handled(STOP_SIGNALS, stop_on_termination):
            build_blocks(tmp_dir, corpus_args, data_args, tokenizer, context)
        logger.info("packed blocks saved in %s", folder)
    return folder


@contextlib.contextmanager
def full_disk_as_run_failed(cache_root: Path) -> Iterator[None]:
    """A disk (or quota, or file size limit) that fills up while the cache is written is one
    line naming the folder and its free space, once the unfinished build is removed."""
    try:
        yield
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        free = shutil.disk_usage(cache_root).free
        raise RunFailed(
            f"cannot write packed blocks in {cache_root}: {os.strerror(err.errno).lower()} "
            f"({free / 2**20:,.1f} MiB free there, nothing kept); free space or pass "
            "--cache_dir on a larger disk"
        ) from None


def load_blocks(cache_dir: str | Path) -> datasets.DatasetDict:
    """The splits "train" and "validation": one column "input_ids" (int32 on disk, length
    block_size), in torch format (batches come out as int64 tensors)."""
    cache_dir = Path(cache_dir)
    if not (cache_dir / STATS_FILE).is_file():
        raise InputError(
            f"{cache_dir} is not a packed-block cache (no {STATS_FILE}); "
            "make one with `prepare-blocks`"
        )
    splits = {split: str(cache_dir / BLOCKS_FILE.format(split)) for split in SPLITS}
    blocks = {split: datasets.Dataset.from_file(path) for split, path in splits.items()}
    return datasets.DatasetDict(blocks).with_format("torch")


def copy_document_split(cache_dir: str | Path, run_dir: str | Path) -> None:
    """Put the cache's record of which documents each split holds into a run folder."""
    shutil.copyfile(Path(cache_dir) / DOCUMENT_SPLIT_FILE, Path(run_dir) / DOCUMENT_SPLIT_FILE)


def read_stats(cache_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(cache_dir) / STATS_FILE).read_text(encoding="utf-8"))


def tokenizer_files_digest(tokenizer_dir: str | Path, canonical_json: bool = True) -> str:
    """SHA-256 over the names and contents of the folder's tokenizer files, a JSON file's as its
    value serialised canonically (a re-indented `tokenizer.json` is the same tokenizer); without
    `canonical_json` its bytes, as older releases hashed them."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILE_NAMES:
        path = Path(tokenizer_dir) / name
        if not path.is_file():
            continue
        content = path.read_bytes()
        # A broken JSON file counts by its bytes: loading the tokenizer then says what is wrong.
        with contextlib.suppress(ValueError):
            if canonical_json and path.suffix == ".json":
                content = json.dumps(json.loads(content), sort_keys=True).encode()
        digest.update(name.encode() + b"\0" + content)
    return digest.hexdigest()


def cache_key(corpus_digest: str, tokenizer_digest: str, args: DataArguments) -> str:
    """Short hash of everything the blocks depend on: every setting but the two folders."""
    settings = {"corpus": corpus_digest, "tokenizer": tokenizer_digest, **dataclasses.asdict(args)}
    del settings["tokenizer_dir"], settings["cache_dir"]
    settings["pipeline_version"] = PIPELINE_VERSION
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
