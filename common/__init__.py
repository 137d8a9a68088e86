"""What several stages share, and nothing else.

The command line (`cli`: `--config` YAML + flags, one-line errors), atomic outputs (`files`),
the corpus reader the tokenizer and pretraining both read (`corpus`), tokenizer folders and
document tokenization for block preparation and the probe (`tokenization`), the offline demo corpus
(`demo_corpus`), the hardware and library description every run summary records (`system`),
and the run-folder contract its writers and the report import (`run_contract`). Code that one
stage alone uses lives in that stage's folder.
"""

import os
import sys


def _interrupted_while_starting(kind, value, traceback, python_hook=sys.excepthook) -> None:
    """Ctrl-C before a command's own handler runs (its imports take seconds): one line and exit
    130, where Python prints the import machinery's traceback. Every package imports this one."""
    if not issubclass(kind, KeyboardInterrupt):
        return python_hook(kind, value, traceback)
    sys.stderr.write("error: interrupted (SIGINT) while starting; nothing was written\n")
    sys.stderr.flush()
    os._exit(130)


sys.excepthook = _interrupted_while_starting
