"""The benchmarks' corpus of real English: the prose of docstrings, each once, in a fixed order;
a missing package folder is one error."""

import pytest

from bench.docstring_corpus import DocstringCorpusArguments, write_docstring_corpus
from common.cli import InputError

PACKAGE_SOURCE = '''"""Tools to measure how fast a model learns from a stream of scientific text.

Parameters
----------
rate : float
    The learning rate.

>>> measure(rate=0.1)
0.5
"""


def measure(rate):
    """Return the loss after one pass over the corpus at the given learning rate, in nats."""


def short():
    """Too short to count."""
'''


def test_docstring_corpus_keeps_prose_and_drops_sections_examples_and_duplicates(tmp_path):
    package = tmp_path / "site" / "pkg"
    package.mkdir(parents=True)
    (package / "a.py").write_text(PACKAGE_SOURCE)
    (package / "b.py").write_text(PACKAGE_SOURCE)  # the same docstrings again: kept once

    path, num_documents, _ = write_docstring_corpus(
        DocstringCorpusArguments(
            output_dir=str(tmp_path / "corpus"), package_roots=[str(tmp_path / "site")], num_proc=1
        )
    )
    documents = path.read_text().splitlines()
    assert num_documents == len(documents) == 2
    assert documents[0].startswith("Tools to measure how fast a model learns")
    assert documents[0].endswith("scientific text.")  # the Parameters section is not appended
    assert documents[1].startswith("Return the loss after one pass")
    assert not any("learning rate." in d or ">>>" in d for d in documents)


def test_docstring_corpus_refuses_a_missing_package_root(tmp_path):
    with pytest.raises(InputError, match="do not exist"):
        write_docstring_corpus(
            DocstringCorpusArguments(
                output_dir=str(tmp_path / "corpus"), package_roots=[str(tmp_path / "missing")]
            )
        )
