"""`--config` precedence, unknown keys, and the one-line error contract."""

from dataclasses import dataclass, field

import pytest

from common.cli import InputError, entry_point, parse_args
from common.files import atomic_dir, write_json_atomic


@dataclass
class ExampleArguments:
    learning_rate: float = field(default=1.0e-3, metadata={"help": "Peak learning rate."})
    name: str = field(default="run", metadata={"help": "Run name."})
    data_dir: str = field(metadata={"help": "Where the data is."}, default=None)
    shuffle: bool = field(default=True, metadata={"help": "Shuffle the data."})


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


def test_unknown_flag_exits_2():
    with pytest.raises(SystemExit) as exc:
        parse_args([ExampleArguments], ["--no_such_flag", "1"])
    assert exc.value.code == 2


def test_entry_point_turns_input_error_into_exit_2(capsys):
    @entry_point
    def main(argv=None):
        raise InputError("data file x.bin is truncated; download it again")

    assert main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: data file x.bin is truncated; download it again"]


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
