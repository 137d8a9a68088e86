"""Packed blocks: packing invariants, split, budget, cache reuse and invalidation, bad input."""

import contextlib
import functools
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from pretrain_runs import REPO_ROOT, run_script_command, small_disk, subprocess_env, tiny_run_argv
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from common.cli import InputError, parse_args
from common.corpus import CorpusArguments, document_hashes, iter_documents
from common.files import sealed_folder_damage
from common.tokenization import PIECE_CHARS, tokenize_documents, tokenize_stream
from pretrain.blocks.args import DataArguments
from pretrain.blocks.cache import STATS_KEY_TYPES, load_blocks, prepare_blocks, read_stats
from pretrain.blocks.packing import (
    STATS_FILE,
    choose_validation_documents,
    num_budget_blocks,
    pack_blocks,
    select_training_blocks,
    unigram_entropy,
)
from pretrain.prepare_blocks import main

BLOCK_SIZE = 32
EOS_TEXT = "<|endoftext|>"


@pytest.fixture(scope="module")
def corpus_args(wos_corpus_dir):
    return CorpusArguments(corpus=[str(wos_corpus_dir)])


@pytest.fixture(scope="module")
def documents(corpus_args):
    return list(iter_documents(corpus_args))


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir):
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def built(corpus_args, tiny_tokenizer_dir, tmp_path_factory):
    """One cache built with default settings (block size 32): (data_args, folder)."""
    data_args = DataArguments(
        tokenizer_dir=str(tiny_tokenizer_dir),
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        block_size=BLOCK_SIZE,
    )
    return data_args, prepare_blocks(corpus_args, data_args)


def reference_stream(documents, tokenizer):
    """Token ids of `documents` with eos after each, through transformers' own call path."""
    ids = []
    for document in documents:
        ids += tokenizer(document, add_special_tokens=False)["input_ids"]
        ids.append(tokenizer.eos_token_id)
    return np.array(ids, dtype=np.int64)


def data_args_for(tokenizer_dir, cache_dir, **overrides):
    settings = {"block_size": BLOCK_SIZE, **overrides}
    return DataArguments(tokenizer_dir=str(tokenizer_dir), cache_dir=str(cache_dir), **settings)


def block_array(dataset):
    """All blocks of a split as one [num_blocks, block_size] numpy array."""
    return dataset[:]["input_ids"].numpy()


def file_mtimes(folder):
    return {path: path.stat().st_mtime_ns for path in sorted(folder.rglob("*"))}


def run_main(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def error_lines(err_lines):
    return [line for line in err_lines if line.startswith("error:")]


# --- packing ---------------------------------------------------------------------------------


def test_blocks_are_the_document_stream_cut_into_equal_blocks(built, documents, tokenizer):
    data_args, folder = built
    blocks = load_blocks(folder)
    stats = read_stats(folder)
    is_validation = choose_validation_documents(
        document_hashes(documents, str(data_args.split_seed)),
        np.array([len(tokenizer(d, add_special_tokens=False)["input_ids"]) + 1 for d in documents]),
        data_args.validation_fraction,
        BLOCK_SIZE,
    )
    for split, in_split in (("train", ~is_validation), ("validation", is_validation)):
        split_documents = [d for d, keep in zip(documents, in_split, strict=True) if keep]
        expected = reference_stream(split_documents, tokenizer)
        stored = block_array(blocks[split])
        assert stored.shape == (len(expected) // BLOCK_SIZE, BLOCK_SIZE)
        # Concatenated blocks are exactly a prefix of the stream: nothing invented or reordered.
        assert np.array_equal(stored.reshape(-1), expected[: stored.size])
        # The one dropped remainder is shorter than a block and is what stats.json reports.
        num_dropped = len(expected) - stored.size
        assert 0 <= num_dropped < BLOCK_SIZE
        assert stats["splits"][split]["num_dropped_tokens"] == num_dropped
        assert stats["splits"][split]["num_tokens"] == len(expected)
        assert stats["splits"][split]["num_documents"] == len(split_documents)
        # One end-of-text per document, each right after its document's tokens.
        assert np.count_nonzero(expected == tokenizer.eos_token_id) == len(split_documents)
    assert stats["num_documents"] == len(documents)
    assert stats["vocab_size"] == len(tokenizer) == 512
    assert sorted(blocks) == ["train", "validation"]


def test_stored_column_is_int32_input_ids_only(built):
    _, folder = built
    blocks = load_blocks(folder)
    for split in ("train", "validation"):
        dataset = blocks[split]
        assert dataset.column_names == ["input_ids"]
        assert str(dataset.features["input_ids"].feature.dtype) == "int32"
        assert dataset.features["input_ids"].length == BLOCK_SIZE
        # torch format: a batch comes out as the int64 tensor the embedding and loss expect.
        batch = dataset[:2]["input_ids"]
        assert batch.dtype == torch.int64 and tuple(batch.shape) == (2, BLOCK_SIZE)


def test_special_token_text_inside_a_document_is_not_a_separator(tokenizer):
    documents = [f"a document that quotes {EOS_TEXT} in its text", "a second document"]
    token_ids, lengths = tokenize_documents(documents, tokenizer)
    assert np.count_nonzero(token_ids == tokenizer.eos_token_id) == 2
    assert lengths.sum() == len(token_ids)
    assert token_ids[lengths[0] - 1] == token_ids[-1] == tokenizer.eos_token_id
    assert EOS_TEXT in tokenizer.decode(token_ids[: lengths[0] - 1].tolist())


def test_tokens_do_not_depend_on_the_batches(documents, tokenizer):
    reference = reference_stream(documents, tokenizer)
    for batch_chars in (1, 333, 10**9):
        batches = list(tokenize_stream(documents, tokenizer, batch_chars))
        assert np.array_equal(np.concatenate([ids for ids, _ in batches]), reference)
        # Each batch says where its documents end: just past each end-of-text.
        for token_ids, ends in batches:
            assert np.array_equal(np.flatnonzero(token_ids == tokenizer.eos_token_id) + 1, ends)
    token_ids, lengths = tokenize_documents(documents, tokenizer)
    assert np.array_equal(token_ids, reference)
    assert lengths.tolist() == [len(reference_stream([d], tokenizer)) for d in documents]


def test_a_long_document_is_tokenized_in_bounded_pieces_with_the_same_tokens(documents, tokenizer):
    """Rule 2: a document longer than PIECE_CHARS is cut before a space; the byte-level
    pre-tokenizer starts a word at its space, so the tokens are those of the uncut text. A cut
    without a space falls at the limit."""
    long_document = " ".join(documents)  # no newline, ~85,000 characters
    assert len(long_document) > PIECE_CHARS
    batches = list(tokenize_stream([long_document], tokenizer, batch_chars=PIECE_CHARS // 4))
    assert len(batches) > 1  # the tokenizer never saw the whole text at once
    token_ids = np.concatenate([ids for ids, _ in batches])
    assert np.array_equal(token_ids, reference_stream([long_document], tokenizer))
    assert [len(ends) for _, ends in batches] == [0] * (len(batches) - 1) + [1]
    without_spaces = "x" * (2 * PIECE_CHARS + 5)
    pieces = ["x" * PIECE_CHARS, "x" * PIECE_CHARS, "x" * 5]
    expected = [tokenizer(piece, add_special_tokens=False)["input_ids"] for piece in pieces]
    token_ids, _ = tokenize_documents([without_spaces], tokenizer)
    assert token_ids.tolist() == [*sum(expected, []), tokenizer.eos_token_id]


def test_blocks_do_not_depend_on_the_batches(built, corpus_args, tmp_path, monkeypatch):
    data_args, folder = built
    small_batches = functools.partial(tokenize_stream, batch_chars=100)
    monkeypatch.setattr("pretrain.blocks.packing.tokenize_stream", small_batches)
    other = prepare_blocks(corpus_args, data_args_for(data_args.tokenizer_dir, tmp_path))
    # How the text is batched is not part of the cache key: the same name, the same content.
    assert other.name == folder.name
    for split in ("train", "validation"):
        assert np.array_equal(
            block_array(load_blocks(other)[split]),
            block_array(load_blocks(folder)[split]),
        )


def test_pack_blocks_drops_only_the_tail():
    stream = np.arange(10, dtype=np.int32)
    blocks, num_dropped = pack_blocks(stream, 4)
    assert blocks.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert num_dropped == 2
    blocks, num_dropped = pack_blocks(stream, 5)
    assert blocks.shape == (2, 5) and num_dropped == 0


def test_unigram_entropy_in_nats():
    assert unigram_entropy(np.bincount([3, 3, 3], minlength=8)) == pytest.approx(0.0)
    assert unigram_entropy(np.bincount([0, 1, 2, 3] * 5, minlength=8)) == pytest.approx(math.log(4))


def test_stats_entropy_is_below_log_vocab(built):
    stats = read_stats(built[1])
    assert 0 < stats["unigram_entropy_nats"] < math.log(stats["vocab_size"])
    assert stats["tokens_per_document"] == pytest.approx(
        stats["num_tokens"] / stats["num_documents"]
    )


# --- split -----------------------------------------------------------------------------------


def test_split_is_by_document_text_and_stable(documents):
    lengths = np.full(len(documents), 50)

    def validation_mask(texts: list[str], seed: int) -> np.ndarray:
        hashes = document_hashes(texts, str(seed))
        return choose_validation_documents(hashes, lengths, 0.05, BLOCK_SIZE)

    mask = validation_mask(documents, seed=0)
    assert mask.sum() == math.ceil(0.05 * len(documents))
    assert np.array_equal(mask, validation_mask(documents, seed=0))
    # A document's split follows its text, not its position in the corpus.
    assert np.array_equal(validation_mask(documents[::-1], seed=0)[::-1], mask)
    assert not np.array_equal(validation_mask(documents, seed=1), mask)


def test_validation_gets_at_least_one_block(documents):
    lengths = np.full(len(documents), 10)
    # 0.1% of 400 documents is one document of 10 tokens: extended to fill a 64-token block.
    mask = choose_validation_documents(document_hashes(documents, "0"), lengths, 0.001, 64)
    assert lengths[mask].sum() >= 64
    assert lengths[mask].sum() - 10 < 64


# --- budget ----------------------------------------------------------------------------------


def test_budget_is_ceil_of_tokens_over_block_size():
    assert num_budget_blocks(12_000_000, 1024) == 11_719
    assert num_budget_blocks(1024, 1024) == 1
    assert num_budget_blocks(1025, 1024) == 2


def test_smaller_budget_is_a_prefix_of_a_larger_one():
    small = select_training_blocks(100, 10, seed=0)
    large = select_training_blocks(100, 60, seed=0)
    assert np.array_equal(small, large[:10])
    assert len(set(large.tolist())) == 60
    repeated = select_training_blocks(100, 250, seed=0)
    # Two whole passes, then half of a third shuffle.
    assert sorted(np.bincount(repeated, minlength=100).tolist()) == [2] * 50 + [3] * 50


def test_budget_keeps_exactly_ceil_blocks_of_the_packed_ones(built, corpus_args, tmp_path):
    data_args, folder = built
    all_blocks = block_array(load_blocks(folder)["train"])
    budget = 20 * BLOCK_SIZE + 1
    args = data_args_for(data_args.tokenizer_dir, tmp_path, max_train_tokens=budget)
    budgeted = load_blocks(prepare_blocks(corpus_args, args))
    train = block_array(budgeted["train"])
    assert len(train) == 21
    rows = {row.tobytes() for row in all_blocks}
    assert all(row.tobytes() in rows for row in train)
    assert len({row.tobytes() for row in train}) == 21
    # The validation split does not depend on the budget.
    assert np.array_equal(
        block_array(budgeted["validation"]),
        block_array(load_blocks(folder)["validation"]),
    )


def budget_argv(corpus_dir, tokenizer_dir, cache_dir, budget):
    return ["--corpus", str(corpus_dir), "--tokenizer_dir", str(tokenizer_dir),
            "--cache_dir", str(cache_dir), "--block_size", str(BLOCK_SIZE),
            "--max_train_tokens", str(budget)]  # fmt: skip


def test_a_split_a_little_short_of_the_budget_repeats_only_what_is_missing_in_one_line(
    built, tmp_path, tiny_tokenizer_dir, wos_corpus_dir, capsys, caplog
):
    num_train_tokens = read_stats(built[1])["splits"]["train"]["num_tokens"]
    budget = int(1.1 * num_train_tokens)
    argv = budget_argv(wos_corpus_dir, tiny_tokenizer_dir, tmp_path / "cache", budget)
    with caplog.at_level(logging.INFO, logger="pretrain.blocks.packing"):
        code, out, _ = run_main(argv, capsys)
    assert code == 0
    train = block_array(load_blocks(out.strip())["train"])
    num_packed = read_stats(out.strip())["splits"]["train"]["num_packed_blocks"]
    assert len(train) == num_budget_blocks(budget, BLOCK_SIZE) > num_packed
    (line,) = [message for message in caplog.messages if "repeating" in message]
    assert f"gives {num_packed * BLOCK_SIZE:,} of the budget's {len(train) * BLOCK_SIZE:,}" in line
    assert f"repeating {(len(train) - num_packed) * BLOCK_SIZE:,} of them" in line
    # Every packed block once, and only the missing ones a second time.
    counts = np.unique(train, axis=0, return_counts=True)[1]
    assert len(counts) == num_packed and sorted(set(counts)) == [1, 2]
    assert (counts == 2).sum() == len(train) - num_packed


def test_a_split_far_short_of_the_budget_is_an_error_unless_repeated(
    built, tmp_path, tiny_tokenizer_dir, wos_corpus_dir, capsys
):
    num_train_tokens = read_stats(built[1])["splits"]["train"]["num_tokens"]
    argv = budget_argv(
        wos_corpus_dir, tiny_tokenizer_dir, tmp_path / "cache", int(1.35 * num_train_tokens)
    )
    code, out, err = run_main(argv, capsys)
    assert code == 2 and out == ""
    (error,) = error_lines(err)
    assert f"{num_train_tokens:,} tokens" in error and "25% short" in error
    assert "--repeat_corpus" in error
    assert not any((tmp_path / "cache").glob("blocks-*"))


def test_a_corpus_far_too_small_is_refused_from_its_bytes_before_it_is_read_unless_repeated(
    built, tmp_path, tiny_tokenizer_dir, wos_corpus_dir, capsys, caplog
):
    num_train_tokens = read_stats(built[1])["splits"]["train"]["num_tokens"]
    budget = 3 * num_train_tokens
    argv = budget_argv(wos_corpus_dir, tiny_tokenizer_dir, tmp_path / "cache", budget)
    with caplog.at_level(logging.INFO, logger="common.corpus"):
        code, out, err = run_main(argv, capsys)
    assert code == 2 and out == ""
    (error,) = error_lines(err)
    (text_file,) = wos_corpus_dir.rglob("WOS46985/X.txt")  # the subset read by default
    num_bytes = text_file.stat().st_size
    assert f"holds {num_bytes:,} bytes" in error and "--repeat_corpus" in error
    assert not [message for message in caplog.messages if message.startswith("reading")]

    code, out, _ = run_main([*argv, "--repeat_corpus"], capsys)
    assert code == 0
    folder = out.strip()
    train = block_array(load_blocks(folder)["train"])
    assert len(train) == num_budget_blocks(budget, BLOCK_SIZE)
    stats = read_stats(folder)
    assert stats["splits"]["train"]["passes_over_packed_blocks"] > 2.9


# --- cache -----------------------------------------------------------------------------------


def test_a_cache_hit_loads_no_model_loss_or_tokenizer_library(built, corpus_args):
    """Block preparation stands apart from training: a cache hit imports neither the model,
    the loss, torch nor transformers' tokenizers and models (it needs the files' bytes only)."""
    data_args, folder = built
    argv = ["--corpus", *corpus_args.corpus, "--tokenizer_dir", data_args.tokenizer_dir,
            "--cache_dir", data_args.cache_dir, "--block_size", str(BLOCK_SIZE)]  # fmt: skip
    heavy = ("torch", "pretrain.model", "pretrain.loss", "transformers.modeling_utils",
             "transformers.tokenization_utils_base")  # fmt: skip
    code = (
        "import sys; from pretrain.prepare_blocks import main; "
        f"assert main({argv!r}) == 0; "
        f"print([name for name in {heavy!r} if name in sys.modules])"
    )
    finished = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    printed = finished.stdout.strip().splitlines()
    assert printed == [str(folder), "[]"]


def test_second_run_reuses_the_cache(built, corpus_args, caplog):
    data_args, folder = built
    before = file_mtimes(folder)
    with caplog.at_level(logging.INFO, logger="pretrain.blocks.cache"):
        again = prepare_blocks(corpus_args, data_args)
    assert again == folder
    assert file_mtimes(folder) == before
    assert any("reusing packed blocks" in record.message for record in caplog.records)
    assert not any("packed blocks saved" in record.message for record in caplog.records)


def test_changed_block_size_or_tokenizer_builds_a_new_cache(built, corpus_args, tmp_path):
    data_args, folder = built
    cache_dir = folder.parent
    bigger = data_args_for(data_args.tokenizer_dir, cache_dir, block_size=48)
    assert prepare_blocks(corpus_args, bigger) != folder

    changed_tokenizer = tmp_path / "tokenizer"
    shutil.copytree(data_args.tokenizer_dir, changed_tokenizer)
    config_path = changed_tokenizer / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["model_max_length"] = 512
    config_path.write_text(json.dumps(config))
    other = prepare_blocks(corpus_args, data_args_for(changed_tokenizer, cache_dir))
    assert other != folder and other.parent == folder.parent
    assert (
        read_stats(other)["tokenizer_files_sha256"] != read_stats(folder)["tokenizer_files_sha256"]
    )


def test_a_reindented_tokenizer_is_the_same_tokenizer(built, corpus_args, tmp_path):
    data_args, folder = built
    reindented = tmp_path / "tokenizer"
    shutil.copytree(data_args.tokenizer_dir, reindented)
    for path in reindented.glob("*.json"):
        path.write_text(json.dumps(json.loads(path.read_text()), indent=7, sort_keys=True))
    assert (reindented / "tokenizer.json").read_bytes() != (
        Path(data_args.tokenizer_dir) / "tokenizer.json"
    ).read_bytes()
    assert prepare_blocks(corpus_args, data_args_for(reindented, folder.parent)) == folder


def test_nul_bytes_in_the_text_are_kept_and_recorded(wos_corpus_dir, tiny_tokenizer_dir, tmp_path):
    lines = (wos_corpus_dir / "WOS46985" / "X.txt").read_text(encoding="utf-8").splitlines()
    corpus = write_lines(tmp_path / "nul.txt", [lines[0] + "\0\0", *lines[1:]])
    args = data_args_for(tiny_tokenizer_dir, tmp_path / "cache")
    stats = read_stats(prepare_blocks(CorpusArguments(corpus=[str(corpus)]), args))
    assert stats["num_nul_bytes"] == 2 and stats["num_documents"] == len(lines)


def test_interrupted_build_leaves_nothing_and_is_never_reused(
    built, corpus_args, tmp_path, monkeypatch, caplog
):
    data_args, _ = built
    args = data_args_for(data_args.tokenizer_dir, tmp_path)

    def interrupt(*_args, **_kwargs):
        raise KeyboardInterrupt

    # Interrupt after the Arrow files are written, before stats.json: the worst moment.
    monkeypatch.setattr("pretrain.blocks.packing.unigram_entropy", interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare_blocks(corpus_args, args)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    # A process killed outright leaves its temporary folder behind: it must be ignored.
    leftover = tmp_path / f".{built[1].name}.tmp-killed"
    leftover.mkdir()
    (leftover / "train.arrow").write_bytes(b"half a file")
    with caplog.at_level(logging.WARNING, logger="pretrain.blocks.cache"):
        folder = prepare_blocks(corpus_args, args)
    assert folder.name == built[1].name
    assert (folder / STATS_FILE).is_file()
    assert sorted(load_blocks(folder)) == ["train", "validation"]
    assert any("unfinished cache folder" in record.message for record in caplog.records)


# --- other tokenizers and bad input ----------------------------------------------------------


def save_gpt2_like_tokenizer(folder):
    """A byte-level tokenizer shaped like GPT-2's: 50,257 ids, eos = 50256, no pad."""
    byte_symbols = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(byte_symbols))}
    vocab.update({f"<unused{i}>": i for i in range(len(vocab), 50256)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.add_special_tokens([EOS_TEXT])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=EOS_TEXT, eos_token=EOS_TEXT, model_max_length=1024
    )
    tokenizer.save_pretrained(folder)
    return folder


def test_any_hf_tokenizer_folder_with_eos(corpus_args, tmp_path):
    tokenizer_dir = save_gpt2_like_tokenizer(tmp_path / "gpt2_like")
    args = data_args_for(tokenizer_dir, tmp_path / "cache", block_size=256)
    folder = prepare_blocks(corpus_args, args)
    stats = read_stats(folder)
    assert stats["vocab_size"] == 50257 and stats["eos_token_id"] == 50256
    train = block_array(load_blocks(folder)["train"])
    assert int(train.max()) == 50256
    assert int(train.min()) >= 0


def write_lines(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def save_tokenizer_without_eos(folder):
    backend = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "case",
    [
        "corpus_too_small",
        "one_long_document",
        "removed_option",
        "missing_tokenizer",
        "broken_tokenizer",
        "tokenizer_without_eos",
        "unwritable_cache",
        "missing_corpus",
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    case, wos_corpus_dir, tiny_tokenizer_dir, tmp_path, capsys
):
    corpus = str(wos_corpus_dir)
    tokenizer_dir = str(tiny_tokenizer_dir)
    cache_dir = tmp_path / "cache"
    extra = []
    expected = {
        "corpus_too_small": "too few for one training and one validation block",
        "one_long_document": "cannot be split by document",
        "removed_option": "unknown option --num_proc",
        "missing_tokenizer": "does not exist",
        "broken_tokenizer": "cannot be loaded",
        "tokenizer_without_eos": "no eos token",
        "unwritable_cache": "is not writable",
        "missing_corpus": "does not exist",
    }[case]
    if case == "corpus_too_small":
        corpus = str(write_lines(tmp_path / "small.txt", ["one short line", "another one"]))
    elif case == "one_long_document":
        # Tokens enough for many blocks, but the split is by document: said so, not "too few".
        corpus = str(write_lines(tmp_path / "long.txt", [" ".join(["a long document"] * 5000)]))
    elif case == "removed_option":
        # Tokenization uses every core by itself: a config that still sets it is refused.
        extra = ["--num_proc", "2"]
    elif case == "missing_tokenizer":
        tokenizer_dir = str(tmp_path / "no_such_tokenizer")
    elif case == "broken_tokenizer":
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "tokenizer.json").write_text("{not json")
        (broken / "tokenizer_config.json").write_text(
            '{"tokenizer_class": "PreTrainedTokenizerFast"}'
        )
        tokenizer_dir = str(broken)
    elif case == "tokenizer_without_eos":
        tokenizer_dir = str(save_tokenizer_without_eos(tmp_path / "no_eos"))
    elif case == "unwritable_cache":
        blocker = tmp_path / "a_file"
        blocker.write_text("not a folder")
        cache_dir = blocker / "cache"
    elif case == "missing_corpus":
        corpus = str(tmp_path / "no_such_corpus.txt")
    argv = ["--corpus", corpus, "--tokenizer_dir", tokenizer_dir, "--cache_dir", str(cache_dir)]
    code, out, err = run_main([*argv, *extra], capsys)
    assert code == 2 and out == ""
    errors = error_lines(err)
    assert len(errors) == 1 and expected in errors[0], err
    # Nothing half-written: no cache folder, finished or not.
    if cache_dir.is_dir():
        assert list(cache_dir.iterdir()) == []


def test_bad_settings_are_refused_when_the_arguments_are_parsed(tiny_tokenizer_dir, tmp_path):
    for flags, message in (
        (["--validation_fraction", "0"], "--validation_fraction is 0.0; give a number in (0, 1)"),
        (["--block_size", "1"], "--block_size is 1; give at least 2"),
        (["--max_train_tokens", "0"], "--max_train_tokens is 0; give 1 to 10**12 tokens"),
        (["--max_train_tokens", "2e12"], f"--max_train_tokens is {2 * 10**12}; give 1 to 10**12"),
    ):
        argv = ["--tokenizer_dir", str(tiny_tokenizer_dir), "--cache_dir", str(tmp_path), *flags]
        with pytest.raises(InputError, match=f"^{re.escape(message)}"):
            parse_args([DataArguments], argv)
    assert list(tmp_path.iterdir()) == []


# --- faults ----------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "emptied", "ids_overwritten"])
def test_a_damaged_cache_is_found_and_built_again(
    corpus_args, tiny_tokenizer_dir, tmp_path, damage
):
    data_args = data_args_for(tiny_tokenizer_dir, tmp_path / "cache")
    folder = prepare_blocks(corpus_args, data_args)
    good = block_array(load_blocks(folder)["train"])
    arrow = folder / "train.arrow"
    data = arrow.read_bytes()
    if damage == "truncated":
        arrow.write_bytes(data[: len(data) // 2])
    elif damage == "emptied":
        arrow.write_bytes(b"")
    else:  # in-range token ids over real ones: the file still loads, with the wrong blocks
        middle = len(data) // 2
        arrow.write_bytes(data[:middle] + bytes(8) + data[middle + 8 :])
    assert prepare_blocks(corpus_args, data_args) == folder
    assert np.array_equal(block_array(load_blocks(folder)["train"]), good)


def test_two_builds_of_one_cache_at_once_give_one_cache(corpus_args, tiny_tokenizer_dir, tmp_path):
    """Two processes prepare the same blocks at the same time: one builds, the other waits for
    it and reuses its cache; both print the same folder."""
    argv = ["--corpus", *corpus_args.corpus, "--tokenizer_dir", str(tiny_tokenizer_dir),
            "--cache_dir", str(tmp_path / "cache"), "--block_size", str(BLOCK_SIZE)]  # fmt: skip
    command = [sys.executable, "-m", "pretrain.prepare_blocks", *argv]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    processes = [
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    folders = {out.strip() for out, _ in outputs}
    assert len(folders) == 1
    logs = "".join(err for _, err in outputs)
    assert logs.count("packed blocks saved in") == 1 and logs.count("reusing packed blocks") == 1
    assert [
        path.name for path in (tmp_path / "cache").iterdir() if not path.name.startswith(".")
    ] == [Path(folders.pop()).name]


@pytest.mark.slow
def test_sigterm_while_preparing_stops_at_once_and_keeps_nothing(tiny_tokenizer_dir, tmp_path):
    """A SIGTERM to the command (a cancelled job) while it tokenizes: exit 128 + 15, one
    warning, no traceback, and no cache, not even the unfinished folder."""
    documents = (tmp_path / "corpus.txt").open("w", encoding="utf-8")
    with documents:  # enough text for tokenizing to last a while
        for index in range(200_000):
            documents.write(f"Document {index} describes result {index % 97} of study {index}.\n")
    cache_dir = tmp_path / "cache"
    argv = ["--corpus", str(tmp_path / "corpus.txt"), "--tokenizer_dir", str(tiny_tokenizer_dir),
            "--cache_dir", str(cache_dir)]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "pretrain.prepare_blocks", *argv],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    # The token stream being written into the unfinished folder: tokenizing is under way.
    while not any(path.stat().st_size for path in cache_dir.glob(".blocks-*.tmp-*/*.int32")):
        assert process.poll() is None and time.monotonic() < deadline, "tokenizing never started"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "Traceback" not in stderr
    assert "stopped by SIGTERM while preparing blocks; nothing was kept" in stderr
    # Nothing kept, not even the unfinished folder: at most the lock file the kernel released.
    assert [path.name for path in cache_dir.iterdir() if not path.name.endswith(".lock")] == []


@pytest.mark.system
@pytest.mark.parametrize(
    ("command", "disk_size"),
    [("prepare-blocks", "0"), ("prepare-blocks", "96k"), ("prepare-blocks", "200k"),
     ("prepare-blocks", "1m"),
     ("pretrain/run.py", "96k")],
)  # fmt: skip
def test_a_full_disk_while_packing_is_one_line_exit_3_and_nothing_kept(
    command, disk_size, wos_corpus_dir, tiny_tokenizer_dir, tmp_path
):
    """The cache folder on a real small disk, full from the start ("0": a 4 KiB tmpfs filled
    first), while the token stream is written (96k), while it is split (200k), while the
    blocks are written (1m: the budget repeats the corpus ten times over)."""
    with small_disk(tmp_path / "small_disk", "4k" if disk_size == "0" else disk_size) as disk:
        if disk_size == "0":
            with contextlib.suppress(OSError), (disk / "filler").open("wb") as filler:
                filler.write(bytes(1 << 20))
        cache_dir = disk / "cache"
        paths = {"corpus_dir": wos_corpus_dir, "tokenizer_dir": tiny_tokenizer_dir,
                 "cache_dir": cache_dir, "output_dir": tmp_path / "run"}  # fmt: skip
        if command == "prepare-blocks":
            argv = ["--corpus", str(wos_corpus_dir), "--tokenizer_dir", str(tiny_tokenizer_dir),
                    "--cache_dir", str(cache_dir), "--block_size", str(BLOCK_SIZE),
                    "--max_train_tokens", "400000", "--repeat_corpus"]  # fmt: skip
            full_command = [sys.executable, "-m", "pretrain.prepare_blocks", *argv]
        else:
            full_command = run_script_command(tiny_run_argv(**paths))
        finished = subprocess.run(
            full_command, env=subprocess_env(), capture_output=True, text=True
        )
        assert finished.returncode == 3, finished.stderr[-3000:]
        errors = [line for line in finished.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in finished.stderr, finished.stderr[-3000:]
        assert f"cannot write packed blocks in {cache_dir}: no space left on device (" in errors[0]
        assert "MiB free there, nothing kept" in errors[0]
        kept = [path.name for path in cache_dir.iterdir()] if cache_dir.exists() else []
        assert [name for name in kept if not name.endswith(".lock")] == []


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        "[]",
        '{"files": []}',
        '{"files": {"x": 1}}',
        '{"files": {}, "settings": []}',
        '{"files": {}, "corpus_fingerprint": 5}',
    ],
)
def test_a_block_cache_whose_stats_have_the_wrong_shape_is_damaged(tmp_path, text):
    (tmp_path / STATS_FILE).write_text(text)
    assert sealed_folder_damage(tmp_path, STATS_FILE, STATS_KEY_TYPES) == (
        f"its {STATS_FILE} is unreadable"
    )


def test_a_tokenizer_folder_with_its_own_code_never_runs_it(
    corpus_args, tiny_tokenizer_dir, tmp_path
):
    """A tokenizer_config.json with an auto_map names Python in the folder; transformers asks
    whether to run it, and `yes |` in a script answers. trust_remote_code=False: it never runs,
    and the folder is refused in one line."""
    folder = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config |= {
        "tokenizer_class": "OwnTokenizer",
        "auto_map": {"AutoTokenizer": [None, "own.OwnTokenizer"]},
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    marker = tmp_path / "marker"
    (folder / "own.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "class OwnTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    argv = ["--corpus", *corpus_args.corpus, "--tokenizer_dir", str(folder),
            "--cache_dir", str(tmp_path / "cache"), "--block_size", str(BLOCK_SIZE)]  # fmt: skip
    prepared = subprocess.run(
        [sys.executable, "-m", "pretrain.prepare_blocks", *argv],
        input="y\n" * 100,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert prepared.returncode == 2, prepared.stderr
    (error,) = prepared.stderr.splitlines()
    assert error.startswith(f"error: tokenizer folder {folder} cannot be loaded: ")
    assert "contains custom code" in error
    assert not marker.exists()
