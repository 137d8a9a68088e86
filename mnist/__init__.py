"""LeNet-5 on MNIST: IDX reader, data pipeline, model, plain PyTorch and Lightning trainers."""
