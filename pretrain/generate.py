"""Sample text from a pretrained run.

    generate-text RUN_DIR --prompt "Deep learning" [--num_samples 3]

RUN_DIR is a run folder of `pretrain/run.py` (its `final/` model is used) or any folder that
`AutoModelForCausalLM.from_pretrained` loads, such as one of its `checkpoint-<step>/`.
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from common.cli import InputError, entry_point, parse_args
from common.files import sealed_folder_damage
from common.run_contract import FINAL_MODEL_DIR
from common.tokenization import load_tokenizer
from pretrain.args import GenerateArguments


def find_model_dir(run_dir: str | Path) -> Path:
    """`RUN_DIR/final` for a finished run, else RUN_DIR itself if it holds a model; refused
    when its manifest says it is not whole."""
    run_dir = Path(run_dir)
    for candidate in (run_dir / FINAL_MODEL_DIR, run_dir):
        if (candidate / "config.json").is_file():
            if (damage := sealed_folder_damage(candidate)) is not None:
                raise InputError(f"model folder {candidate} is damaged: {damage}")
            return candidate
    raise InputError(
        f"no model in {run_dir}: expected {run_dir / FINAL_MODEL_DIR}/config.json (written when "
        "a run finishes); pass a finished run folder or one of its checkpoint-<step> folders"
    )


def generate_texts(args: GenerateArguments) -> list[str]:
    """Sample `num_samples` continuations of the prompt (prompt included)."""
    model_dir = find_model_dir(args.run_dir)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), trust_remote_code=False)
    model.to(device).eval()
    prompt_ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    if prompt_ids.shape[1] == 0:
        prompt_ids = torch.tensor([[tokenizer.eos_token_id]])
    context = model.config.max_position_embeddings
    if prompt_ids.shape[1] + args.max_new_tokens > context:
        raise InputError(
            f"prompt ({prompt_ids.shape[1]} tokens) plus --max_new_tokens {args.max_new_tokens} "
            f"exceeds the model's {context} positions; shorten one of them"
        )
    torch.manual_seed(args.seed)
    input_ids = prompt_ids.to(device).repeat(args.num_samples, 1)  # (samples, prompt_len)
    with torch.inference_mode():
        output_ids = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            # Training switched the key/value cache off; sampling token by token wants it.
            use_cache=True,
            pad_token_id=tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else tokenizer.eos_token_id,
        )
    return tokenizer.batch_decode(output_ids, skip_special_tokens=True)


@entry_point
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):
        argv = ["--run_dir", *argv]  # the run folder may come first, without its flag
    (args,) = parse_args([GenerateArguments], argv, description=__doc__, prog="generate-text")
    for index, text in enumerate(generate_texts(args)):
        if args.num_samples > 1:
            print(f"--- sample {index + 1}")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
