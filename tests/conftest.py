"""Shared test settings: offline, small thread pools, deterministic."""

import os

import pytest

# Nothing in the suite may reach the network: the hub libraries must work from local files.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One torch thread in the test process: the suite runs on 2 cores shared with the
    subprocesses it starts, where more threads make the tiny steps of these tests slower."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def wos_corpus_dir(tmp_path_factory):
    """A small Web of Science layout (WOS46985/X.txt, WOS11967/X.txt, WOS5736/X.txt) of
    400 real English paragraphs, written deterministically."""
    from common.demo_corpus import write_demo_corpus

    return write_demo_corpus(tmp_path_factory.mktemp("wos") / "WebOfScience", max_documents=400)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(wos_corpus_dir, tmp_path_factory):
    """A byte-level BPE tokenizer folder (vocabulary 512) trained on `wos_corpus_dir`."""
    from common.corpus import CorpusArguments
    from tokenizer.train import TokenizerArguments, train_tokenizer

    output_dir = tmp_path_factory.mktemp("tokenizer") / "tiny"
    train_tokenizer(
        CorpusArguments(corpus=[str(wos_corpus_dir)]),
        TokenizerArguments(output_dir=str(output_dir), vocab_size=512),
        show_progress=False,
    )
    return output_dir
