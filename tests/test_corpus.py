"""The corpus reader: every input form gives the same clean documents and the labels beside
them; bad input fails clearly."""

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from labelled_wos import write_data_xlsx, write_labelled_wos

from common.cli import InputError
from common.corpus import (
    WOS_AREA_IN_DOMAIN_FILE,
    WOS_DOMAIN_FILE,
    WOS_LABEL_FILE,
    CorpusArguments,
    CorpusStats,
    corpus_fingerprint,
    iter_documents,
    read_labelled_documents,
    read_wos_label_names,
)


def read_all(*paths, **options) -> list[str]:
    return list(iter_documents(CorpusArguments(corpus=[str(p) for p in paths], **options)))


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
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


@pytest.fixture(scope="module")
def wos_documents(wos_corpus_dir) -> list[str]:
    return (wos_corpus_dir / "WOS46985" / "X.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def wos_zip(wos_corpus_dir, tmp_path_factory) -> Path:
    return zip_folder(wos_corpus_dir, tmp_path_factory.mktemp("zip") / "WebOfScience.zip")


def test_every_input_form_gives_the_same_documents(
    wos_corpus_dir, wos_zip, wos_documents, tmp_path
):
    # Mendeley's "download all" archive wraps WebOfScience.zip in another zip.
    outer_zip = tmp_path / "9rw3vkcfy4-6.zip"
    with zipfile.ZipFile(outer_zip, "w") as archive:
        archive.write(wos_zip, "WebOfScience.zip")
    # Extracted one level deeper than the fixture, as `unzip -d data` would leave it.
    nested_folder = tmp_path / "data"
    shutil.copytree(wos_corpus_dir, nested_folder / "WebOfScience")
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"id": i, "text": doc}) + "\n" for i, doc in enumerate(wos_documents)),
        encoding="utf-8",
    )

    expected = [doc.strip() for doc in wos_documents]
    assert len(expected) == 400
    assert read_all(wos_corpus_dir) == expected
    assert read_all(wos_zip) == expected
    assert read_all(outer_zip) == expected
    assert read_all(nested_folder) == expected
    assert read_all(wos_corpus_dir / "WOS46985" / "X.txt") == expected
    assert read_all(jsonl) == expected


def test_subset_choice_and_unknown_subset(wos_corpus_dir, wos_zip, wos_documents):
    small = read_all(wos_corpus_dir, subset="WOS5736")
    assert 0 < len(small) < len(wos_documents)
    assert small == wos_documents[: len(small)]
    assert read_all(wos_zip, subset="WOS11967") == read_all(wos_corpus_dir, subset="WOS11967")
    for path in (wos_corpus_dir, wos_zip):
        with pytest.raises(InputError, match="available: WOS11967, WOS46985, WOS5736"):
            iter_documents(CorpusArguments(corpus=[str(path)], subset="WOS999"))


def test_a_single_path_string_is_accepted(wos_corpus_dir, wos_documents):
    # As a YAML config file gives it: `corpus: data/WebOfScience`.
    assert list(iter_documents(CorpusArguments(corpus=str(wos_corpus_dir)))) == wos_documents


def test_folder_holding_only_the_zip_points_to_it(wos_zip, tmp_path):
    shutil.copy(wos_zip, tmp_path / "WebOfScience.zip")
    with pytest.raises(InputError, match=r"holds no X\.txt.*pass the zip itself"):
        read_all(tmp_path)


def test_strip_skip_empty_and_drop_duplicates(tmp_path):
    text = b"  first doc \n\n\t\nsecond\nfirst doc\n  second  \nthird"
    path = write_bytes(tmp_path / "a.txt", text)
    stats = CorpusStats()
    documents = list(iter_documents(CorpusArguments(corpus=[str(path)]), stats))
    assert documents == ["first doc", "second", "third"]
    assert (stats.num_documents, stats.num_duplicates, stats.num_empty_lines) == (3, 2, 2)
    assert stats.num_bytes == len("first docsecondthird")
    assert stats.sources == [str(path)]


def test_duplicates_across_files_are_dropped_and_order_follows_the_arguments(tmp_path):
    first = write_bytes(tmp_path / "b.txt", b"shared\nonly in b\n")
    second = write_bytes(tmp_path / "a.txt", b"only in a\nshared\n")
    assert read_all(first, second) == ["shared", "only in b", "only in a"]
    # A glob is expanded in sorted order.
    assert read_all(tmp_path / "*.txt") == ["only in a", "shared", "only in b"]


def test_bom_and_crlf(tmp_path):
    path = write_bytes(tmp_path / "windows.txt", b"\xef\xbb\xbfcaf\xc3\xa9 one\r\ntwo\r\n\r\n")
    assert read_all(path) == ["café one", "two"]


def test_only_newlines_separate_documents(tmp_path):
    # Form feeds and Unicode line separators inside a line stay inside the document.
    path = write_bytes(tmp_path / "a.txt", "one\x0cstill one\u2028same\ntwo\n".encode())
    assert read_all(path) == ["one\x0cstill one\u2028same", "two"]


def test_invalid_utf8_names_file_and_line_unless_replaced(tmp_path):
    path = write_bytes(tmp_path / "bad.txt", b"good line\nsecond\nbad \xff byte\n")
    with pytest.raises(InputError, match=r"bad\.txt line 3: invalid UTF-8.*--replace_invalid_utf8"):
        read_all(path)
    assert read_all(path, replace_invalid_utf8=True) == ["good line", "second", "bad \ufffd byte"]


def test_jsonl_text_field_and_errors(tmp_path):
    path = write_bytes(tmp_path / "a.jsonl", b'{"body": "x y"}\n\n{"body": "z"}\n')
    assert read_all(path, text_field="body") == ["x y", "z"]
    with pytest.raises(InputError, match=r"a\.jsonl line 1: no string field 'text'"):
        read_all(path)
    broken = write_bytes(tmp_path / "broken.jsonl", b'{"text": "ok"}\n{"text": \n')
    with pytest.raises(InputError, match=r"broken\.jsonl line 2: not valid JSON"):
        read_all(broken)


def test_bad_inputs_raise_input_error(tmp_path):
    no_text_zip = tmp_path / "other.zip"
    with zipfile.ZipFile(no_text_zip, "w") as archive:
        archive.writestr("WOS46985/Y.txt", "1\n")
    write_bytes(tmp_path / "empty_folder" / "readme.md", b"nothing here")
    blank = write_bytes(tmp_path / "blank.txt", b"\n   \n\r\n")
    cases = [
        (tmp_path / "missing.txt", "does not exist"),
        (no_text_zip, "holds no X.txt"),
        (tmp_path / "empty_folder", "holds no X.txt"),
        (tmp_path / "*.nothing", "matches no files"),
    ]
    for path, message in cases:
        with pytest.raises(InputError, match=message):
            iter_documents(CorpusArguments(corpus=[str(path)]))
    with pytest.raises(InputError, match="holds no non-empty documents"):
        read_all(blank)


def test_fingerprint_tracks_content_and_options(tmp_path):
    path = write_bytes(tmp_path / "a.txt", b"one\ntwo\n")
    args = CorpusArguments(corpus=[str(path)])
    first = corpus_fingerprint(args)
    assert corpus_fingerprint(CorpusArguments(corpus=[str(path)])) == first
    replacing = CorpusArguments(corpus=[str(path)], replace_invalid_utf8=True)
    assert corpus_fingerprint(replacing) != first
    path.write_bytes(b"one\nthree\n")
    assert corpus_fingerprint(args) != first


# Labels: the label files beside X.txt and the names in Data.xlsx.

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
