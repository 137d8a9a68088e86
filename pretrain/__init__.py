"""Pretrain GPT-2 from scratch: pack the corpus into token blocks, then train on them."""

import common  # noqa: F401 (first: Ctrl-C while the libraries import is one line)
