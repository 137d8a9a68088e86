"""What several stages share, and nothing else.

The command line (`cli`: `--config` YAML + flags, one-line errors), atomic outputs (`files`),
the corpus reader the tokenizer and pretraining both read (`corpus`), tokenizer folders and
document tokenization for block preparation and the probe (`tokenization`), the offline demo corpus
(`demo_corpus`), the hardware and library description every run summary records (`system`),
and the run-folder contract its writers and the report import (`run_contract`). Code that one
stage alone uses lives in that stage's folder.
"""
