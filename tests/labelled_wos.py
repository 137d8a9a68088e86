"""Helpers for the label tests: a Web of Science layout with label files and Data.xlsx.

`write_labelled_wos` writes `<root>/<subset>/{X,Y,YL1,YL2}.txt` and `<root>/Meta-data/Data.xlsx`
as the download has them: YL2 numbers the areas within their domain, Y numbers all areas, and
the names in Data.xlsx carry padding spaces. `python_reference_documents` labels real English
paragraphs (the Python language reference, as in the demo corpus) by the topic of their page;
`package_docstring_documents` labels the docstrings of installed packages by the field the
package serves (a corpus for the probe's method: real prose, topical classes that share
words, not separable by a keyword). `zip_folder` zips a layout as the download is zipped;
`write_bytes` writes one raw file.

    python tests/labelled_wos.py --output_dir runs/probe_corpus --documents_per_area 400
"""

from __future__ import annotations

import hashlib
import importlib.util
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from common.cli import entry_point, parse_args
from common.corpus import WOS_TEXT_FILE
from probe.labels import (
    WOS_AREA_IN_DOMAIN_FILE,
    WOS_DOMAIN_FILE,
    WOS_LABEL_FILE,
    WOS_METADATA_COLUMNS,
)

# (domain, area) -> the pages of the Python language reference whose paragraphs it holds.
PYTHON_REFERENCE_AREAS = {
    ("Expressions", "arithmetic"): (
        "binary", "power", "unary", "shifting", "bitwise", "numeric-types", "integers",
        "floating", "imaginary", "numbers",
    ),
    ("Expressions", "comparisons"): ("comparisons", "booleans", "truth"),
    ("Program structure", "modules"): ("import", "execmodel"),
    ("Program structure", "exceptions"): ("exceptions", "raise", "assert"),
    ("Text", "format strings"): ("formatstrings",),
    ("Text", "strings"): ("strings", "string-methods"),
}  # fmt: skip


def python_reference_documents() -> list[tuple[str, str, str]]:
    """(paragraph, domain, area) for the pages of PYTHON_REFERENCE_AREAS, paragraphs cut as the
    demo corpus cuts them, each paragraph once, in page order."""
    from pydoc_data.topics import topics

    from common.demo_corpus import _prose_paragraphs

    documents: dict[str, tuple[str, str]] = {}
    for (domain, area), pages in PYTHON_REFERENCE_AREAS.items():
        for page in pages:
            for paragraph in _prose_paragraphs(topics[page]):
                documents.setdefault(paragraph, (domain, area))
    return [(text, domain, area) for text, (domain, area) in documents.items()]


# (domain, area) -> the packages whose docstrings it holds: fields that share much vocabulary
# (arrays, parameters, returns), so a class is a topic, not a keyword.
PACKAGE_DOCSTRING_AREAS = {
    ("Mathematics", "symbolic algebra"): ("sympy.polys", "sympy.solvers"),
    ("Mathematics", "graph theory"): ("networkx.algorithms",),
    ("Scientific computing", "statistics"): ("scipy.stats",),
    ("Scientific computing", "signal processing"): ("scipy.signal",),
    ("Machine learning", "neural networks"): ("torch.nn", "torch.optim"),
    ("Machine learning", "estimators"): (
        "sklearn.linear_model", "sklearn.ensemble", "sklearn.cluster", "sklearn.decomposition",
        "sklearn.neighbors", "sklearn.svm", "sklearn.tree",
    ),
    ("Web", "servers"): ("werkzeug", "tornado"),
    ("Web", "clients"): ("aiohttp", "httpx2", "httpcore2", "h11"),
}  # fmt: skip
# Abstract-like prose: a docstring of fewer words is a one-line summary.
MIN_WORDS_PER_DOCSTRING = 20


def package_docstring_documents(documents_per_area: int) -> list[tuple[str, str, str]]:
    """(docstring, domain, area) for PACKAGE_DOCSTRING_AREAS: each docstring's prose as the
    benchmark corpus cuts it, once, of at least MIN_WORDS_PER_DOCSTRING words, the first
    `documents_per_area` of each area in the order of a hash of their text (the same whatever
    order the files are read in)."""
    from bench.docstring_corpus import file_documents

    seen: set[str] = set()
    documents = []
    for (domain, area), packages in PACKAGE_DOCSTRING_AREAS.items():
        texts = []
        for package in packages:
            root = Path(importlib.util.find_spec(package).submodule_search_locations[0])
            for path in sorted(root.rglob("*.py")):
                if "tests" in path.relative_to(root).parts:
                    continue  # docstrings of test cases are about testing, not the field
                for text in file_documents(str(path)):
                    if text not in seen and len(text.split()) >= MIN_WORDS_PER_DOCSTRING:
                        seen.add(text)
                        texts.append(text)
        texts.sort(key=lambda text: hashlib.blake2b(text.encode()).digest())
        documents += [(text, domain, area) for text in texts[:documents_per_area]]
    return documents


def write_labelled_wos(
    root: Path, documents: list[tuple[str, str, str]], subset: str = "WOS46985"
) -> Path:
    """The WoS layout under `root` for (text, domain, area) triples; returns `root`."""
    domains = sorted({domain for _, domain, _ in documents})
    pairs = sorted({(domain, area) for _, domain, area in documents})
    areas_of = {domain: sorted(a for d, a in pairs if d == domain) for domain in domains}
    rows = []
    for text, domain, area in documents:
        domain_id = domains.index(domain)
        rows.append(
            (
                domain_id,
                areas_of[domain].index(area),
                pairs.index((domain, area)),
                text,
                domain,
                area,
            )
        )
    folder = root / subset
    folder.mkdir(parents=True, exist_ok=True)
    columns = {WOS_TEXT_FILE: 3, WOS_DOMAIN_FILE: 0, WOS_AREA_IN_DOMAIN_FILE: 1, WOS_LABEL_FILE: 2}
    for name, column in columns.items():
        lines = "".join(f"{row[column]}\n" for row in rows)
        (folder / name).write_text(lines, encoding="utf-8")
    write_data_xlsx(
        root / "Meta-data" / "Data.xlsx",
        [
            (y1, y2, y, f"{domain}  ", f"  {area} ", "keywords", text)
            for y1, y2, y, text, domain, area in rows
        ],
    )
    return root


def write_data_xlsx(
    path: Path, rows: list[tuple], header=(*WOS_METADATA_COLUMNS, "keywords", "Abstract")
):
    """A Data.xlsx with the download's columns (Y1 Y2 Y Domain area keywords Abstract)."""
    import openpyxl

    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.append(list(header))
    for row in rows:
        sheet.append(list(row))
    path.parent.mkdir(parents=True, exist_ok=True)
    workbook.save(path)
    return path


def zip_folder(folder: Path, zip_path: Path, prefix: str = "") -> Path:
    """Zip like the real download: WOS*/X.txt (and other files) at the root, optional prefix;
    a placeholder Meta-data/Data.xlsx when the folder has none."""
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, prefix + path.relative_to(folder).as_posix())
        if not (folder / "Meta-data" / "Data.xlsx").is_file():
            archive.writestr(prefix + "Meta-data/Data.xlsx", b"not a real spreadsheet")
    return zip_path


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@dataclass
class DocstringCorpusArguments:
    output_dir: str = field(metadata={"help": "Folder to write the WoS layout into."})
    documents_per_area: int = field(
        default=150, metadata={"help": "Docstrings per area (fewer where an area has fewer)."}
    )


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args(
        [DocstringCorpusArguments], argv, description=__doc__, prog="python tests/labelled_wos.py"
    )
    documents = package_docstring_documents(args.documents_per_area)
    print(f"{len(documents)} documents -> {write_labelled_wos(Path(args.output_dir), documents)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
