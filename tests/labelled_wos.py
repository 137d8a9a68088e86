"""Helpers for the label tests: a Web of Science layout with label files and Data.xlsx.

`write_labelled_wos` writes `<root>/<subset>/{X,Y,YL1,YL2}.txt` and `<root>/Meta-data/Data.xlsx`
as the download has them: YL2 numbers the areas within their domain, Y numbers all areas, and
the names in Data.xlsx carry padding spaces. `python_reference_documents` labels real English
paragraphs (the Python language reference, as in the demo corpus) by the topic of their page;
`package_docstring_documents` labels the docstrings of modules of the pinned packages by the
field they serve (a corpus for the probe's method: real prose, topical classes that share
words, not separable by a keyword; the same documents wherever the pinned versions are
installed). `zip_folder` zips a layout as the download is zipped;
`write_bytes` writes one raw file.

    python tests/labelled_wos.py --output_dir runs/probe_corpus --documents_per_area 400
"""

import hashlib
import importlib.metadata
import importlib.util
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

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


# (domain, area) -> the modules whose docstrings it holds: fields that share much vocabulary
# (arrays, parameters, returns), so a class is a topic, not a keyword. Every module belongs to a
# package that requirements.txt pins, so every machine gets the same documents.
PACKAGE_DOCSTRING_AREAS = {
    ("Machine learning", "neural networks"): ("torch.nn", "torch.optim"),
    ("Machine learning", "estimators"): (
        "sklearn.linear_model", "sklearn.ensemble", "sklearn.cluster", "sklearn.decomposition",
        "sklearn.neighbors", "sklearn.svm", "sklearn.tree",
    ),
    ("Numerical computing", "arrays"): ("numpy._core", "numpy.ma"),
    ("Numerical computing", "linear algebra and transforms"): (
        "numpy.linalg", "numpy.polynomial", "numpy.fft", "torch.linalg", "torch.fft",
    ),
    ("Plotting", "figures and axes"): (
        "matplotlib.axes", "matplotlib.figure", "matplotlib.pyplot", "mpl_toolkits.mplot3d",
        "mpl_toolkits.axes_grid1", "mpl_toolkits.axisartist",
    ),
    ("Plotting", "artists"): (
        "matplotlib.colors", "matplotlib.patches", "matplotlib.transforms", "matplotlib.ticker",
        "matplotlib.text", "matplotlib.lines", "matplotlib.collections", "matplotlib.colorbar",
        "matplotlib.legend", "matplotlib.image",
    ),
    ("Distributed training", "sharding"): (
        "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint",
    ),
    ("Distributed training", "launching"): ("accelerate",),
}  # fmt: skip
# Abstract-like prose: a docstring of fewer words is a one-line summary.
MIN_WORDS_PER_DOCSTRING = 20
REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"


def check_pinned_versions(modules: list[str]) -> None:
    """Refuse to build from a package whose installed version is not the pinned one (`==`, or
    a range's upper bound, which a fresh install gets): its docstrings, and so the corpus,
    would differ from every other machine's."""
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            pins[requirement.name.lower()] = next(
                spec.version for spec in requirement.specifier if spec.operator in ("==", "<=")
            )
    distributions = importlib.metadata.packages_distributions()
    for module in modules:
        (name,) = distributions[module.split(".")[0]]
        installed = importlib.metadata.version(name).split("+")[0]
        if pins.get(name.lower()) != installed:
            raise RuntimeError(
                f"{name} {installed} is installed, requirements.txt pins {pins.get(name.lower())}: "
                "install the pinned version for the probe's test corpus"
            )


def module_files(module: str) -> list[Path]:
    """The source files of a module or package, sorted, without its tests."""
    spec = importlib.util.find_spec(module)
    if not spec.submodule_search_locations:
        return [Path(spec.origin)]
    root = Path(spec.origin).parent
    # Docstrings of test cases are about testing, not the field.
    return [path for path in sorted(root.rglob("*.py"))
            if "tests" not in path.relative_to(root).parts]  # fmt: skip


def package_docstring_documents(documents_per_area: int) -> list[tuple[str, str, str]]:
    """(docstring, domain, area) for PACKAGE_DOCSTRING_AREAS: each docstring's prose as the
    benchmark corpus cuts it, once, of at least MIN_WORDS_PER_DOCSTRING words, the first
    `documents_per_area` of each area in the order of a hash of their text."""
    from bench.docstring_corpus import file_documents

    check_pinned_versions([m for modules in PACKAGE_DOCSTRING_AREAS.values() for m in modules])
    seen: set[str] = set()
    documents = []
    for (domain, area), modules in PACKAGE_DOCSTRING_AREAS.items():
        texts = []
        for path in (path for module in modules for path in module_files(module)):
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
