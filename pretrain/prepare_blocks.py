"""`prepare-blocks`: tokenize and pack the corpus into cached blocks, print the folder.

    prepare-blocks --corpus data/WebOfScience.zip --tokenizer_dir runs/tokenizer \\
        --cache_dir data/cache --max_train_tokens 12000000

A second run with the same inputs prints the same folder within seconds (see
pretrain/blocks/packing.py for the packing, split and budget rules).
"""

from __future__ import annotations

from common.cli import entry_point, parse_args
from common.corpus import CorpusArguments
from pretrain.blocks.args import DataArguments
from pretrain.blocks.cache import prepare_blocks


@entry_point
def main(argv: list[str] | None = None) -> int:
    corpus_args, data_args = parse_args(
        [CorpusArguments, DataArguments], argv, description=__doc__, prog="prepare-blocks"
    )
    print(prepare_blocks(corpus_args, data_args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
