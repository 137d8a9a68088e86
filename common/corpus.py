"""Read a text corpus the way users have it: one document at a time, cleaned and de-duplicated.

Accepted inputs (any mix, in the order given):
- the Web of Science download `WebOfScience.zip` (`WOS46985/X.txt`, ... at the zip root) and
  Mendeley's "download all" zip that wraps it (read from memory, nothing is extracted);
- an extracted Web of Science folder at any depth (`data/WebOfScience/WOS46985/X.txt` or
  `data/WOS46985/X.txt`); `subset` picks which `WOS*` folder is read;
- plain text files (one document per line), `.jsonl` files (one JSON object per line, the text
  in `text_field`), and glob patterns of either.

Documents are whitespace-stripped; empty lines are skipped and exact duplicates dropped (the
two smaller WoS subsets are contained in WOS46985, so reading several would count documents
twice). A UTF-8 byte-order mark and CRLF line ends are accepted. Invalid UTF-8 is an error
naming the file and line unless `replace_invalid_utf8` is set.

`TextSource.locate` finds a file beside a text (in the same zip or folder): the probe reads the
Web of Science labels that way (probe/labels.py).
"""

import errno
import glob
import hashlib
import io
import itertools
import json
import logging
import os
import posixpath
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import IO

import numpy as np
from transformers.hf_argparser import HfArg

from common.cli import InputError, from_here

logger = logging.getLogger(__name__)

WOS_TEXT_FILE = "X.txt"
# Bump when the reader's output for the same input changes, so fingerprint-keyed caches expire.
READER_VERSION = 1
# How a zip file starts (a local file header, or the end record of an empty archive).
ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")
WOS_ZIP_BYTES = 60_222_421


@dataclass
class CorpusArguments:
    """Where the training text comes from and how to read it."""

    corpus: list[str] = HfArg(
        help="Input paths: WebOfScience.zip (or the 'download all' zip wrapping it), an "
        "extracted WoS folder at any depth, plain .txt files (one document per line), .jsonl "
        "files, or glob patterns of these (quote them). Several may be given."
    )
    subset: str = HfArg(
        default="WOS46985",
        help="Which Web of Science folder to read from a WoS zip or folder: WOS46985 (all "
        "abstracts), WOS11967 or WOS5736 (subsets of WOS46985).",
    )
    text_field: str = HfArg(
        default="text", help="Field holding the document text in .jsonl records."
    )
    replace_invalid_utf8: bool = HfArg(
        default=False,
        help="Replace bytes that are not valid UTF-8 with U+FFFD instead of stopping with "
        "an error naming the file and line.",
    )


@dataclass
class CorpusStats:
    """Counts filled in while `iter_documents` runs."""

    num_documents: int = 0
    num_duplicates: int = 0
    num_empty_lines: int = 0
    num_bytes: int = 0  # UTF-8 bytes of the documents yielded (after stripping)
    num_nul_bytes: int = 0  # NUL characters in the documents yielded: binary data read as text?
    sources: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TextSource:
    """One file to read: a label for messages, a way to open its raw bytes, and a way to find
    a file beside it (a path relative to its folder; None when there is no such file)."""

    label: str
    is_jsonl: bool
    open_binary: Callable[[], AbstractContextManager[IO[bytes]]]
    locate: Callable[[str], "TextSource | None"]
    num_bytes: int  # as stored, uncompressed: an upper bound of the text's
    in_zip: bool = False  # zip data is checked (CRC) only once read to its end


class DocumentCleaner:
    """Strips texts and turns empty lines and repeated texts into None, counting both."""

    def __init__(self, stats: CorpusStats) -> None:
        self.stats = stats
        # 16-byte digests instead of the texts keep memory small on large corpora; collisions
        # at 128 bits are not a practical concern.
        self.seen: set[bytes] = set()

    def clean(self, text: str) -> str | None:
        text = text.strip()
        if not text:
            self.stats.num_empty_lines += 1
            return None
        encoded = text.encode("utf-8")
        key = hashlib.blake2b(encoded, digest_size=16).digest()
        if key in self.seen:
            self.stats.num_duplicates += 1
            return None
        self.seen.add(key)
        self.stats.num_documents += 1
        self.stats.num_bytes += len(encoded)
        self.stats.num_nul_bytes += text.count("\0")
        return text


def iter_documents(
    args: CorpusArguments, stats: CorpusStats | None = None, log: bool = True
) -> Iterator[str]:
    """Stripped, non-empty, exact-duplicate-free documents, in a deterministic order.

    The inputs are resolved before this returns, so a missing path or a zip without text fails
    at the call; decoding errors and an empty corpus fail while iterating. Raises InputError.
    `log=False` leaves out the lines saying what is read and how much (a second pass).
    """
    sources = resolve_sources(args)
    stats = stats if stats is not None else CorpusStats()
    stats.sources = [source.label for source in sources]

    def generate() -> Iterator[str]:
        cleaner = DocumentCleaner(stats)
        for source in sources:
            if log:
                logger.info("reading %s", source.label)
            for text in iter_source_texts(source, args):
                text = cleaner.clean(text)
                if text is not None:
                    yield text
        check_and_log_counts(stats, log)

    return generate()


def document_hash(text: str, key: str) -> int:
    """A document's identity in a split, the 64-bit BLAKE2b of its UTF-8 bytes keyed by `key`
    (unsigned): it depends on the text and the key alone, not on where the document sits in the
    corpus, so a split is redone or matched from the texts."""
    digest = hashlib.blake2b(text.encode(), digest_size=8, key=key.encode()).digest()
    return int.from_bytes(digest, "big")


def document_hashes(texts: Sequence[str], key: str) -> np.ndarray:
    """`document_hash` of each text (uint64)."""
    return np.fromiter((document_hash(text, key) for text in texts), np.uint64, len(texts))


def corpus_fingerprint(args: CorpusArguments) -> str:
    """Hex digest over the resolved input files' bytes and the reading options (for cache keys)."""
    digest = hashlib.sha256()
    options = {
        "reader_version": READER_VERSION,
        "subset": args.subset,
        "text_field": args.text_field,
        "replace_invalid_utf8": args.replace_invalid_utf8,
    }
    digest.update(json.dumps(options, sort_keys=True).encode())
    for source in resolve_sources(args):
        digest.update(source.label.encode() + b"\0")
        with _damaged_zip_data_as_input_error(source.label), source.open_binary() as handle:
            for chunk in iter(lambda handle=handle: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def corpus_bytes(args: CorpusArguments) -> int:
    """The input files' bytes, uncompressed, before reading them: at least the documents'."""
    return sum(source.num_bytes for source in resolve_sources(args))


def check_and_log_counts(stats: CorpusStats, log: bool = True) -> None:
    if stats.num_documents == 0:
        raise InputError(
            f"the corpus {', '.join(stats.sources)} holds no non-empty documents; "
            "pass files with one document per line"
        )
    if log:
        logger.info(
            "read %d documents (%.1f MB), dropped %d exact duplicates and %d empty lines",
            stats.num_documents,
            stats.num_bytes / 1e6,
            stats.num_duplicates,
            stats.num_empty_lines,
        )
        if stats.num_nul_bytes:
            logger.warning(
                "the documents hold %d NUL bytes (binary data read as text?); kept as text",
                stats.num_nul_bytes,
            )


def iter_source_texts(source: TextSource, args: CorpusArguments) -> Iterator[str]:
    errors = "replace" if args.replace_invalid_utf8 else "strict"
    with _damaged_zip_data_as_input_error(source.label), source.open_binary() as handle:
        # Binary iteration splits on b"\n" only (str.splitlines would also split on form feeds
        # and U+2028 inside a document); a trailing b"\r" goes with the whitespace strip.
        for line_number, raw_line in enumerate(handle, start=1):
            try:
                line = raw_line.decode("utf-8", errors=errors)
            except UnicodeDecodeError as err:
                # Damaged zip data reads as bad text: the CRC check at the end says so.
                while source.in_zip and handle.read(1 << 20):
                    pass
                raise InputError(
                    f"{source.label} line {line_number}: invalid UTF-8 at byte {err.start} of "
                    "the line; fix the file or pass --replace_invalid_utf8 to replace bad bytes"
                ) from None
            if line_number == 1:
                line = line.removeprefix("\ufeff")
            if source.is_jsonl:
                line = _jsonl_text(line, source.label, line_number, args.text_field)
            yield line


def _jsonl_text(line: str, label: str, line_number: int, text_field: str) -> str:
    if not line.strip():
        return ""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise InputError(f"{label} line {line_number}: not valid JSON ({err.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        raise InputError(
            f"{label} line {line_number}: no string field '{text_field}'; "
            "pass --text_field with the name of the field that holds the text"
        )
    return record[text_field]


def resolve_sources(args: CorpusArguments) -> list[TextSource]:
    """Expand globs, folders and zips into the list of files to read, in a fixed order."""
    # A config file (or a caller) may give one path as a plain string.
    entries = [args.corpus] if isinstance(args.corpus, str) else list(args.corpus)
    if not entries:
        raise InputError("no corpus given; pass --corpus PATH [PATH ...]")
    sources: list[TextSource] = []
    for entry in entries:
        if glob.has_magic(entry):
            matches = glob.glob(entry, recursive=True)
            if not matches:
                raise InputError(f"corpus pattern {entry} matches no files")
            # `**` through a link to a parent folder matches a file again at every depth: each
            # file is read once, under its shallowest match.
            deepest_first = sorted(matches, key=lambda match: (match.count(os.sep), match))[::-1]
            shallowest = {os.path.realpath(match): match for match in deepest_first}
            paths = [Path(match) for match in sorted(shallowest.values())]
        else:
            paths = [Path(entry)]
        for path in paths:
            sources.extend(_sources_for_path(path, args))
    return sources


MISSING = (
    "does not exist; pass --corpus PATH (Web of Science: WebOfScience.zip from Mendeley Data, "
    "https://data.mendeley.com/datasets/9rw3vkcfy4/6, into data/)"
)


def _sources_for_path(path: Path, args: CorpusArguments) -> list[TextSource]:
    try:
        path.stat()
    except OSError as err:
        problem = {errno.ELOOP: "is a symlink loop", errno.ENOENT: MISSING}.get(
            err.errno, f"cannot be read ({err.strerror})"
        )
        raise InputError(f"corpus path {from_here(path)} {problem}") from None
    if path.is_dir():
        return _sources_for_path(_find_wos_text_in_folder(path, args.subset), args)
    if not path.is_file():  # a FIFO or a device: reading it could block forever
        raise InputError(f"corpus path {path} is not a regular file; pass a file, folder or zip")
    if zipfile.is_zipfile(path):
        return [_zip_source(path, args.subset)]
    with path.open("rb") as handle:
        start = handle.read(4)
    # Named or shaped like a zip: never to be read as text, even when damaged.
    if path.suffix.lower() == ".zip" or start in ZIP_SIGNATURES:
        raise InputError(
            f"{path} is a damaged zip archive ({path.stat().st_size:,} bytes, its table of "
            "contents missing or unreadable: a download cut short?); download it again (the "
            f"Web of Science WebOfScience.zip is {WOS_ZIP_BYTES:,} bytes)"
        )
    return [file_source(path)]


@contextmanager
def _damaged_zip_data_as_input_error(label: str) -> Iterator[None]:
    """A zip whose table of contents reads but whose data does not (a bad checksum, a cut
    compressed stream) is bad input, named, not a traceback."""
    try:
        yield
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise InputError(
            f"{label}: damaged zip data ({type(err).__name__}: {err}); download it again"
        ) from None


def file_source(path: Path) -> TextSource:
    def locate(relative: str) -> TextSource | None:
        beside = Path(os.path.normpath(path.parent / relative))
        return file_source(beside) if beside.is_file() else None

    return TextSource(
        label=str(path),
        is_jsonl=path.suffix == ".jsonl",
        open_binary=lambda: path.open("rb"),
        locate=locate,
        num_bytes=path.stat().st_size,
    )


def _find_wos_text_in_folder(folder: Path, subset: str) -> Path:
    candidates = sorted(folder.rglob(WOS_TEXT_FILE))
    if candidates:
        return _choose_subset(candidates, subset, f"folder {folder}")
    zips = sorted(str(path) for path in folder.rglob("*.zip"))
    hint = f"pass the zip itself ({zips[0]})" if zips else "pass text files or a glob instead"
    raise InputError(
        f"folder {folder} holds no {WOS_TEXT_FILE} (expected the Web of Science layout "
        f"WOS46985/{WOS_TEXT_FILE}); {hint}"
    )


def _choose_subset(candidates: list[PurePath], subset: str, where: str) -> PurePath:
    """The one `<subset>/X.txt` of the X.txt files found in `where` (a folder or a zip)."""
    chosen = [path for path in candidates if path.parent.name == subset]
    if len(chosen) > 1:
        listing = ", ".join(map(str, chosen))
        raise InputError(
            f"{where} holds several {subset}/{WOS_TEXT_FILE} ({listing}); pass the one to read"
        )
    if not chosen:
        available = sorted({path.parent.name for path in candidates} - {""})
        raise InputError(
            f"{where} has no subset {subset}; available: {', '.join(available)} "
            "(choose one with --subset)"
        )
    return chosen[0]


def _zip_source(path: Path, subset: str) -> TextSource:
    """The subset's X.txt in a WoS zip, looking one zip level deeper for the wrapped download,
    read into memory (a zip needs random access to its central directory; the real one is 60 MB)."""
    with _damaged_zip_data_as_input_error(str(path)):
        outer = zipfile.ZipFile(path)
        inner_archives = (
            (zipfile.ZipFile(io.BytesIO(outer.read(name))), f"{path}!{name}")
            for name in sorted(outer.namelist())
            if name.lower().endswith(".zip") and not name.startswith("__MACOSX/")
        )
        for archive, label in itertools.chain([(outer, str(path))], inner_archives):
            member = _find_wos_member(archive, subset, label)
            if member is not None:
                return _zip_member_source(zipfile.Path(archive, member), label)
    raise InputError(
        f"zip {path} holds no {WOS_TEXT_FILE} (expected WebOfScience.zip with "
        f"WOS46985/{WOS_TEXT_FILE}, or the download that wraps it)"
    )


def _find_wos_member(archive: zipfile.ZipFile, subset: str, label: str) -> str | None:
    """Name of `<subset>/X.txt` in the archive (at any depth), None if it has no X.txt at all."""
    candidates = sorted(
        PurePosixPath(name)
        for name in archive.namelist()
        if name.rsplit("/", 1)[-1] == WOS_TEXT_FILE and not name.startswith("__MACOSX/")
    )
    return str(_choose_subset(candidates, subset, f"zip {label}")) if candidates else None


def _zip_member_source(member: zipfile.Path, archive_label: str) -> TextSource:
    def locate(relative: str) -> TextSource | None:
        at = posixpath.normpath(posixpath.join(posixpath.dirname(member.at), relative))
        beside = zipfile.Path(member.root, at)
        return _zip_member_source(beside, archive_label) if beside.is_file() else None

    return TextSource(
        label=f"{archive_label}!{member.at}",
        is_jsonl=False,
        open_binary=lambda: member.open("rb"),
        locate=locate,
        num_bytes=member.root.getinfo(member.at).file_size,
        in_zip=True,
    )
