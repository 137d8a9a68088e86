"""LeNet-5 on MNIST: IDX reader, data pipeline, model, plain PyTorch and Lightning trainers."""

import common  # noqa: F401 (first: Ctrl-C while the libraries import is one line)
