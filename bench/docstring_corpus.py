"""Write a corpus of real English prose, offline: the docstrings of installed Python packages.

The GPU benchmark needs ~12M tokens of natural text offline: the demo corpus (~50k tokens)
would repeat ~250 times and be memorised. The docstrings of the packages installed beside
PyTorch are tens of MB of varied technical English, like the abstracts. Each docstring's prose
paragraphs (examples, parameter tables, short lines dropped) become one document per line,
de-duplicated, in a fixed order (sorted files).

    python -m bench.docstring_corpus --output_dir runs/bench/corpus --max_megabytes 60
"""

import logging
import re
import site
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from transformers.hf_argparser import HfArg

from common.cli import InputError, entry_point, parse_args
from common.demo_corpus import HEADING_UNDERLINE, MIN_WORDS_PER_PARAGRAPH
from common.files import atomic_dir

logger = logging.getLogger(__name__)

# A triple-quoted string literal; docstrings are nearly always written this way.
TRIPLE_QUOTED = re.compile(r'[rRuU]?"""(.*?)"""', re.DOTALL)
WORD = re.compile(r"[A-Za-z][a-z]+")
# Share of whitespace-separated items that must be plain words: drops tables, signatures, code.
MIN_WORD_SHARE = 0.7
CORPUS_FILE = "docstrings.txt"


@dataclass
class DocstringCorpusArguments:
    output_dir: str = HfArg(help=f"Folder to (re)create with {CORPUS_FILE}, one document per line.")
    max_megabytes: float = HfArg(
        default=60.0, help="Stop after this many MB of text (12M tokens are about 50 MB)."
    )
    package_roots: list[str] = HfArg(
        default_factory=list,
        help="Folders to scan for .py files (default: this Python's site-packages).",
    )
    num_proc: int = HfArg(default=8, help="Processes reading files in parallel.")


def prose_document(docstring: str) -> str | None:
    """The prose paragraphs of one docstring joined on one line, or None if it has none."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", docstring):
        lines = [line.strip() for line in block.strip().splitlines()]
        # Underlined lines are section headings (numpydoc "Parameters" then a list of them).
        if not lines or any(HEADING_UNDERLINE.match(line) for line in lines):
            continue
        if any(line.startswith((">>>", "...", "$ ", "|", "#")) for line in lines):
            continue  # examples, tables, shell sessions
        words = " ".join(lines).split()
        plain = sum(bool(WORD.fullmatch(word.strip(".,;:()'\""))) for word in words)
        if len(words) >= MIN_WORDS_PER_PARAGRAPH and plain >= MIN_WORD_SHARE * len(words):
            paragraphs.append(" ".join(words))
    return " ".join(paragraphs) or None


def file_documents(path: str) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    documents = (prose_document(match) for match in TRIPLE_QUOTED.findall(text))
    return [document for document in documents if document]


def iter_docstring_documents(roots: list[Path], num_proc: int) -> Iterator[str]:
    """Distinct prose documents from every .py file under `roots`, in sorted file order."""
    files = sorted({str(path) for root in roots for path in root.rglob("*.py")})
    logger.info("reading docstrings of %d files under %s", len(files), ", ".join(map(str, roots)))
    seen: set[str] = set()
    with ProcessPoolExecutor(num_proc) as pool:
        for documents in pool.map(file_documents, files, chunksize=64):
            for document in documents:
                if document not in seen:
                    seen.add(document)
                    yield document


def write_docstring_corpus(args: DocstringCorpusArguments) -> tuple[Path, int, int]:
    """Write the corpus file; return (its path, documents, bytes)."""
    roots = [Path(root) for root in args.package_roots] or [
        Path(path) for path in site.getsitepackages() if Path(path).is_dir()
    ]
    missing = [str(root) for root in roots if not root.is_dir()]
    if missing:
        raise InputError(f"package root(s) {', '.join(missing)} do not exist")
    budget = int(args.max_megabytes * 1e6)
    lines, num_bytes = [], 0
    for document in iter_docstring_documents(roots, args.num_proc):
        lines.append(document)
        num_bytes += len(document.encode("utf-8")) + 1
        if num_bytes >= budget:
            break
    if not lines:
        raise InputError(f"no docstrings found under {', '.join(map(str, roots))}")
    with atomic_dir(args.output_dir, overwrite=True) as tmp_dir:
        (tmp_dir / CORPUS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Path(args.output_dir) / CORPUS_FILE, len(lines), num_bytes


@entry_point
def main(argv: list[str] | None = None) -> int:
    prog = "python -m bench.docstring_corpus"
    (args,) = parse_args([DocstringCorpusArguments], argv, description=__doc__, prog=prog)
    path, num_documents, num_bytes = write_docstring_corpus(args)
    print(f"{num_documents:,} documents, {num_bytes / 1e6:.1f} MB -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
