"""The short LeNet-5 runs that several test modules read (made once per session in conftest)."""

NUM_PROJECTOR_DIGITS = 40
# 3,600 training digits (embedded sample less validation) in batches of 128: 29 steps per epoch.
SHORT_RUN = [
    "--epochs", "2",
    "--batch_size", "128",
    "--log_every_n_steps", "2",
    "--num_projector_digits", str(NUM_PROJECTOR_DIGITS),
    "--device", "cpu",
]  # fmt: skip
