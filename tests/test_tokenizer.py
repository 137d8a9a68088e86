"""Byte-level BPE invariants (minbpe style) and the `train-tokenizer` command."""

import json
import re
import subprocess
import sys
import zipfile

import pytest
from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tokenizer.bpe import END_OF_TEXT, PAD
from tokenizer.train import main

LONG_ABSTRACT = (
    "The rapid development of deep convolutional neural networks has enabled accurate "
    "segmentation of medical images; however, annotated data remain scarce. We propose a "
    "semi-supervised framework (SSF-Net) that combines consistency regularisation with "
    "pseudo-labelling, achieving a Dice score of 0.913 +/- 0.012 on 1,024 MRI scans. "
) * 20
# Strings unlike the training text: scripts, symbols and bytes the tokenizer never saw.
TRICKY_STRINGS = [
    "",
    "?",
    "hello world",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nand\u2028separators",
    "深度学习模型在自然语言处理中的应用",
    "日本語のテキスト、한국어 텍스트",
    "emoji 🚀🔥 and a family 👨‍👩‍👧‍👦 with joiners",
    "∀ε>0 ∃δ>0: |x−y|<δ ⇒ |f(x)−f(y)|<ε, ∑ᵢ xᵢ² ≤ ∞, ℝⁿ",
    "control bytes \x00\x01\x1f\x7f and a lone combining mark \u0301",
    "مرحبا بالعالم — Ελληνικά — हिन्दी",
    "<|endoftext|> literal special tokens <pad> inside text",
    LONG_ABSTRACT,
]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_tokenizer_dir):
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.mark.parametrize("text", TRICKY_STRINGS, ids=range(len(TRICKY_STRINGS)))
def test_encode_decode_identity(hf_tokenizer, text):
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert all(0 <= i < len(hf_tokenizer) for i in ids)
    assert hf_tokenizer.decode(ids) == text


def test_every_byte_is_in_the_vocabulary(hf_tokenizer):
    vocab = hf_tokenizer.get_vocab()
    assert set(pre_tokenizers.ByteLevel.alphabet()) <= set(vocab)
    assert hf_tokenizer.unk_token is None


def test_saved_folder_settings(hf_tokenizer, tiny_tokenizer_dir):
    assert isinstance(hf_tokenizer, PreTrainedTokenizerFast)
    assert len(hf_tokenizer) == 512
    assert hf_tokenizer.model_max_length == 1024
    assert hf_tokenizer.bos_token == hf_tokenizer.eos_token == END_OF_TEXT
    assert hf_tokenizer.pad_token == PAD
    # Special tokens come first, so their ids do not depend on the corpus or vocabulary size.
    assert (hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id) == (0, 1)
    # GPT-2 adds no special tokens by itself; the data stage inserts end-of-text between documents.
    assert (
        hf_tokenizer("a b")["input_ids"]
        == hf_tokenizer("a b", add_special_tokens=False)["input_ids"]
    )


def test_compression_and_stats(tiny_tokenizer_dir, hf_tokenizer):
    stats = json.loads((tiny_tokenizer_dir / "stats.json").read_text())
    assert stats["num_documents"] == 400
    assert stats["num_duplicates"] == 0
    assert stats["heldout"]["num_documents"] == 4  # every 100th of 400
    assert stats["num_training_documents"] == 396
    assert stats["num_training_bytes"] == stats["num_bytes"] - stats["heldout"]["num_bytes"] > 0
    assert stats["num_nul_bytes"] == 0  # every count of the corpus reader is recorded
    assert stats["vocab_size"] == 512
    # Merges learned on English make English text shorter than one token per byte.
    assert stats["heldout"]["bytes_per_token"] > 2.0
    assert stats["training_seconds"] > 0
    tokens = hf_tokenizer("the statement is executed", add_special_tokens=False)["input_ids"]
    assert len(tokens) < len("the statement is executed") / 2


def test_saved_folder_reloads_equal(hf_tokenizer, tiny_tokenizer_dir, tmp_path):
    hf_tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").read_bytes() == (
        tiny_tokenizer_dir / "tokenizer.json"
    ).read_bytes()
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    raw = Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    for text in TRICKY_STRINGS:
        expected = hf_tokenizer(text)["input_ids"]
        assert reloaded(text)["input_ids"] == expected
        assert raw.encode(text).ids == expected


def test_same_input_gives_byte_identical_tokenizer_json(wos_corpus_dir, tmp_path):
    common = ["--corpus", str(wos_corpus_dir), "--vocab_size", "700"]
    assert main([*common, "--output_dir", str(tmp_path / "a")]) == 0
    assert main([*common, "--output_dir", str(tmp_path / "b")]) == 0
    first = (tmp_path / "a" / "tokenizer.json").read_bytes()
    assert first == (tmp_path / "b" / "tokenizer.json").read_bytes()
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert len(reloaded) == 700
    assert (reloaded.eos_token_id, reloaded.pad_token_id) == (0, 1)


def test_overwrite_replaces_an_existing_folder(wos_corpus_dir, tmp_path):
    output_dir = tmp_path / "tok"
    args = ["--corpus", str(wos_corpus_dir), "--vocab_size", "300", "--output_dir", str(output_dir)]
    assert main(args) == 0
    assert main([*args, "--vocab_size", "320", "--overwrite"]) == 0
    assert len(AutoTokenizer.from_pretrained(output_dir)) == 320
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]


def bad_inputs(tmp_path, wos_corpus_dir):
    """(extra arguments, expected message) for every kind of bad input."""
    no_text_zip = tmp_path / "WebOfScience.zip"
    with zipfile.ZipFile(no_text_zip, "w") as archive:
        archive.writestr("Meta-data/Data.xlsx", b"no abstracts")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    invalid = tmp_path / "invalid.txt"
    invalid.write_bytes(b"fine\n\xc3\x28 broken\n")
    existing = tmp_path / "existing"
    existing.mkdir()
    corpus = ["--corpus", str(wos_corpus_dir)]
    return [
        (["--corpus", str(tmp_path / "missing.zip")], "missing.zip does not exist"),
        (["--corpus", str(no_text_zip)], "holds no X.txt"),
        (["--corpus", str(blank)], "no non-empty documents"),
        (["--corpus", str(invalid)], "invalid.txt line 2: invalid UTF-8"),
        ([*corpus, "--subset", "WOS1"], "available: WOS11967, WOS46985, WOS5736"),
        ([*corpus, "--vocab_size", "257"], "give at least 258"),
        ([*corpus, "--output_dir", str(existing)], "already exists; pass --overwrite"),
    ]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(wos_corpus_dir, tmp_path, capsys):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    for extra, message in bad_inputs(inputs, wos_corpus_dir):
        argv = ["--output_dir", str(outputs / "tok"), *extra]
        assert main(argv) == 2, extra
        error_lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
        assert len(error_lines) == 1 and message in error_lines[0], (extra, error_lines)
        assert list(outputs.iterdir()) == [], extra
    assert list((inputs / "existing").iterdir()) == []


def test_invalid_bytes_can_be_replaced(tmp_path):
    corpus = tmp_path / "invalid.txt"
    corpus.write_bytes(b"fine text here\n\xc3\x28 broken\n")
    output_dir = tmp_path / "tok"
    argv = ["--corpus", str(corpus), "--output_dir", str(output_dir), "--vocab_size", "300"]
    assert main([*argv, "--replace_invalid_utf8"]) == 0
    assert json.loads((output_dir / "stats.json").read_text())["num_documents"] == 2


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--corpus", "--subset", "--text_field", "--replace_invalid_utf8"):
        assert option in text
    for option in ("--vocab_size", "--output_dir", "--heldout_every", "--overwrite", "--config"):
        assert option in text
    # The docstring's example command keeps its own line.
    example = "    train-tokenizer --corpus data/WebOfScience.zip --output_dir runs/tokenizer"
    assert example in text.splitlines()


@pytest.mark.slow
def test_command_in_a_new_process_gives_the_same_tokenizer(wos_corpus_dir, tmp_path):
    """Another process (other hash seeds, thread timings) learns the identical tokenizer.json."""
    argv = ["--corpus", str(wos_corpus_dir), "--vocab_size", "600"]
    assert main([*argv, "--output_dir", str(tmp_path / "here")]) == 0
    result = subprocess.run(
        [sys.executable, "-m", "tokenizer.train", *argv, "--output_dir", str(tmp_path / "there")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    # stdout carries only the result, so `dir=$(train-tokenizer ...)` works.
    assert result.stdout == f"{tmp_path / 'there'}\n"
    assert (tmp_path / "here" / "tokenizer.json").read_bytes() == (
        tmp_path / "there" / "tokenizer.json"
    ).read_bytes()


@pytest.mark.slow
def test_command_log_holds_only_lines_worth_reading(wos_corpus_dir, tmp_path):
    """Each log line once, no warnings, no blank progress-bar lines, and no "sequence length is
    longer than the specified maximum" from measuring documents longer than the context."""
    output_dir = tmp_path / "tok"
    argv = ["--corpus", str(wos_corpus_dir), "--vocab_size", "600", "--model_max_length", "16"]
    result = subprocess.run(
        [sys.executable, "-m", "tokenizer.train", *argv, "--output_dir", str(output_dir)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    heldout = json.loads((output_dir / "stats.json").read_text())["heldout"]
    assert heldout["num_tokens"] > 16 * heldout["num_documents"]  # longer than the context
    lines = result.stderr.splitlines()
    messages = [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in lines]
    assert all(re.match(r"INFO [\w.]+: \S", message) for message in messages), lines
    assert len(set(messages)) == len(messages), lines
    assert "sequence length" not in result.stderr
