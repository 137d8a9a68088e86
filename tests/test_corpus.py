"""The corpus reader: every input form gives the same clean documents; bad input fails
clearly."""

import json
import logging
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from labelled_wos import write_bytes, zip_folder

from common.cli import InputError
from common.corpus import (
    CorpusArguments,
    CorpusStats,
    corpus_bytes,
    corpus_fingerprint,
    iter_documents,
)


def read_all(*paths, **options) -> list[str]:
    return list(iter_documents(CorpusArguments(corpus=[str(p) for p in paths], **options)))


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
    # Known before reading: the text's bytes as stored, uncompressed in a zip too.
    text_bytes = (wos_corpus_dir / "WOS46985" / "X.txt").stat().st_size
    for path in (wos_corpus_dir, wos_zip, outer_zip, nested_folder):
        assert corpus_bytes(CorpusArguments(corpus=[str(path)])) == text_bytes


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
    os.mkfifo(tmp_path / "pipe.txt")  # read, it would block until a writer came
    (tmp_path / "wos" / "WOS46985").mkdir(parents=True)
    os.mkfifo(tmp_path / "wos" / "WOS46985" / "X.txt")
    cases = [
        (tmp_path / "pipe.txt", "pipe.txt is not a regular file"),
        (tmp_path / "wos", r"X\.txt is not a regular file"),
        (tmp_path / "missing.txt", "does not exist"),
        (tmp_path / ("x" * 300), r"cannot be read \(File name too long\)"),
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


def test_a_damaged_zip_is_named_as_such_never_read_as_text(wos_zip, tmp_path):
    """A download cut short keeps the zip's first bytes but loses its table of contents; bytes
    damaged inside it decode to garbage that only the zip's checksum tells from bad text."""
    truncated = write_bytes(tmp_path / "WebOfScience.zip", wos_zip.read_bytes()[:2000])
    renamed = write_bytes(tmp_path / "download", wos_zip.read_bytes()[:2000])
    for path in (truncated, renamed):
        for replace in (False, True):
            with pytest.raises(InputError, match="is a damaged zip archive .* download it again"):
                read_all(path, replace_invalid_utf8=replace)
    data = bytearray(wos_zip.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = b"0123456789abcdef"
    damaged = write_bytes(tmp_path / "damaged.zip", bytes(data))
    for replace in (False, True):
        with pytest.raises(InputError, match="damaged zip data .*Bad CRC-32"):
            read_all(damaged, replace_invalid_utf8=replace)


def test_a_symlink_loop_is_named_as_such(tmp_path):
    loop = tmp_path / "loop.txt"
    loop.symlink_to(loop)
    with pytest.raises(InputError, match=r"loop\.txt is a symlink loop"):
        read_all(loop)
    with pytest.raises(InputError, match=r"missing\.txt does not exist"):
        read_all(tmp_path / "missing.txt")


def test_a_glob_through_a_link_to_a_parent_reads_each_file_once(tmp_path):
    write_bytes(tmp_path / "data" / "a.txt", b"one\ntwo\n")
    write_bytes(tmp_path / "data" / "sub" / "b.txt", b"three\n")
    (tmp_path / "data" / "sub" / "up").symlink_to("..")  # data/sub/up/sub/up/... is data
    stats = CorpusStats()
    args = CorpusArguments(corpus=[str(tmp_path / "data" / "**" / "*.txt")])
    assert list(iter_documents(args, stats)) == ["one", "two", "three"]
    # Each file read once, under its shallowest name; no duplicates were ever read.
    assert stats.sources == [str(tmp_path / "data" / "a.txt"), str(tmp_path / "data/sub/b.txt")]
    assert stats.num_duplicates == 0


def test_nul_bytes_are_counted_and_warned_about_once(tmp_path, caplog):
    path = write_bytes(tmp_path / "a.txt", b"text\x00with a NUL\nclean\n\x00\x00 two more\n")
    stats = CorpusStats()
    with caplog.at_level(logging.WARNING, logger="common.corpus"):
        documents = list(iter_documents(CorpusArguments(corpus=[str(path)]), stats))
    assert documents == ["text\x00with a NUL", "clean", "\x00\x00 two more"]
    assert stats.num_nul_bytes == 3
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == ["the documents hold 3 NUL bytes (binary data read as text?); kept as text"]
