"""The Web of Science labels: the label files beside X.txt and the class names in Data.xlsx,
read from every input form; bad label files fail clearly."""

import shutil
import zipfile
from pathlib import Path

import pytest
from labelled_wos import write_bytes, write_data_xlsx, write_labelled_wos, zip_folder

from common.cli import InputError
from common.corpus import CorpusArguments
from probe.labels import (
    WOS_AREA_IN_DOMAIN_FILE,
    WOS_DOMAIN_FILE,
    WOS_LABEL_FILE,
    read_labelled_documents,
    read_wos_label_names,
)

LABEL_FILES = (WOS_DOMAIN_FILE, WOS_AREA_IN_DOMAIN_FILE, WOS_LABEL_FILE)
LABELLED = [
    ("Neural networks learn representations.", "CS", "Machine learning"),
    ("Compilers translate programs.", "CS", "Compilers"),
    ("Enzymes catalyse reactions in cells.", "Biochemistry", "Enzymology"),
    ("Gradient descent minimises a loss.", "CS", "Machine learning"),
]


@pytest.fixture(scope="module")
def labelled_root(tmp_path_factory) -> Path:
    return write_labelled_wos(tmp_path_factory.mktemp("labelled") / "WebOfScience", LABELLED)


def test_labels_are_read_beside_the_texts_in_every_form(labelled_root, tmp_path):
    wrapped = tmp_path / "download.zip"
    with zipfile.ZipFile(wrapped, "w") as archive:
        archive.write(zip_folder(labelled_root, tmp_path / "wos.zip"), "WebOfScience.zip")
    expected_texts = [text for text, _, _ in LABELLED]
    # Domains and areas numbered in sorted order; YL2 restarts in each domain, Y does not.
    expected = {
        WOS_DOMAIN_FILE: [1, 1, 0, 1],
        WOS_AREA_IN_DOMAIN_FILE: [1, 0, 0, 1],
        WOS_LABEL_FILE: [2, 1, 0, 2],
    }
    for path in (labelled_root, wrapped, labelled_root / "WOS46985" / "X.txt"):
        documents = read_labelled_documents(CorpusArguments(corpus=[str(path)]), LABEL_FILES)
        assert documents.texts == expected_texts
        assert documents.labels == expected
        assert documents.stats.num_documents == 4


def test_empty_and_repeated_texts_are_dropped_with_their_labels(tmp_path):
    folder = tmp_path / "WOS46985"
    write_bytes(folder / "X.txt", b"first\n\nsecond\nfirst\n  second \n")
    write_bytes(folder / "YL1.txt", b"0\n5\n1\n0\n2\n\n")  # a trailing blank line is fine
    documents = read_labelled_documents(CorpusArguments(corpus=[str(tmp_path)]), ["YL1.txt"])
    assert documents.texts == ["first", "second"]
    assert documents.labels == {"YL1.txt": [0, 1]}
    assert (documents.stats.num_empty_lines, documents.stats.num_duplicates) == (1, 2)
    # "second" came back with label 2, not its first copy's 1.
    assert documents.num_duplicates_with_other_labels == 1


def test_label_names_come_from_data_xlsx_without_padding(labelled_root, tmp_path):
    for path in (labelled_root, zip_folder(labelled_root, tmp_path / "wos.zip")):
        names = read_wos_label_names(CorpusArguments(corpus=[str(path)]))
        assert names.source.endswith("Data.xlsx")
        assert names.domains == {0: "Biochemistry", 1: "CS"}
        assert names.areas == {
            (0, 0): "Enzymology",
            (1, 0): "Compilers",
            (1, 1): "Machine learning",
        }
        assert names.labels == {0: "Enzymology", 1: "Compilers", 2: "Machine learning"}
    bare = tmp_path / "bare" / "WOS46985"
    shutil.copytree(labelled_root / "WOS46985", bare)
    assert read_wos_label_names(CorpusArguments(corpus=[str(bare)])) is None
    explicit = read_wos_label_names(
        CorpusArguments(corpus=[str(bare)]), str(labelled_root / "Meta-data" / "Data.xlsx")
    )
    assert explicit.domains == {0: "Biochemistry", 1: "CS"}


def test_bad_labels_raise_input_error_naming_the_file(labelled_root, tmp_path):
    def labelled_copy(name: str, **replace: bytes) -> Path:
        root = tmp_path / name
        shutil.copytree(labelled_root, root)
        for file_name, data in replace.items():
            (root / "WOS46985" / f"{file_name}.txt").write_bytes(data)
        return root

    cases = [
        (
            labelled_copy("short", YL1=b"0\n1\n"),
            r"YL1\.txt beside .* has 2 labels but the texts have 4",
        ),
        (
            labelled_copy("word", YL2=b"0\n1\nnine\n0\n"),
            r"YL2\.txt line 3: 'nine' is not an integer",
        ),
    ]
    missing = labelled_copy("missing")
    (missing / "WOS46985" / "Y.txt").unlink()
    cases.append((missing, r"no Y\.txt beside"))
    for root, message in cases:
        with pytest.raises(InputError, match=message):
            read_labelled_documents(CorpusArguments(corpus=[str(root)]), LABEL_FILES)
    jsonl = write_bytes(tmp_path / "a.jsonl", b'{"text": "x"}\n')
    for corpus in ([str(jsonl)], [str(labelled_root), str(labelled_root)]):
        with pytest.raises(InputError, match="labels need one X.txt"):
            read_labelled_documents(CorpusArguments(corpus=corpus), LABEL_FILES)


def test_bad_data_xlsx_raises_input_error(labelled_root, tmp_path):
    args = CorpusArguments(corpus=[str(labelled_root)])
    not_xlsx = write_bytes(tmp_path / "Data.xlsx", b"not a real spreadsheet")
    with pytest.raises(InputError, match="cannot be read as a spreadsheet"):
        read_wos_label_names(args, str(not_xlsx))
    no_area = write_data_xlsx(
        tmp_path / "NoArea.xlsx", [(0, 0, 0, "CS")], header=("Y1", "Y2", "Y", "Domain")
    )
    with pytest.raises(InputError, match="has no column area"):
        read_wos_label_names(args, str(no_area))
    with pytest.raises(InputError, match="does not exist"):
        read_wos_label_names(args, str(tmp_path / "missing.xlsx"))
