"""Train a GPT-2 style byte-level BPE tokenizer on the corpus (`train-tokenizer`)."""
