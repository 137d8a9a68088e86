"""The GPU benchmark's pieces, checked on CPU: its corpus builder and its run orchestration.

bench/ holds scripts, not a package, so they are loaded from their files.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


def load_bench_script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
    docstring_corpus = load_bench_script("docstring_corpus")
    package = tmp_path / "site" / "pkg"
    package.mkdir(parents=True)
    (package / "a.py").write_text(PACKAGE_SOURCE)
    (package / "b.py").write_text(PACKAGE_SOURCE)  # the same docstrings again: kept once

    path, num_documents, _ = docstring_corpus.write_docstring_corpus(
        docstring_corpus.DocstringCorpusArguments(
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
    from common.cli import InputError

    docstring_corpus = load_bench_script("docstring_corpus")
    with pytest.raises(InputError, match="do not exist"):
        docstring_corpus.write_docstring_corpus(
            docstring_corpus.DocstringCorpusArguments(
                output_dir=str(tmp_path / "corpus"), package_roots=[str(tmp_path / "missing")]
            )
        )
