"""The parallelism lab: tensor and pipeline parallelism for our GPT-2, trained by a loop of
our own (Trainer runs the data-parallel strategies)."""
