"""`--config` precedence, unknown keys, the one-line error contract, and `--help`: short, by
dataclass, every option of ours in it; `--help-all` for the library's others."""

import dataclasses
import importlib
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Literal

import pytest
from pretrain_runs import REPO_ROOT, subprocess_env

from common.cli import CommandLineParser, InputError, entry_point, parse_args
from common.files import atomic_dir, write_json_atomic

EXAMPLES_DOC = """Train something small.

    python -m example --learning_rate 0.1        # a quick run
    python -m example --name long --shuffle false

Writes nothing.
"""


@dataclass
class ExampleArguments:
    learning_rate: float = field(default=1.0e-3, metadata={"help": "Peak learning rate."})
    name: str = field(default="run", metadata={"help": "Run name."})
    data_dir: str = field(metadata={"help": "Where the data is."}, default=None)
    shuffle: bool = field(default=True, metadata={"help": "Shuffle the data."})
    optimizer: Literal["adam", "sgd"] = field(
        default="adam",
        metadata={
            "help": "Which optimizer updates the weights: adam adapts a step size per "
            "parameter from running moments of the gradient, sgd takes plain gradient steps "
            "with momentum. Long help like this one is wrapped to the terminal width."
        },
    )


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_yaml_sets_defaults_and_flags_override(tmp_path):
    config = write(tmp_path, "c.yaml", "learning_rate: 6.0e-4\nname: from_yaml\n")
    (args,) = parse_args([ExampleArguments], ["--config", config, "--name", "from_cli"])
    assert args.learning_rate == pytest.approx(6.0e-4)
    assert args.name == "from_cli"


def test_yaml_turns_off_a_bool_that_defaults_to_true(tmp_path):
    config = write(tmp_path, "c.yaml", "shuffle: false\n")
    (args,) = parse_args([ExampleArguments], ["--config", config])
    assert args.shuffle is False
    (args,) = parse_args([ExampleArguments], ["--config", config, "--shuffle", "true"])
    assert args.shuffle is True


def test_json_config_is_accepted(tmp_path):
    config = write(tmp_path, "c.json", '{"learning_rate": 0.5}')
    (args,) = parse_args([ExampleArguments], ["--config", config])
    assert args.learning_rate == 0.5


def test_unknown_config_key_is_rejected_with_suggestion(tmp_path):
    config = write(tmp_path, "c.yaml", "learning_rte: 1.0\n")
    with pytest.raises(InputError, match="unknown option 'learning_rte'.*learning_rate"):
        parse_args([ExampleArguments], ["--config", config])


def test_mistyped_flag_names_the_closest_option():
    with pytest.raises(InputError) as err:
        parse_args([ExampleArguments], ["--learning_rte", "1e-3"])
    assert str(err.value) == (
        "unknown option --learning_rte (did you mean --learning_rate?); see --help"
    )


def test_mistyped_flag_is_named_before_the_required_option_it_leaves_missing():
    @dataclass
    class RequiredArguments:
        output_dir: str = field(metadata={"help": "Where to write."})

    with pytest.raises(
        InputError, match=r"^unknown option --ouput_dir \(did you mean --output_dir"
    ):
        parse_args([RequiredArguments], ["--ouput_dir", "x"])
    with pytest.raises(InputError, match=r"^the following arguments are required: --output_dir"):
        parse_args([RequiredArguments], [])


def test_unknown_flag_without_a_close_option_and_stray_values():
    with pytest.raises(InputError, match=r"^unknown option --zzz; see --help$"):
        parse_args([ExampleArguments], ["--zzz=3"])
    with pytest.raises(InputError, match=r"^unexpected argument stray; see --help$"):
        parse_args([ExampleArguments], ["stray"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--learning_rate", "abc"], "argument --learning_rate.*: invalid float value: 'abc'"),
        (["--optimizer", "rmsprop"], "argument --optimizer: invalid choice: 'rmsprop'"),
        (["--shuffle", "maybe"], "argument --shuffle.*got maybe"),
        (["--learning_rate"], "argument --learning_rate.*: expected one argument"),
    ],
)
def test_invalid_value_is_an_input_error_naming_the_flag(argv, message):
    with pytest.raises(InputError, match=f"^{message}.*; see --help$"):
        parse_args([ExampleArguments], argv)


def test_a_value_post_init_rejects_is_an_input_error(tmp_path):
    @dataclass
    class CheckedArguments:
        epochs: int = field(default=1, metadata={"help": "Passes over the data."})

        def __post_init__(self):
            if self.epochs < 1:
                raise ValueError(f"--epochs must be at least 1, got {self.epochs}")

    with pytest.raises(
        InputError, match=r"^invalid arguments: --epochs must be at least 1, got 0$"
    ):
        parse_args([CheckedArguments], ["--epochs", "0"])
    config = write(tmp_path, "c.yaml", "epochs: -1\n")
    with pytest.raises(InputError, match="got -1$"):
        parse_args([CheckedArguments], ["--config", config])


def test_invalid_value_in_the_config_file_is_an_input_error(tmp_path):
    config = write(tmp_path, "c.yaml", "optimizer: rmsprop\n")
    with pytest.raises(
        InputError, match="^--optimizer is 'rmsprop' in config file .*; give one of adam, sgd$"
    ):
        parse_args([ExampleArguments], ["--config", config])


@dataclass
class TypedArguments:
    learning_rate: float = field(default=1.0e-3, metadata={"help": "Peak learning rate."})
    batch_size: int = field(default=8, metadata={"help": "Blocks per step."})
    shuffle: bool = field(default=True, metadata={"help": "Shuffle the data."})
    corpus: list[str] = field(default_factory=list, metadata={"help": "Text files."})


def test_an_integer_is_written_in_full_or_with_a_scale_suffix_and_a_fraction_is_refused(tmp_path):
    (args,) = parse_args([TypedArguments], ["--batch_size", "12M"])
    assert args.batch_size == 12_000_000
    (args,) = parse_args([TypedArguments], ["--batch_size", "1.5k"])
    assert args.batch_size == 1500
    (args,) = parse_args(
        [TypedArguments], ["--config", write(tmp_path, "c.yaml", "batch_size: 2G")]
    )
    assert args.batch_size == 2 * 10**9
    for text in ("1.5", "12x", "nanM", "1.2345k"):
        with pytest.raises(InputError, match=f"--batch_size.*invalid integer value: '{text}'"):
            parse_args([TypedArguments], ["--batch_size", text])


def test_none_on_the_command_line_clears_a_config_s_number_where_the_option_takes_none(tmp_path):
    @dataclass
    class BudgetArguments:
        budget: int | None = field(default=None, metadata={"help": "Tokens; none: all."})
        steps: int = field(default=10, metadata={"help": "Steps."})

    config = write(tmp_path, "c.yaml", "budget: 12M\n")
    (args,) = parse_args([BudgetArguments], ["--config", config])
    assert args.budget == 12_000_000
    (args,) = parse_args([BudgetArguments], ["--config", config, "--budget", "none"])
    assert args.budget is None
    with pytest.raises(InputError, match="--steps: invalid integer value: 'none'"):
        parse_args([BudgetArguments], ["--steps", "none"])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("learning_rate: [1.0e-3]", "^--learning_rate is \\[0.001\\] in config .*; give a number$"),
        ("learning_rate: {peak: 1}", "^--learning_rate is \\{'peak': 1\\} in .*; give a number$"),
        ("batch_size: 4.5", "^--batch_size is 4.5 in config file .*; give an integer$"),
        ("batch_size: true", "^--batch_size is True in config file .*; give an integer$"),
        ("shuffle: 1", "^--shuffle is 1 in config file .*; give true or false$"),
        ("batch_size: null", "^--batch_size is null in config file .*; give an integer$"),
        ("learning_rate: .nan", "^--learning_rate is nan in config file .*; give a finite number$"),
        ("batch_size: 4\nbatch_size: 8", "YAML/JSON: the key 'batch_size' is given twice"),
    ],
)  # fmt: skip
def test_a_config_value_of_the_wrong_type_or_a_key_given_twice_is_an_input_error(
    tmp_path, line, message
):
    config = write(tmp_path, "c.yaml", line.replace("\\n", "\n") + "\n")
    with pytest.raises(InputError, match=message):
        parse_args([TypedArguments], ["--config", config])


def test_a_json_config_with_a_key_given_twice_is_an_input_error(tmp_path):
    config = write(tmp_path, "c.json", '{"batch_size": 4, "batch_size": 8}')
    with pytest.raises(InputError, match="the key 'batch_size' is given twice"):
        parse_args([TypedArguments], ["--config", config])
    config = write(tmp_path, "c.yaml", "learning_rate: 1\nbatch_size: '4'\ncorpus: [a, b]\n")
    (args,) = parse_args([TypedArguments], ["--config", config])
    assert (args.learning_rate, args.batch_size, args.corpus) == (1, 4, ["a", "b"])


def test_extra_arguments_come_back_in_a_namespace():
    # The report's positional run folders next to its option dataclass.
    parser = CommandLineParser([ExampleArguments], prog="report")
    parser.add_argument("run_dirs", nargs="+")
    args, extra = parser.parse_dataclasses(["a", "b", "--name", "x"])
    assert (args.name, extra.run_dirs) == ("x", ["a", "b"])
    with pytest.raises(InputError, match="did you mean --name"):
        parser.parse_dataclasses(["a", "--nmae", "x"])
    with pytest.raises(InputError, match="required: run_dirs"):
        parser.parse_dataclasses([])


def test_help_keeps_the_description_lines_and_wraps_option_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exc:
        parse_args([ExampleArguments], ["--help"], description=EXAMPLES_DOC, prog="example")
    assert exc.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    for example in EXAMPLES_DOC.splitlines():
        assert example in lines
    assert max(len(line) for line in lines) <= 80
    # The option help (over 200 characters) is wrapped into lines of at most 80, and whole.
    optimizer_help = ExampleArguments.__dataclass_fields__["optimizer"].metadata["help"]
    assert f"{optimizer_help} (default: adam)" in " ".join(" ".join(lines).split())


def project_options(dataclass_types, library_options):
    """Every option our dataclasses declare (a field of ours, or one we redefine), then the
    library options that --help is to name."""
    from transformers import TrainingArguments

    library_fields = TrainingArguments.__dataclass_fields__
    ours = [
        field.name
        for dtype in dataclass_types
        for field in dataclasses.fields(dtype)
        if field.init and field is not library_fields.get(field.name)
    ]
    return ours + list(library_options)


def read_help(parse, argv, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 0
    return capsys.readouterr().out


def pretrain_help_case():

    from common.corpus import CorpusArguments
    from pretrain.args import ModelArguments, PretrainTrainingArguments, ReportArguments
    from pretrain.blocks.args import DataArguments
    from pretrain.run import parse_pretrain_args

    ours = [ModelArguments, CorpusArguments, DataArguments, ReportArguments]
    return parse_pretrain_args, project_options(
        [*ours, PretrainTrainingArguments], PretrainTrainingArguments.brief_help_fields
    )


def probe_help_case():
    from common.corpus import CorpusArguments
    from probe.args import ProbeArguments, ProbeTrainingArguments
    from probe.run import parse_probe_args

    ours = [ProbeArguments, CorpusArguments, ProbeTrainingArguments]
    return parse_probe_args, project_options(ours, ProbeTrainingArguments.brief_help_fields)


HELP_CASES = {"pretrain": pretrain_help_case, "probe": probe_help_case}
# An option of TrainingArguments that neither command uses.
HIDDEN_OPTION = "--label_smoothing_factor"


@pytest.mark.parametrize("case", HELP_CASES.values(), ids=HELP_CASES.keys())
def test_help_is_short_and_names_every_project_option(case, capsys, monkeypatch):
    parse, options = case()
    text = read_help(parse, ["--help"], capsys, monkeypatch)
    assert len(text.splitlines()) < 180  # pretrain/run.py: 171
    assert [name for name in options if not re.search(rf"--{name}\b", text)] == []
    assert HIDDEN_OPTION not in text
    # Each option has one line of its own in the help.
    assert "--model-preset" not in text and "--label-level" not in text


@pytest.mark.parametrize("case", HELP_CASES.values(), ids=HELP_CASES.keys())
def test_help_all_explains_the_options_help_leaves_out(case, capsys, monkeypatch):
    parse, options = case()
    text = read_help(parse, ["--help-all"], capsys, monkeypatch)
    assert len(text.splitlines()) > 500
    assert "label smoothing" in " ".join(text.split()).lower()
    assert [name for name in options if f"--{name} " not in text] == []


# Every command whose options a CommandLineParser reads: [project.scripts] (launch-pretraining,
# accelerate's parser, aside), pretrain/run.py and its model-parallel loop, bench/ and tests/.
HELP_COMMANDS = {
    "train-tokenizer": "tokenizer.train",
    "prepare-blocks": "pretrain.prepare_blocks",
    "generate-text": "pretrain.generate",
    "train-mnist": "mnist.train",
    "train-mnist-lightning": "mnist.train_lightning",
    "run-report": "report.__main__",
    "probe-classifier": "probe.run",
    "write-demo-corpus": "common.demo_corpus",
    "compare-parallelism": "bench.compare_parallelism",
    "check-gpu": "pretrain.check_gpu",
    "pretrain/run.py": "pretrain.run",
    "pretrain/run_model_parallel.py": "pretrain.run_model_parallel",
    "bench.compare_recipes": "bench.compare_recipes",
    "bench.docstring_corpus": "bench.docstring_corpus",
    "bench.gpu_ablation": "bench.gpu_ablation",
    "tests/labelled_wos.py": "labelled_wos",
}


def help_sections(text):
    """The options listed under each titled section of a --help text, after its description."""
    sections, title = {}, None
    for block in text.split("\n\n"):
        lines = block.splitlines()
        if lines and lines[0].endswith(":") and not lines[0][0].isspace():
            title, lines = lines[0][:-1], lines[1:]
            sections[title] = []
        if title and lines and lines[0].startswith("  -"):  # options, not a description
            sections[title] += [line.split()[0].rstrip(",") for line in lines if line[:3] == "  -"]
    return sections


def command_help(module, argv, capsys, monkeypatch):
    """The help text of `module`'s main and the parser that printed it."""
    parsers = []
    parse = CommandLineParser.parse_dataclasses

    def recorded(self, args=None):
        parsers.append(self)
        return parse(self, args)

    monkeypatch.setattr(CommandLineParser, "parse_dataclasses", recorded)
    text = read_help(importlib.import_module(module).main, argv, capsys, monkeypatch)
    return text, parsers[-1]


@pytest.mark.parametrize("module", HELP_COMMANDS.values(), ids=HELP_COMMANDS.keys())
def test_help_of_every_command_is_a_short_group_per_dataclass(module, capsys, monkeypatch):
    """--help: `options` (-h, --config, --help-all where a library's options are left out),
    then a group per dataclass listing exactly the options it declares, in order; --help-all
    adds a library's (TrainingArguments') to its group."""
    from transformers import TrainingArguments

    text, parser = command_help(module, ["--help"], capsys, monkeypatch)
    library = set(dataclasses.fields(TrainingArguments))
    fields = {
        dtype.__name__: [f for f in dataclasses.fields(dtype) if f.init]
        for dtype in parser.dataclass_types
    }
    ours = {
        title: [f"--{f.name}" for f in found if f not in library] for title, found in fields.items()
    }
    inherits = any(f in library for found in fields.values() for f in found)
    sections = help_sections(text)
    assert sections["options"] == ["-h", "--config", *["--help-all"] * inherits]
    assert [title for title in sections if title in ours] == [t for t in ours if ours[t]]
    assert {title: sections.get(title, []) for title in ours} == ours
    assert len(text.splitlines()) < 30 + 5 * sum(map(len, ours.values()))
    if inherits:
        text, _ = command_help(module, ["--help-all"], capsys, monkeypatch)
        sections = help_sections(text)
        for title, found in fields.items():
            listed = [option for option in sections[title] if not option.startswith("--no_")]
            assert listed == [f"--{f.name}" for f in found]


def test_help_under_a_config_shows_the_config_s_values_of_the_library_s_options(
    capsys, monkeypatch
):
    from pretrain.run import main

    tiny = str(REPO_ROOT / "pretrain" / "configs" / "tiny.yaml")
    default = " ".join(read_help(main, ["--help"], capsys, monkeypatch).split())
    configured = " ".join(
        read_help(main, ["--config", tiny, "--help"], capsys, monkeypatch).split()
    )
    assert "--learning_rate=5e-05," in default  # TrainingArguments' own
    assert "--learning_rate=0.001," in configured and "--learning_rate=5e-05" not in configured


def test_options_left_out_of_help_parse_as_before(capsys):
    from pretrain.run import main, parse_pretrain_args

    required = ["--corpus", "c.txt", "--tokenizer_dir", "tok"]
    args = parse_pretrain_args([*required, HIDDEN_OPTION, "0.1", "--dataloader-drop-last", "true"])
    assert args.training.label_smoothing_factor == 0.1
    assert args.training.dataloader_drop_last is True
    assert main([*required, "--label_smoothing_facter", "0.1"]) == 2
    assert capsys.readouterr().err == (
        "error: unknown option --label_smoothing_facter (did you mean --label_smoothing_factor?);"
        " see --help\n"
    )


def test_entry_point_turns_input_error_into_exit_2(capsys):
    @entry_point
    def main(argv=None):
        raise InputError("data file x.bin is truncated; download it again")

    assert main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: data file x.bin is truncated; download it again"]


def test_ctrl_c_is_one_line_exit_130_and_leaves_nothing_half_written(tmp_path, capsys):
    @entry_point
    def main(argv=None):
        with atomic_dir(tmp_path / "out") as unfinished:
            (unfinished / "part.txt").write_text("half")
            signal.raise_signal(signal.SIGINT)  # Ctrl-C: Python's handler raises KeyboardInterrupt

    # Python installs that handler only where SIGINT was not ignored when it started: a script's
    # background job (`make test &`) starts with it ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main([]) == 128 + signal.SIGINT
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().err.splitlines() == [
        "error: interrupted (SIGINT); nothing unfinished was kept"
    ]
    assert list(tmp_path.iterdir()) == []


def test_entry_point_prints_a_multi_line_message_on_one_line(capsys):
    @entry_point
    def main(argv=None):
        raise InputError("invalid TrainingArguments: the value\n  must be positive")

    assert main([]) == 2
    assert (
        capsys.readouterr().err == "error: invalid TrainingArguments: the value must be positive\n"
    )


# (command, a mistyped flag, the option it should suggest); run as a user would, so that import
# warnings or log lines before the error would show.
COMMANDS = {
    "pretrain": (["pretrain/run.py"], "--learning_rte", "--learning_rate"),
    "tokenizer": (["-m", "tokenizer.train"], "--vocab_sise", "--vocab_size"),
    "mnist": (["-m", "mnist.train"], "--epoks", "--epochs"),
}


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_command_with_a_typo_prints_one_line_with_a_suggestion(command):
    argv, typo, suggestion = command
    result = subprocess.run(
        [sys.executable, *argv, typo, "1"],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert (
        result.stderr == f"error: unknown option {typo} (did you mean {suggestion}?); see --help\n"
    )
    assert result.stdout == ""


ENTRY_MODULES = [
    "common.demo_corpus",
    "tokenizer.train",
    "pretrain.prepare_blocks",
    "pretrain.run",
    "pretrain.generate",
    "mnist.train",
    "mnist.train_lightning",
]


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_every_entry_point_reports_a_typo_in_one_line(module, capsys):
    main = importlib.import_module(module).main
    assert main(["--confg", "c.yaml"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "error: unknown option --confg (did you mean --config?); see --help\n"
    assert captured.out == ""


def test_report_with_its_own_parser_reports_a_typo_in_one_line(capsys):
    from report.__main__ import main

    assert main(["runs/x", "--ovewrite"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.err == "error: unknown option --ovewrite (did you mean --overwrite?); see --help\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num_train_epochs", "x"], "argument --num_train_epochs.*: invalid float value: 'x'"),
        (
            ["--lr_scheduler_type", "steep"],
            "argument --lr_scheduler_type.*: invalid choice: 'steep' \\(choose from 'linear', ",
        ),
    ],
)
def test_pretrain_invalid_value_is_one_line(argv, message, capsys):
    from pretrain.run import main

    assert main(argv) == 2
    assert re.fullmatch(f"error: {message}.*; see --help\n", capsys.readouterr().err)


PRETRAIN_REQUIRED = ["--corpus", "c.txt", "--tokenizer_dir", "tok"]
WSD = [*PRETRAIN_REQUIRED, "--lr_scheduler_type", "warmup_stable_decay", "--lr_scheduler_kwargs"]
DECAY_RULE = "give a whole number of steps or a share of the steps in (0, 1), e.g. 0.65"
DECAY_STEPS = "--lr_scheduler_kwargs num_decay_steps"


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        ("pretrain.run", [*PRETRAIN_REQUIRED, "--muon_learning_rate", "nan"],
         "--muon_learning_rate is nan; give a finite number"),
        ("pretrain.run", [*PRETRAIN_REQUIRED, "--learning_rate=-inf"],
         "--learning_rate is -inf; give a finite number"),
        ("pretrain.run", [*PRETRAIN_REQUIRED, "--adam_beta2", "1"],
         "--adam_beta2 is 1.0; give a number in [0, 1)"),
        ("pretrain.run", [*WSD, '{"num_decay_steps": NaN}'],
         f"{DECAY_STEPS} is nan; give a finite number"),
        ("pretrain.run", [*WSD, '{"num_decay_steps": "abc"}'],
         f"{DECAY_STEPS} is 'abc'; {DECAY_RULE}"),
        ("pretrain.run", [*WSD, '{"num_decay_steps": 1.5}'],
         f"{DECAY_STEPS} is 1.5; {DECAY_RULE}"),
        ("pretrain.run", [*WSD, '{"num_decay_steps": -0.1}'],
         f"{DECAY_STEPS} is -0.1; {DECAY_RULE}"),
        ("pretrain.run", [*WSD, '{"min_lr_ratio": 1.5}'],
         "--lr_scheduler_kwargs min_lr_ratio is 1.5; give a number in [0, 1]"),
        ("pretrain.run", [*PRETRAIN_REQUIRED, "--max_train_tokens", "1e30"],
         f"--max_train_tokens is {10**30}; give 1 to 10**12 tokens"),
        ("pretrain.run", [*PRETRAIN_REQUIRED, "--dropout", "1"],
         "--dropout is 1.0; give a number in [0, 1)"),
        ("pretrain.run", [*PRETRAIN_REQUIRED, "--muon_momentum", "1"],
         "--muon_momentum is 1.0; give a number in [0, 1)"),
        ("pretrain.run", [*PRETRAIN_REQUIRED, "--embedding_learning_rate=-0.1"],
         "--embedding_learning_rate is -0.1; give a number >= 0"),
        ("tokenizer.train", ["--corpus", "c", "--output_dir", "t", "--heldout_every", "1"],
         "--heldout_every is 1; give 0 or at least 2"),
        ("pretrain.generate", ["--run_dir", "r", "--top_k", "0"], "--top_k is 0; give at least 1"),
        ("probe.run", ["--run_dir", "r", "--corpus", "c", "--test_fraction", "1"],
         "--test_fraction is 1.0; give a number in (0, 1)"),
        ("mnist.train", ["--max_steps", "0"], "--max_steps is 0; give at least 1, or -1"),
        ("probe.run", ["--run_dir", "r", "--corpus", "c", "--weight_decay", "-1"],
         "--weight_decay is -1.0; give a number >= 0"),
        ("mnist.train", ["--momentum", "1.5"], "--momentum is 1.5; give a number in [0, 1)"),
        ("pretrain.generate", ["--run_dir", "r", "--temperature", "inf"],
         "--temperature is inf; give a finite number"),
    ],
)  # fmt: skip
def test_a_number_not_finite_or_out_of_its_range_is_refused_naming_its_option(
    module, argv, message, capsys
):
    assert importlib.import_module(module).main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_a_range_is_checked_in_a_config_file_as_on_the_command_line(tmp_path, capsys):
    from pretrain.run import main, parse_pretrain_args

    config = write(tmp_path, "c.yaml", "lr_scheduler_kwargs: {num_decay_steps: 2.5}\n")
    assert main([*PRETRAIN_REQUIRED, "--config", config]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {DECAY_STEPS} is 2.5 in config file {config}; {DECAY_RULE}\n"
    )
    config = write(tmp_path, "d.yaml", "learning_rate: 0\n")
    assert main([*PRETRAIN_REQUIRED, "--config", config]) == 2
    assert capsys.readouterr().err.startswith("error: --learning_rate is 0 in config file ")
    args = parse_pretrain_args([*PRETRAIN_REQUIRED, "--config", config, "--learning_rate", "0.1"])
    assert args.training.learning_rate == 0.1  # the flag wins over the file's value


def test_a_mistyped_flag_is_answered_with_an_option_help_names_a_prefix_first(capsys):
    from pretrain.run import main

    assert main([*PRETRAIN_REQUIRED, "--max_train", "12M"]) == 2
    assert capsys.readouterr().err == (
        "error: unknown option --max_train (did you mean --max_train_tokens?); see --help\n"
    )
    assert main([*PRETRAIN_REQUIRED, "--learning_rte", "0.1"]) == 2
    assert "(did you mean --learning_rate?)" in capsys.readouterr().err


def test_a_config_that_is_a_folder_is_named_as_one(tmp_path):
    with pytest.raises(InputError, match=f"^config file {tmp_path} is a folder; pass a YAML or"):
        parse_args([ExampleArguments], ["--config", str(tmp_path)])


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "half.txt").write_text("x")
        raise RuntimeError("interrupted")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_refuses_existing_unless_overwrite(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(InputError, match="--overwrite"), atomic_dir(target):
        pass
    with atomic_dir(target, overwrite=True) as tmp:
        write_json_atomic(tmp / "a.json", {"ok": True})
    assert (target / "a.json").read_text().startswith("{")


@pytest.mark.parametrize("package", ["mnist", "tokenizer", "pretrain", "report", "probe", "bench"])
def test_ctrl_c_while_a_command_still_imports_is_one_line_and_exit_130(package):
    """Every package's first import sets the hook, before torch and the others import."""
    interrupted = f"import {package}; raise KeyboardInterrupt"  # as Ctrl-C raises it mid-import
    result = subprocess.run(
        [sys.executable, "-c", interrupted], capture_output=True, text=True, env=subprocess_env()
    )
    assert result.returncode == 130
    assert result.stderr == "error: interrupted (SIGINT) while starting; nothing was written\n"
