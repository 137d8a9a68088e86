"""Train a GPT-2 style byte-level BPE tokenizer on the corpus (`train-tokenizer`)."""

import common  # noqa: F401 (first: Ctrl-C while the libraries import is one line)
