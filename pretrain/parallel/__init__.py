"""The parallelism leaves: the strategy a run asked for and got (strategy.py), tensor
parallelism (tensor.py) and the pipeline (pipeline.py) for our GPT-2; the loop that trains
the last two is pretrain/run_model_parallel.py (Trainer runs the data-parallel strategies)."""
