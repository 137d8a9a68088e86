"""The Web of Science labels of a corpus: the label files beside one `X.txt` and the class names.

The label files (`Y.txt`, `YL1.txt`, `YL2.txt`, one integer per line, line-aligned with the
texts) are read from the same zip or folder as the texts (`read_labelled_documents`), and the
names of the classes from `Meta-data/Data.xlsx` when it is there (`read_wos_label_names`).
Texts are cleaned as the shared corpus reader cleans them (common/corpus.py).
"""

import io
import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.cli import InputError
from common.corpus import (
    WOS_TEXT_FILE,
    CorpusArguments,
    CorpusStats,
    DocumentCleaner,
    TextSource,
    check_and_log_counts,
    file_source,
    iter_source_texts,
    resolve_sources,
)

logger = logging.getLogger(__name__)

# Label files beside X.txt: the flat label (one id per area), the domain, and the area's index
# within its domain (not a global id).
WOS_LABEL_FILE = "Y.txt"
WOS_DOMAIN_FILE = "YL1.txt"
WOS_AREA_IN_DOMAIN_FILE = "YL2.txt"
# The class names, relative to the subset folder (WOS46985/X.txt -> Meta-data/Data.xlsx).
WOS_METADATA_PATH = "../Meta-data/Data.xlsx"
WOS_METADATA_COLUMNS = ("Y1", "Y2", "Y", "Domain", "area")


@dataclass
class LabelledDocuments:
    """Documents and their integer labels, one per document in each label file's list."""

    texts: list[str]
    labels: dict[str, list[int]]  # label file name ("YL1.txt") -> one label per text
    stats: CorpusStats
    # Later copies of a text are dropped with their labels; these had labels of their own.
    num_duplicates_with_other_labels: int = 0


@dataclass
class WosLabelNames:
    """Class names from Data.xlsx, stripped of their padding."""

    source: str
    domains: dict[int, str]  # YL1 -> domain
    areas: dict[tuple[int, int], str]  # (YL1, YL2) -> area
    labels: dict[int, str]  # Y -> area


def read_labelled_documents(args: CorpusArguments, label_files: Sequence[str]) -> LabelledDocuments:
    """The documents of one `X.txt` with the labels of each of `label_files` beside it, an
    empty or repeated text dropped with its labels. Raises InputError for more than one input,
    a .jsonl input, or a label file that is missing, not integers, or not line-aligned."""
    sources = resolve_sources(args)
    if len(sources) != 1 or sources[0].is_jsonl:
        listing = ", ".join(source.label for source in sources)
        raise InputError(
            f"labels need one X.txt with its label files beside it, got {listing}; pass one "
            "WebOfScience.zip, WoS folder or X.txt (choose the subset with --subset)"
        )
    (source,) = sources
    raw_texts = list(iter_source_texts(source, args))
    _drop_trailing_blank_lines(raw_texts)
    raw_labels = {name: _read_label_file(source, name, args) for name in label_files}
    for name, values in raw_labels.items():
        if len(values) != len(raw_texts):
            raise InputError(
                f"{name} beside {source.label} has {len(values):,} labels but the texts have "
                f"{len(raw_texts):,} lines; the files must be line-aligned (one label per text)"
            )
    stats = CorpusStats(sources=[source.label])
    cleaner = DocumentCleaner(stats)
    first_labels: dict[str, tuple[int, ...]] = {}
    documents = LabelledDocuments(texts=[], labels={name: [] for name in label_files}, stats=stats)
    for line_index, raw_text in enumerate(raw_texts):
        line_labels = tuple(raw_labels[name][line_index] for name in label_files)
        text = cleaner.clean(raw_text)
        if text is None:
            stripped = raw_text.strip()
            if stripped and first_labels[stripped] != line_labels:
                documents.num_duplicates_with_other_labels += 1
            continue
        first_labels[text] = line_labels
        documents.texts.append(text)
        for name, label in zip(label_files, line_labels, strict=True):
            documents.labels[name].append(label)
    check_and_log_counts(stats)
    if documents.num_duplicates_with_other_labels:
        logger.warning(
            "%d repeated texts had labels other than their first copy's; the first copy's "
            "labels are kept",
            documents.num_duplicates_with_other_labels,
        )
    return documents


def _drop_trailing_blank_lines(lines: list[str]) -> None:
    while lines and not lines[-1].strip():
        lines.pop()


def _read_label_file(text_source: TextSource, name: str, args: CorpusArguments) -> list[int]:
    source = text_source.locate(name)
    if source is None:
        raise InputError(
            f"no {name} beside {text_source.label}; labels come from the Web of Science "
            f"layout ({WOS_TEXT_FILE}, {WOS_LABEL_FILE}, {WOS_DOMAIN_FILE}, "
            f"{WOS_AREA_IN_DOMAIN_FILE} in one folder)"
        )
    lines = list(iter_source_texts(source, args))
    _drop_trailing_blank_lines(lines)
    labels = []
    for line_number, line in enumerate(lines, start=1):
        try:
            labels.append(int(line.strip()))
        except ValueError:
            raise InputError(
                f"{source.label} line {line_number}: {line.strip()[:40]!r} is not an integer "
                "label; each line must hold one integer"
            ) from None
    return labels


def read_wos_label_names(
    args: CorpusArguments, names_file: str | None = None
) -> WosLabelNames | None:
    """Class names from `names_file`, or from `Meta-data/Data.xlsx` beside the subset folder
    of the corpus; None when no file is given and none is there. Raises InputError for a file
    that is missing, not a spreadsheet, or without the columns Y1 Y2 Y Domain area."""
    if names_file is not None:
        path = Path(names_file)
        if not path.is_file():
            raise InputError(f"label names file {path} does not exist; pass Data.xlsx")
        source = file_source(path)
    else:
        sources = resolve_sources(args)
        source = sources[0].locate(WOS_METADATA_PATH) if len(sources) == 1 else None
        if source is None:
            return None
    with source.open_binary() as handle:
        return _parse_label_names(handle.read(), source.label)


def _parse_label_names(data: bytes, label: str) -> WosLabelNames:
    import openpyxl

    try:
        workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except Exception as err:  # noqa: BLE001 (a damaged file raises zip, XML or key errors)
        raise InputError(
            f"{label} cannot be read as a spreadsheet ({type(err).__name__}: {err}); "
            "pass the Data.xlsx of the download with --label_names_file"
        ) from None
    try:
        rows = workbook.worksheets[0].iter_rows(values_only=True)
        header = [str(cell).strip() if cell is not None else "" for cell in next(rows, ())]
        missing = [column for column in WOS_METADATA_COLUMNS if column not in header]
        if missing:
            raise InputError(
                f"{label} has no column {', '.join(missing)} (its columns: {', '.join(header)}); "
                f"expected the WoS Data.xlsx with {' '.join(WOS_METADATA_COLUMNS)}"
            )
        columns = [header.index(column) for column in WOS_METADATA_COLUMNS]
        # id -> how often each name is given to it
        domains, areas, labels = defaultdict(Counter), defaultdict(Counter), defaultdict(Counter)
        for row_number, row in enumerate(rows, start=2):
            values = [row[column] if column < len(row) else None for column in columns]
            if all(value is None for value in values):
                continue
            try:
                domain_id, area_id, label_id = (int(str(value).strip()) for value in values[:3])
            except ValueError:
                raise InputError(
                    f"{label} row {row_number}: Y1, Y2 and Y must be integers, got {values[:3]}"
                ) from None
            domain, area = (str(value).strip() for value in values[3:])
            domains[domain_id][domain] += 1
            areas[domain_id, area_id][area] += 1
            labels[label_id][area] += 1
    finally:
        workbook.close()
    num_ambiguous = sum(
        len(names) > 1 for table in (domains, areas, labels) for names in table.values()
    )
    if num_ambiguous:
        logger.warning(
            "%s gives %d ids more than one name; each id keeps its most frequent name",
            label,
            num_ambiguous,
        )

    def most_frequent(table: dict) -> dict:
        return {key: names.most_common(1)[0][0] for key, names in table.items()}

    return WosLabelNames(label, most_frequent(domains), most_frequent(areas), most_frequent(labels))
