"""Helpers for the label tests: a Web of Science layout with label files and Data.xlsx.

`write_labelled_wos` writes `<root>/<subset>/{X,Y,YL1,YL2}.txt` and `<root>/Meta-data/Data.xlsx`
as the download has them: YL2 numbers the areas within their domain, Y numbers all areas, and
the names in Data.xlsx carry padding spaces. `python_reference_documents` labels real English
paragraphs (the Python language reference, as in the demo corpus) by the topic of their page.
`zip_folder` zips a layout as the download is zipped; `write_bytes` writes one raw file.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

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
