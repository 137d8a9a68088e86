"""Pretrain GPT-2 from scratch: pack the corpus into token blocks, then train on them."""
