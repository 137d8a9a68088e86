"""`prepare-blocks`: tokenize and pack the corpus into cached blocks, print the folder.

    prepare-blocks --corpus data/WebOfScience.zip --tokenizer_dir runs/tokenizer \\
        --cache_dir data/cache --max_train_tokens 12000000
    prepare-blocks --config pretrain/configs/gpt2_117m.yaml   # the cache that run reads

Given a run's options (its --config, or any of pretrain/run.py's flags), it builds exactly the
cache that run reads on one process: the token budget rounded up to the run's whole batches as
the run rounds it (the course's 12M: 12,058,624 tokens on 1, 2, 4 or 8 processes alike).
A second run with the same inputs prints the same folder within seconds (see
pretrain/blocks/packing.py for the packing, split and budget rules).
"""

import sys
from dataclasses import fields

from common.cli import config_path, entry_point, load_config_file, parse_args
from common.corpus import CorpusArguments
from pretrain.blocks.args import DataArguments
from pretrain.blocks.cache import prepare_blocks

BLOCK_OPTIONS = {f.name for dtype in (CorpusArguments, DataArguments) for f in fields(dtype)}


def names_run_options(argv: list[str]) -> bool:
    """Whether `argv` or its config file sets an option of the run beyond the blocks' own."""
    flags = {arg.split("=")[0][2:] for arg in argv if arg.startswith("--")}
    keys = set(load_config_file(path)) if (path := config_path(argv)) else set()
    return bool((flags | keys) - BLOCK_OPTIONS - {"config", "help", ""})


@entry_point
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if names_run_options(argv):
        # Imported here: a cache hit from the blocks' own options stays free of torch.
        from pretrain.args import PretrainArguments, budget_in_whole_batches
        from pretrain.library_fixes import quiet_cpu_notices

        quiet_cpu_notices()  # TrainingArguments' torch_compile notice on a machine without a GPU
        (args,) = PretrainArguments.parse(argv, description=__doc__, prog="prepare-blocks")
        corpus_args = args.corpus
        data_args = budget_in_whole_batches(args, args.training.global_batch_blocks)
    else:
        corpus_args, data_args = parse_args(
            [CorpusArguments, DataArguments], argv, description=__doc__, prog="prepare-blocks"
        )
    print(prepare_blocks(corpus_args, data_args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
