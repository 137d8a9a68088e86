"""One training step of our GPT-2 against nanoGPT's model, side by side on the CPU.

    python -m bench.model_step --nanogpt_model path/to/nanoGPT/model.py [--model_preset proxy]
        [--batch_size 4] [--block_size 256] [--steps 20] [--pairs 3] [--profile true]

Ours is transformers' `GPT2LMHeadModel` as pretrain/model.py builds it, once per
`--activations` (GPT-2's `gelu_new`, several elementwise kernels, and `gelu_pytorch_tanh`, the
same function in one); nanoGPT's is its `model.py` (github.com/karpathy/nanoGPT, not a
dependency: pass the file) with the same shape, vocabulary, biases and tied embedding. Each
measurement is a fresh process (one thread, eager fp32, AdamW, the same random token ids) that
takes the CPU seconds of `--steps` steps after one warm-up step (other jobs on a shared machine
barely move them); the sides alternate in each of `--pairs` rounds, and the ratio ours /
nanoGPT is taken within a round.
`--profile` prints the operators that take the most time in one step of each side.
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
from transformers.hf_argparser import HfArg

from common.cli import entry_point, parse_args
from pretrain.model import PRESETS, build_model, build_model_config


@dataclass
class ModelStepArguments:
    nanogpt_model: str = HfArg(help="nanoGPT's model.py.")
    model_preset: str = HfArg(default="proxy", help="Shape of both models.")
    vocab_size: int = HfArg(default=8192, help="Vocabulary of both models.")
    batch_size: int = HfArg(default=4, help="Sequences per step.")
    block_size: int = HfArg(default=256, help="Tokens per sequence.")
    steps: int = HfArg(default=20, help="Timed steps per measurement.")
    pairs: int = HfArg(default=3, help="Rounds, each measuring every side once.")
    activations: list[str] = HfArg(
        default_factory=lambda: ["gelu_new", "gelu_pytorch_tanh"],
        help="The activations of ours to measure, each against nanoGPT.",
    )
    profile: bool = HfArg(default=False, help="Print each side's top operators.")
    side: str | None = HfArg(default=None, help="(internal) measure one side.")


def build(args: ModelStepArguments, side: str) -> torch.nn.Module:
    torch.manual_seed(0)
    preset = PRESETS[args.model_preset]
    if side == "nanogpt":
        spec = importlib.util.spec_from_file_location("nanogpt_model", args.nanogpt_model)
        nanogpt = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(nanogpt)
        config = nanogpt.GPTConfig(
            block_size=args.block_size, vocab_size=args.vocab_size, n_layer=preset.n_layer,
            n_head=preset.n_head, n_embd=preset.n_embd, dropout=0.0, bias=True,
        )  # fmt: skip
        return nanogpt.GPT(config)

    class Vocabulary:  # what build_model_config reads of a tokenizer
        bos_token_id = eos_token_id = pad_token_id = 0

        def __len__(self) -> int:
            return args.vocab_size

    config = build_model_config(
        args.model_preset, Vocabulary(), args.block_size, args.vocab_size, activation_function=side
    )
    return build_model(config)


def seconds_per_step(args: ModelStepArguments, side: str) -> float:
    torch.set_num_threads(1)
    model = build(args, side)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    same_on_every_side = torch.Generator().manual_seed(0)
    shape = (args.batch_size, args.block_size + 1)
    ids = torch.randint(0, args.vocab_size, shape, generator=same_on_every_side)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step() -> None:
        if side == "nanogpt":
            _, loss = model(inputs, targets=targets)
        else:
            loss = model(input_ids=inputs, labels=inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: allocations, optimizer state
    if args.profile:
        with torch.profiler.profile() as profile:
            step()
        print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    # CPU seconds of this one-thread process: other jobs barely move it.
    started = time.process_time()
    for _ in range(args.steps):
        step()
    return (time.process_time() - started) / args.steps


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args([ModelStepArguments], argv, description=__doc__)
    if args.side is not None:
        print(seconds_per_step(args, args.side))
        return 0
    own_argv = list(sys.argv[1:] if argv is None else argv)
    ratios: dict[str, list[float]] = {activation: [] for activation in args.activations}
    for round_index in range(args.pairs):
        sides = ["nanogpt", *args.activations]
        if round_index % 2:
            sides.reverse()
        seconds = {}
        for side in sides:
            command = [sys.executable, "-m", "bench.model_step", *own_argv, "--side", side]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            seconds[side] = float(output.strip().splitlines()[-1])
            if args.profile:
                print(f"--- {side}\n" + "\n".join(output.strip().splitlines()[:-1]))
        for activation in args.activations:
            ratios[activation].append(seconds[activation] / seconds["nanogpt"])
        print(
            f"round {round_index + 1}: " + ", ".join(f"{k} {v:.3f} s" for k, v in seconds.items())
        )
    for activation, values in ratios.items():
        print(
            f"ours ({activation}) / nanoGPT: median {statistics.median(values):.3f} "
            f"({', '.join(f'{value:.3f}' for value in values)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
