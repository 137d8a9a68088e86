"""One training step of our GPT-2 against nanoGPT's model, or with Muon against AdamW, side by
side on the CPU.

    python -m bench.model_step --nanogpt_model path/to/nanoGPT/model.py [--model_preset proxy]
        [--batch_size 4] [--block_size 256] [--steps 20] [--pairs 3] [--profile true]
    python -m bench.model_step --optimizers adamw muon muon_ns0 --activations gelu_pytorch_tanh \
        --model_preset gpt2-117m --batch_size 1 --block_size 1024 --accumulation 64

Ours is transformers' `GPT2LMHeadModel` as pretrain/model.py builds it, once per
`--activations` (GPT-2's `gelu_new`, several elementwise kernels, and `gelu_pytorch_tanh`, the
same function in one); nanoGPT's is its `model.py` (github.com/karpathy/nanoGPT, not a
dependency: pass the file) with the same shape, vocabulary, biases and tied embedding. Each
measurement is a fresh process (one thread, eager fp32, AdamW, the same random token ids) that
takes the CPU seconds of `--steps` steps after one warm-up step (other jobs on a shared machine
barely move them); the sides alternate in each of `--pairs` rounds, and the ratio ours /
nanoGPT is taken within a round.
`--optimizers` measures ours with AdamW, with Muon (pretrain/optim.py) and with Muon without its
Newton-Schulz iterations (`muon_ns0`: the difference is their cost). A side's forward-backward
and optimizer step are timed apart; a step is `--accumulation` forward-backward passes (their
mean over the sides with the same model) and one optimizer step, as a course step of 64 x 1024
tokens is 64 passes of 1 x 1024.
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
from transformers import TrainingArguments
from transformers.hf_argparser import HfArg

from common.cli import entry_point, parse_args
from pretrain.model import build_model, build_model_config, resolve_preset
from pretrain.optim import MuonArguments, muon_optimizer


@dataclass
class ModelStepArguments:
    nanogpt_model: str | None = HfArg(
        default=None, help="nanoGPT's model.py (the reference side; else our first side)."
    )
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
    optimizers: list[str] = HfArg(
        default_factory=lambda: ["adamw"],
        help="Our optimizers to measure (each with each activation).",
        metadata={"choices": ["adamw", "muon", "muon_ns0"]},
    )
    accumulation: int = HfArg(default=1, help="Forward-backward passes per optimizer step.")
    profile: bool = HfArg(default=False, help="Print each side's top operators.")
    side: str | None = HfArg(default=None, help="(internal) measure one side.")


def build(args: ModelStepArguments, side: str) -> torch.nn.Module:
    torch.manual_seed(0)
    preset = resolve_preset(args.model_preset)
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

    activation = side.partition("+")[0]
    config = build_model_config(
        args.model_preset,
        Vocabulary(),
        args.block_size,
        args.vocab_size,
        activation_function=activation,
    )
    return build_model(config)


def build_optimizer(model: torch.nn.Module, side: str) -> torch.optim.Optimizer:
    """AdamW, or Muon with AdamW (foreach, as on the AdamW side) for the rest."""
    optimizer = side.partition("+")[2] or "adamw"
    if optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-4)
    training_args = TrainingArguments(output_dir="unused", optim="adamw_torch", use_cpu=True)
    ns_steps = 0 if optimizer == "muon_ns0" else 5
    return muon_optimizer(model, training_args, MuonArguments(muon=True), ns_steps=ns_steps)


def seconds_per_step(args: ModelStepArguments, side: str) -> tuple[float, float]:
    """CPU seconds of one forward-backward pass and of one optimizer step."""
    torch.set_num_threads(1)
    model = build(args, side)
    optimizer = build_optimizer(model, side)
    same_on_every_side = torch.Generator().manual_seed(0)
    shape = (args.batch_size, args.block_size + 1)
    ids = torch.randint(0, args.vocab_size, shape, generator=same_on_every_side)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def forward_backward() -> None:
        if side == "nanogpt":
            _, loss = model(inputs, targets=targets)
        else:
            loss = model(input_ids=inputs, labels=inputs).loss
        loss.backward()

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    forward_backward()  # warm-up: allocations, optimizer state
    optimizer_step()
    if args.profile:
        with torch.profiler.profile() as profile:
            forward_backward()
            optimizer_step()
        print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    # CPU seconds of this one-thread process: other jobs barely move them.
    passes = steps = 0.0
    for _ in range(args.steps):
        started = time.process_time()
        forward_backward()
        between = time.process_time()
        optimizer_step()
        passes, steps = passes + between - started, steps + time.process_time() - between
    return passes / args.steps, steps / args.steps


@entry_point
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_args([ModelStepArguments], argv, description=__doc__)
    if args.side is not None:
        print(*seconds_per_step(args, args.side))
        return 0
    own_argv = list(sys.argv[1:] if argv is None else argv)
    ours = [f"{a}+{o}" if o != "adamw" else a for a in args.activations for o in args.optimizers]
    sides = ["nanogpt", *ours] if args.nanogpt_model else ours
    ratios: dict[str, list[float]] = {side: [] for side in ours if side != sides[0]}
    newton_schulz_shares: list[float] = []
    for round_index in range(args.pairs):
        seconds = {}
        for side in sides if round_index % 2 == 0 else sides[::-1]:
            command = [sys.executable, "-m", "bench.model_step", *own_argv, "--side", side]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            seconds[side] = tuple(map(float, output.strip().splitlines()[-1].split()))
            if args.profile:
                print(f"--- {side}\n" + "\n".join(output.strip().splitlines()[:-1]))
        # Sides of one activation run the same model: their passes' mean, less noise.
        model_of = {side: side.partition("+")[0] for side in sides}
        passes = {m: statistics.mean(seconds[s][0] for s in sides if model_of[s] == m) for m in
                  model_of.values()}  # fmt: skip
        seconds = {s: (passes[model_of[s]], o, args.accumulation * passes[model_of[s]] + o)
                   for s, (_, o) in seconds.items()}  # fmt: skip
        for side in ratios:
            ratios[side].append(seconds[side][2] / seconds[sides[0]][2])
        for activation in args.activations:
            muon, ns0 = seconds.get(f"{activation}+muon"), seconds.get(f"{activation}+muon_ns0")
            if muon and ns0:
                newton_schulz_shares.append((muon[1] - ns0[1]) / muon[2])
        print(
            f"round {round_index + 1}: "
            + ", ".join(f"{k} {p:.3f} + {o:.3f} s" for k, (p, o, _) in seconds.items())
            + f" (forward-backward x {args.accumulation} + optimizer step)"
        )
    for side, values in ratios.items():
        print(
            f"{side} / {sides[0]}: median {statistics.median(values):.3f} "
            f"({', '.join(f'{value:.3f}' for value in values)})"
        )
    if newton_schulz_shares:
        shares = ", ".join(f"{share:.1%}" for share in newton_schulz_shares)
        print(f"Newton-Schulz share of a Muon step: {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
