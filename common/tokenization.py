"""Tokenizer folders and document tokenization, shared by block preparation and the probe.

`load_tokenizer` loads a fast tokenizer with an end-of-text token from a local folder (never
the hub); `tokenize_documents` turns documents into one token stream with an end-of-text after
each document, reading special-token text inside a document as plain text.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from common.cli import InputError


def check_tokenizer_dir(tokenizer_dir: str | Path) -> Path:
    """The tokenizer folder as a path; InputError when there is no such folder."""
    path = Path(tokenizer_dir)
    if not path.is_dir():
        raise InputError(
            f"tokenizer folder {path} does not exist; train one with train-tokenizer "
            "or pass a saved Hugging Face tokenizer folder as --tokenizer_dir"
        )
    return path


def load_tokenizer(tokenizer_dir: str | Path):
    """A fast tokenizer with an eos token from a local folder; never reaches the hub."""
    # transformers takes seconds to import: only the callers that tokenize pay for it.
    from transformers import AutoTokenizer

    path = check_tokenizer_dir(tokenizer_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # noqa: BLE001 (loaders raise many types for a broken folder)
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"tokenizer folder {path} cannot be loaded: {message}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(
            f"tokenizer in {path} is not a fast (tokenizers-backed) tokenizer; "
            "save it with tokenizer.json (e.g. train-tokenizer does)"
        )
    if tokenizer.eos_token_id is None:
        raise InputError(
            f"tokenizer in {path} has no eos token to separate documents; "
            "set eos_token (e.g. <|endoftext|>) and save it again"
        )
    return tokenizer


def tokenize_documents(
    documents: list[str], tokenizer, num_proc: int | None, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of all documents with eos after each (int32), and each document's length
    including its eos."""
    # A copy that reads "<|endoftext|>" written inside a document as plain text: the only
    # document separators in the stream are the ones appended here.
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.encode_special_tokens = True
    dataset = datasets.Dataset.from_dict({"text": documents}).with_format("arrow")
    tokenized = dataset.map(
        tokenize_batch,
        batched=True,
        batch_size=batch_size,
        num_proc=num_proc,
        remove_columns=["text"],
        fn_kwargs={"backend": backend, "eos_token_id": tokenizer.eos_token_id},
        # The fingerprint would otherwise be a hash of the pickled tokenizer; nothing is cached
        # by `datasets` here (the dataset lives in memory), the result is cached by us.
        new_fingerprint=f"tokenize-{len(documents)}-{batch_size}",
        desc="Tokenizing documents",
    )
    column = tokenized.data.column("input_ids")
    token_ids = np.concatenate(
        [chunk.flatten().to_numpy() for chunk in column.chunks if len(chunk)]
    )
    document_lengths = pc.list_value_length(column).to_numpy().astype(np.int64)
    return token_ids, document_lengths


def tokenize_batch(batch: pa.Table, backend, eos_token_id: int) -> pa.Table:
    """One map batch: documents -> list<int32> of their token ids with eos appended."""
    texts = batch.column("text").to_pylist()
    encodings = backend.encode_batch_fast(texts, add_special_tokens=False)
    ids_per_document = [encoding.ids for encoding in encodings]
    lengths = np.fromiter(map(len, ids_per_document), np.int64, len(ids_per_document)) + 1
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    is_eos = np.zeros(offsets[-1], bool)
    is_eos[offsets[1:] - 1] = True
    values = np.empty(offsets[-1], np.int32)
    values[is_eos] = eos_token_id
    values[~is_eos] = np.fromiter(
        itertools.chain.from_iterable(ids_per_document), np.int32, offsets[-1] - len(lengths)
    )
    return pa.table({"input_ids": pa.LargeListArray.from_arrays(offsets, values)})
