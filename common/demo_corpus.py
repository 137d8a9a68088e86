"""Write a small real-English corpus in the Web of Science layout, offline and deterministically.

The text is the Python language reference that ships with every Python installation
(`pydoc_data.topics`, the pages `help("for")` shows), split into prose paragraphs, one per
line, so `make demo` and the tests exercise the same reader path as the real
`WebOfScience/WOS46985/X.txt` without a download. Like the real data, the two smaller subsets
are prefixes of the largest one.

    write-demo-corpus --output_dir runs/demo/corpus
"""

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from transformers.hf_argparser import HfArg

from common.cli import InputError, entry_point, parse_args
from common.corpus import WOS_TEXT_FILE
from common.files import atomic_dir

logger = logging.getLogger(__name__)

# Subset name -> share of the documents, in the proportions of the real download
# (46,985 / 11,967 / 5,736 abstracts).
WOS_SUBSET_SHARES = {"WOS46985": 1.0, "WOS11967": 11967 / 46985, "WOS5736": 5736 / 46985}
# Shorter blocks are headings, signatures or code fragments rather than prose.
MIN_WORDS_PER_PARAGRAPH = 8
HEADING_UNDERLINE = re.compile(r"^[*=\-~^\"]{3,}$")


@dataclass
class DemoCorpusArguments:
    output_dir: str = HfArg(
        help="Folder to create with WOS46985/X.txt, WOS11967/X.txt, WOS5736/X.txt."
    )
    max_documents: int | None = HfArg(
        default=None, help="Keep only the first N paragraphs (default: all, about 830)."
    )
    overwrite: bool = HfArg(default=False, help="Replace output_dir if it already exists.")


def demo_documents() -> list[str]:
    """Distinct prose paragraphs of the Python language reference, in a fixed order."""
    from pydoc_data.topics import topics

    # Several pages share paragraphs; dict.fromkeys keeps the first occurrence of each.
    documents = dict.fromkeys(
        paragraph for name in sorted(topics) for paragraph in _prose_paragraphs(topics[name])
    )
    return list(documents)


def _prose_paragraphs(page: str) -> list[str]:
    paragraphs = []
    for block in re.split(r"\n\s*\n", page):
        lines = block.splitlines()
        # Indented blocks are code samples or grammar rules; underlined lines are headings.
        if not lines or lines[0].startswith(" ") or any(HEADING_UNDERLINE.match(x) for x in lines):
            continue
        text = " ".join(line.strip() for line in lines)
        if len(text.split()) >= MIN_WORDS_PER_PARAGRAPH:
            paragraphs.append(text)
    return paragraphs


def write_demo_corpus(
    output_dir: str | Path, max_documents: int | None = None, overwrite: bool = False
) -> Path:
    """Write `<output_dir>/<subset>/X.txt` for the three WoS subsets; return `output_dir`."""
    documents = demo_documents()[:max_documents]
    if not documents:
        raise InputError("max_documents must be at least 1")
    output_dir = Path(output_dir)
    with atomic_dir(output_dir, overwrite=overwrite) as tmp_dir:
        for subset, share in WOS_SUBSET_SHARES.items():
            count = max(1, round(len(documents) * share))
            (tmp_dir / subset).mkdir()
            text = "".join(f"{document}\n" for document in documents[:count])
            (tmp_dir / subset / WOS_TEXT_FILE).write_text(text, encoding="utf-8")
    logger.info("wrote %d demo documents to %s", len(documents), output_dir)
    return output_dir


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args([DemoCorpusArguments], argv, description=__doc__, prog="write-demo-corpus")
    print(write_demo_corpus(args.output_dir, args.max_documents, args.overwrite))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
