"""Classification probe: fine-tune a pretraining run's GPT-2 on Web of Science labels and compare
it with the same network from random weights and with TF-IDF + logistic regression."""

import common  # noqa: F401 (first: Ctrl-C while the libraries import is one line)
