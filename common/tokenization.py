"""Tokenizer folders and document tokenization, shared by block preparation and the probe."""

import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from common.cli import InputError, from_here

# Longer documents are tokenized in pieces (`cut_into_pieces`): the tokenizer needs ~100 bytes
# a character of the text it is given at once (a 30 MB document: several GB).
PIECE_CHARS = 1 << 16
# Text per batch encode: enough for every core, a bounded working set (~100 MB).
BATCH_CHARS = 1 << 22


def check_tokenizer_dir(tokenizer_dir: str | Path) -> Path:
    """The tokenizer folder as a path; InputError when there is no such folder."""
    path = Path(tokenizer_dir)
    if not path.is_dir():
        raise InputError(
            f"tokenizer folder {from_here(path)} does not exist; train one with train-tokenizer "
            "or pass a saved Hugging Face tokenizer folder as --tokenizer_dir"
        )
    return path


def load_tokenizer(tokenizer_dir: str | Path):
    """A fast tokenizer with an eos token from a local folder; never reaches the hub."""
    # transformers takes seconds to import: only the callers that tokenize pay for it.
    from transformers import AutoTokenizer

    path = check_tokenizer_dir(tokenizer_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
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


def tokenize_documents(documents: Sequence[str], tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of all documents, eos after each (int32), and each document's length with eos."""
    batches = list(tokenize_stream(documents, tokenizer))
    token_ids = np.concatenate([ids for ids, _ in batches])
    starts = np.cumsum([0] + [len(ids) for ids, _ in batches[:-1]])
    ends = np.concatenate([ends + start for (_, ends), start in zip(batches, starts, strict=True)])
    return token_ids, np.diff(ends, prepend=0)


def tokenize_stream(
    documents: Iterable[str], tokenizer, batch_chars: int = BATCH_CHARS
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Token ids of the documents, eos after each (int32), batch by batch, each with the positions
    in it just past each eos (where its documents end; a document may span batches). A batch is
    about `batch_chars` characters, one batch encode of `tokenizers` (which uses every core)."""
    # A copy that reads "<|endoftext|>" written inside a document as plain text: the only
    # document separators in the stream are the ones appended here.
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.encode_special_tokens = True
    pieces, ends_document, num_chars = [], [], 0
    for document in documents:
        for piece, is_last in cut_into_pieces(document):
            pieces.append(piece)
            ends_document.append(is_last)
            num_chars += len(piece)
            if num_chars >= batch_chars:
                yield encode_pieces(backend, pieces, ends_document, tokenizer.eos_token_id)
                pieces, ends_document, num_chars = [], [], 0
    if pieces:
        yield encode_pieces(backend, pieces, ends_document, tokenizer.eos_token_id)


def cut_into_pieces(document: str) -> Iterator[tuple[str, bool]]:
    """The document in pieces of at most `PIECE_CHARS` characters, each with whether it is the
    last; a cut falls just before the last space within the limit, at the limit when there is
    none (rule 2 of pretrain/blocks/packing.py says what that does to the tokens)."""
    start = 0
    while len(document) - start > PIECE_CHARS:
        cut = document.rfind(" ", start + 1, start + PIECE_CHARS + 1)
        cut = cut if cut > 0 else start + PIECE_CHARS
        yield document[start:cut], False
        start = cut
    yield document[start:], True


def encode_pieces(
    backend: Tokenizer, pieces: list[str], ends_document: list[bool], eos_token_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """A batch's ids, eos after each piece ending a document, and the positions just past them."""
    ids_per_piece = [e.ids for e in backend.encode_batch_fast(pieces, add_special_tokens=False)]
    for ids, is_last in zip(ids_per_piece, ends_document, strict=True):
        if is_last:
            ids.append(eos_token_id)  # each encoding's ids are a list of its own
    ends = np.cumsum(np.fromiter(map(len, ids_per_piece), np.int64, len(ids_per_piece)))
    values = np.fromiter(itertools.chain.from_iterable(ids_per_piece), np.int32, int(ends[-1]))
    return values, ends[np.array(ends_document)]
