"""Shared test settings: offline, small thread pools, deterministic."""

import os

import pytest

# Nothing in the suite may reach the network: the hub libraries must work from local files.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread in every process the suite starts, as asked: a node's load then neither slows the
# tiny steps down nor adds the thread policy's line to the one line a test expects.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One torch thread in the test process: the suite runs on 2 cores shared with the
    subprocesses it starts, where more threads make the tiny steps of these tests slower."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def mnist_pytorch_run(tmp_path_factory):
    """A finished run of the plain PyTorch trainer on the embedded digits, 2 short epochs."""
    from mnist_runs import SHORT_RUN

    from mnist.train import main

    output_dir = tmp_path_factory.mktemp("mnist") / "pytorch"
    assert main([*SHORT_RUN, "--output_dir", str(output_dir)]) == 0
    return output_dir


@pytest.fixture(scope="session")
def mnist_lightning_run(tmp_path_factory):
    """The Lightning trainer on the same digits: the on-device batcher (the plain run uses the
    DataLoader), and max_steps ends epoch 2 early."""
    from mnist_runs import SHORT_RUN

    from mnist.train_lightning import main

    output_dir = tmp_path_factory.mktemp("mnist") / "lightning"
    argv = [*SHORT_RUN, "--on_device_data", "true", "--max_steps", "40"]
    assert main([*argv, "--output_dir", str(output_dir)]) == 0
    return output_dir


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
