"""The GPU benchmark's pieces, checked on CPU: its corpus builder and its run orchestration.

bench/ holds scripts, not a package, so they are loaded from their files.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


def load_bench_script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


PACKAGE_SOURCE = '''"""Tools to measure how fast a model learns from a stream of scientific text.

Parameters
----------
rate : float
    The learning rate.

>>> measure(rate=0.1)
0.5
"""


def measure(rate):
    """Return the loss after one pass over the corpus at the given learning rate, in nats."""


def short():
    """Too short to count."""
'''


def test_docstring_corpus_keeps_prose_and_drops_sections_examples_and_duplicates(tmp_path):
    docstring_corpus = load_bench_script("docstring_corpus")
    package = tmp_path / "site" / "pkg"
    package.mkdir(parents=True)
    (package / "a.py").write_text(PACKAGE_SOURCE)
    (package / "b.py").write_text(PACKAGE_SOURCE)  # the same docstrings again: kept once

    path, num_documents, _ = docstring_corpus.write_docstring_corpus(
        docstring_corpus.DocstringCorpusArguments(
            output_dir=str(tmp_path / "corpus"), package_roots=[str(tmp_path / "site")], num_proc=1
        )
    )
    documents = path.read_text().splitlines()
    assert num_documents == len(documents) == 2
    assert documents[0].startswith("Tools to measure how fast a model learns")
    assert documents[0].endswith("scientific text.")  # the Parameters section is not appended
    assert documents[1].startswith("Return the loss after one pass")
    assert not any("learning rate." in d or ">>>" in d for d in documents)


def test_docstring_corpus_refuses_a_missing_package_root(tmp_path):
    from common.cli import InputError

    docstring_corpus = load_bench_script("docstring_corpus")
    with pytest.raises(InputError, match="do not exist"):
        docstring_corpus.write_docstring_corpus(
            docstring_corpus.DocstringCorpusArguments(
                output_dir=str(tmp_path / "corpus"), package_roots=[str(tmp_path / "missing")]
            )
        )


@pytest.mark.multiprocess
def test_gpu_ablation_dry_run_runs_the_shipped_config_and_tabulates(
    wos_corpus_dir, tiny_tokenizer_dir, tmp_path
):
    """The GPU script's run stage on CPU: the course config (compiled, chunked loss) for its
    whole small budget and an eager variant for 2 steps, read back into one table."""
    import json

    from common.run_contract import GPT_SUMMARY_FILE

    gpu_ablation = load_bench_script("gpu_ablation")
    output_dir = tmp_path / "runs"
    exit_code = gpu_ablation.main(
        [
            *("--corpus", str(wos_corpus_dir), "--tokenizer_dir", str(tiny_tokenizer_dir)),
            *("--cache_dir", str(tmp_path / "cache"), "--output_dir", str(output_dir)),
            *("--max_train_tokens", "2048", "--ablation_steps", "2"),
            *("--variants", "main", "eager", "--dry_run"),
        ]
    )
    assert exit_code == 0
    main_run = json.loads((output_dir / "main" / GPT_SUMMARY_FILE).read_text())
    eager_run = json.loads((output_dir / "eager" / GPT_SUMMARY_FILE).read_text())
    assert main_run["speed_settings"]["loss_implementation"] == "chunked"
    assert main_run["speed_settings"]["compile"] and main_run["speed_settings"]["compile_regions"]
    assert main_run["config"]["TrainingArguments"]["logging_nan_inf_filter"] is False
    assert not eager_run["speed_settings"]["compile"]
    assert main_run["tokens_trained"] == 2048 and eager_run["global_step"] == 2
    assert 0 < main_run["first_step_seconds"] < main_run["train_loop_seconds"]
    assert main_run["peak_memory_source"] == "process_max_rss"  # CPU

    header, rule, *rows = (output_dir / "table.md").read_text().splitlines()
    assert [row.split("|")[1].strip() for row in rows] == ["main", "eager"]
    columns = [cell.strip() for cell in header.split("|")]
    main_cells = [cell.strip() for cell in rows[0].split("|")]
    assert main_cells[columns.index("tokens")] == "2,048"
    assert float(main_cells[columns.index("tokens/s")].replace(",", "")) > 0
