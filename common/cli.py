"""Command-line plumbing shared by every entry point.

Every entry point is `main(argv: list[str] | None = None) -> int`, decorated with
`entry_point`, and parses its options with `parse_args`: dataclasses read by
`HfArgumentParser`, with `--config file.yaml` (or .json) supplying defaults that
command-line flags override. Bad input raises `InputError`, which becomes one line on
stderr and exit code 2 instead of a traceback; a mistyped flag or a bad value included,
with the closest option suggested instead of the whole usage printed. A run that fails after
good input (diverged, disk full) raises `RunFailed`: one line and exit code 3.

Every number of every command is finite, of its option's type, null only where the option takes
None and in the range its dataclass declares (`check_ranges`), or refused naming the option.

`--help` explains our options, a titled group per dataclass, and of a library's (over a hundred
in TrainingArguments) names those in `brief_help_fields`; `--help-all` explains them all.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import logging
import math
import shutil
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, get_args, get_type_hints

import yaml

if TYPE_CHECKING:
    from transformers import HfArgumentParser

EXIT_BAD_INPUT = 2
# A run that started from good input but did not produce its result: it diverged, or the disk
# filled up while saving. Distinct from a crash (1) and from bad input (2), so that a job script
# tells them apart (a Slurm job does not requeue such a run).
EXIT_RUN_FAILED = 3


class InputError(Exception):
    """Bad input from the user: what is wrong, where, and how to fix it, in one line."""


class RunFailed(Exception):
    """A run that could not finish as asked: what happened, what was kept, what to do, in one
    line."""


def setup_logging(level: int = logging.INFO) -> None:
    """Log to stderr with timestamps; only entry points call this."""
    # basicConfig adds a stderr handler only to a root logger without one, and only then sets
    # the level.
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    logging.getLogger().setLevel(level)
    # TensorBoard's event reader logs each folder it walks at INFO: noise in our logs.
    logging.getLogger("tensorboard").setLevel(max(level, logging.WARNING))


def entry_point(main: Callable[[list[str] | None], int | None]) -> Callable[..., int]:
    """Wrap `main(argv)`: set up logging, turn `InputError` into one line and exit code 2, and
    `RunFailed` into one line and exit code 3."""

    @functools.wraps(main)
    def wrapper(argv: list[str] | None = None) -> int:
        setup_logging()
        try:
            return main(argv) or 0
        except (InputError, RunFailed) as err:
            # One line whatever the message: a library's multi-line text included. One write
            # with its newline: print's two writes interleave with other processes' lines.
            sys.stderr.write("error: " + " ".join(str(err).split()) + "\n")
            sys.stderr.flush()
            return EXIT_BAD_INPUT if isinstance(err, InputError) else EXIT_RUN_FAILED

    return wrapper


def exception_chain(err: BaseException) -> list[BaseException]:
    """`err` and the exceptions it was raised from or during, innermost last."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


@contextmanager
def signals_handled(signals: tuple[signal.Signals, ...], handler: Callable) -> Iterator[bool]:
    """While the block runs, `handler` handles `signals`; yields whether it does (only the
    main thread can install a handler: elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield True
    finally:
        for sig, earlier in previous.items():
            signal.signal(sig, earlier)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping of option names to values."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"config file {path} does not exist; pass an existing YAML or JSON file")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".json":
            data = json.loads(text, object_pairs_hook=_unique_keys)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, ValueError) as err:
        first_line = str(err).splitlines()[0]
        raise InputError(f"config file {path} is not valid YAML/JSON: {first_line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"config file {path} must hold a mapping of option names to values")
    return data


def _unique_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A mapping from its pairs; a key given twice (the last would silently win) is an error."""
    keys = [key for key, _ in pairs]
    if twice := [key for index, key in enumerate(keys) if key in keys[:index]]:
        raise ValueError(f"the key {twice[0]!r} is given twice")
    return dict(pairs)


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        _unique_keys([(self.construct_object(key, deep), None) for key, _ in node.value])
        return super().construct_mapping(node, deep)


def command_line_parser(dataclass_types: Sequence[type], **options: Any) -> HfArgumentParser:
    """An `HfArgumentParser` for `dataclass_types` whose every error is one `InputError`.

    A mistyped flag names the closest option and a bad value names its flag, instead of the
    whole usage (over a hundred lines for TrainingArguments). `options` are those of
    `parse_args`. Parse with `parse_args` (a namespace) or `parse_dataclasses`.
    """
    # Imported here: importing transformers takes a second that only parsing needs.
    from transformers import HfArgumentParser

    class CommandLineParser(HfArgumentParser):
        def __init__(self, dataclass_types, **kwargs) -> None:
            # Every action, in the order added, with its help before any default is appended.
            self.arguments: dict[argparse.Action, str | None] = {}
            self.hidden: set[argparse.Action] = set()  # options that only --help-all explains
            self.show_all = False
            self.spellings: dict[str, str] = {}  # HfArgumentParser's --a-b beside --a_b
            self.groups: dict[type, Any] = {}
            self.ours: dict[type, set[str]] = {}  # the fields each dataclass declares itself
            self.owners = {
                field.name: dtype
                for dtype in dataclass_types
                for field in dataclasses.fields(dtype)
                if field.init
            }
            # The options a config file may set to null: typed Optional, or None by default.
            self.nullable = {
                field.name
                for dtype in dataclass_types
                for hints in [get_type_hints(dtype)]
                for field in dataclasses.fields(dtype)
                if field.default is None or type(None) in get_args(hints[field.name])
            }
            super().__init__(
                dataclass_types, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs
            )
            if self.hidden:
                self.add_argument("--help-all", action="help", help="explain every option")

        def add_argument(self, *flags: str, **kwargs: Any) -> argparse.Action:
            # HfArgumentParser adds each field's option through here (--x first, --no_x with
            # dest=x): it goes to its dataclass's group, and --help leaves out the fields a
            # library's class declares (and documents).
            name = kwargs.get("dest", flags[0].lstrip("-"))
            dtype = self.owners.get(name) if flags[0].startswith("--") else None
            if dtype is None:
                action = super().add_argument(*flags, **kwargs)
            else:
                if not self.groups:
                    self.groups = {dtype: self.add_group(dtype) for dtype in self.dataclass_types}
                # One spelling in --help; the other parses as the same option.
                action = self.groups[dtype].add_argument(flags[0], **kwargs)
                self.spellings.update(dict.fromkeys(flags[1:], flags[0]))
                # --no_x, the complement of a bool that defaults to true, repeats --x's help.
                if name not in self.ours[dtype] or flags[0] == f"--no_{name}":
                    self.hidden.add(action)
            self.arguments[action] = action.help
            return action

        def add_group(self, dtype: type):
            """A group that --help describes with the docstring, naming the library fields in
            `brief_help_fields` with their defaults."""
            ours = self.ours[dtype] = {
                name
                for cls in dtype.__mro__
                if not cls.__module__.startswith("transformers")
                for name in vars(cls).get("__annotations__", {})
            }
            listed = getattr(dtype, "brief_help_fields", ())
            named = [
                f"--{field.name}" + ("" if default is None else f"={default}")
                for field in dataclasses.fields(dtype)
                if field.name in listed and field.name not in ours
                for default in [None if field.default is dataclasses.MISSING else field.default]
            ]
            doc = dtype.__doc__.split("\n\n")[0] if ours else ""
            doc = "" if doc.startswith(f"{dtype.__name__}(") else doc  # dataclass's made-up doc
            if named:
                doc += f" Library options used here (defaults shown): {', '.join(named)}."
            width = shutil.get_terminal_size().columns - 4  # argparse's, less the indent
            description = textwrap.fill(" ".join(doc.split()), width, break_on_hyphens=False)
            return self.add_argument_group(dtype.__name__, description)

        def format_help(self) -> str:
            # Each option's help ends with its default (at the time: a config file's included),
            # and the usage line names the required options only: the groups list them all.
            for action, text in self.arguments.items():
                default = action.default is not None and action.default is not argparse.SUPPRESS
                if action in self.hidden and not self.show_all:
                    action.help = argparse.SUPPRESS
                elif text is not None and default and "%(default)" not in text:
                    action.help = text + " (default: %(default)s)"
                else:
                    action.help = text
            return self.format_usage() + "\n" + super().format_help().split("\n\n", 1)[1]

        def format_usage(self) -> str:
            # argparse's usage of a parser holding only the required arguments.
            usage = argparse.ArgumentParser(prog=self.prog, formatter_class=self.formatter_class)
            for action in (action for action in self.arguments if action.required):
                shape = dict(nargs=action.nargs, metavar=action.metavar, choices=action.choices)
                if action.option_strings:
                    shape.update(dest=action.dest, required=True)
                usage.add_argument(*action.option_strings[:1] or [action.dest], **shape)
            return usage.format_usage()

        def error(self, message: str) -> NoReturn:
            # argparse calls this for a bad value, a missing required option, a bad choice.
            raise InputError(f"{message.rstrip('.')}; see --help")

        def parse_known_args(self, args=None, namespace=None):
            """argparse's, but an unknown argument is an `InputError` too."""
            args = [self.respelled(arg) for arg in (sys.argv[1:] if args is None else args)]
            if "--help-all" in args:
                self.show_all, args = True, ["--help"]
            try:
                namespace, unknown = super().parse_known_args(args, namespace)
            except InputError:
                # A mistyped --output_dir also leaves --output_dir missing: name the typo.
                unknown = self.unknown_arguments_when_nothing_is_required(args)
                if not unknown:
                    raise
            if unknown:
                raise InputError(f"{self.describe_unknown_arguments(unknown)}; see --help")
            # argparse's float() takes "nan" and "inf", a YAML file .nan and .inf: a NaN rate
            # trains at nothing or diverges, found only after the run.
            for name, value in vars(namespace).items():
                for item in value if isinstance(value, list) else [value]:
                    if isinstance(item, float) and not math.isfinite(item):
                        raise InputError(f"--{name} is {item}; give a finite number")
            return namespace, unknown

        def respelled(self, argument: str) -> str:
            flag, equals, value = argument.partition("=")
            return self.spellings.get(flag, flag) + equals + value

        def unknown_arguments_when_nothing_is_required(self, args: list[str]) -> list[str]:
            required = [action for action in self.arguments if action.required]
            for action in required:
                action.required = False
            try:
                return super().parse_known_args(args)[1]
            except InputError:
                return []
            finally:
                for action in required:
                    action.required = True

        def describe_unknown_arguments(self, unknown: list[str]) -> str:
            """'unknown option --x (did you mean --y?)' for each unknown flag, else the stray
            values."""
            flags = [argument.split("=", 1)[0] for argument in unknown if argument.startswith("--")]
            if not flags:
                return f"unexpected argument{'s' if len(unknown) > 1 else ''} {' '.join(unknown)}"
            options = [flag for action in self.arguments for flag in action.option_strings]
            options += self.spellings
            descriptions = []
            for flag in flags:
                close = difflib.get_close_matches(flag, options, n=1)
                descriptions.append(
                    f"unknown option {flag}" + (f" (did you mean {close[0]}?)" if close else "")
                )
            return ", ".join(descriptions)

        def parse_dataclasses(self, args: list[str] | None = None) -> tuple[Any, ...]:
            """`parse_args_into_dataclasses` reading no `<script>.args` file, where a value that
            a dataclass's `__post_init__` rejects is an `InputError`."""
            try:
                return self.parse_args_into_dataclasses(args, look_for_args_file=False)
            except (ValueError, TypeError) as err:
                raise InputError(f"invalid arguments: {err}") from None

    return CommandLineParser(list(dataclass_types), **options)


def _type_mismatch(action: argparse.Action, value: Any, nullable: bool) -> str | None:
    """What an option takes, when a config file's value is another type (argparse converts and
    checks only strings: a list learning rate would reach the run), or null where the option
    takes no None (a null block size fails far from its cause)."""
    from transformers.hf_argparser import string_to_bool  # parse_args imported transformers

    boolean = action.type is string_to_bool
    takes, types = {int: ("an integer", int), float: ("a number", int | float)}.get(
        action.type, ("true or false", bool) if boolean else ("a value", object)
    )
    for item in value if isinstance(value, list) and action.nargs in ("+", "*") else [value]:
        if item is None and not nullable:
            return takes
        # A string is argparse's to convert; True is an int to Python, not to a number option.
        number_as_bool = isinstance(item, bool) and action.type in (int, float)
        if item is not None and (not isinstance(item, str | types) or number_as_bool):
            return takes
    return None


def check_ranges(
    values: Mapping[str, Any],
    ranges: Mapping[str, tuple[Callable[[float], bool], str]],
    name: str = "--{}",
) -> None:
    """Refuse the first of `values` that is not a finite number in its range (whether it fits,
    and how to say it), in one line naming its option: `name` with the key."""
    for key, (fits, rule) in ranges.items():
        value = values.get(key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is not None and not (number and math.isfinite(value) and fits(value)):
            raise InputError(f"{name.format(key)} is {value!r}; give {rule}")


# The numbers of transformers' TrainingArguments that our commands set and that it leaves
# unchecked: a zero rate or a beta of 1 trains without a word, a zero batch fails in the loader.
TRAINING_RANGES = {
    "learning_rate": (lambda rate: rate > 0, "a positive number"),
    "num_train_epochs": (lambda epochs: epochs > 0, "a positive number"),
    "weight_decay": (lambda decay: decay >= 0, "a number >= 0"),
    "adam_beta1": (lambda beta: 0 <= beta < 1, "a number in [0, 1)"),
    "adam_beta2": (lambda beta: 0 <= beta < 1, "a number in [0, 1)"),
    "adam_epsilon": (lambda epsilon: epsilon > 0, "a positive number"),
    "max_grad_norm": (lambda norm: norm >= 0, "a number >= 0 (0: no clipping)"),
    "per_device_train_batch_size": (lambda size: size >= 1, "at least 1"),
    "per_device_eval_batch_size": (lambda size: size >= 1, "at least 1"),
    "gradient_accumulation_steps": (lambda steps: steps >= 1, "at least 1"),
}


def parse_args(
    dataclass_types: Sequence[type],
    argv: list[str] | None = None,
    description: str | None = None,
    prog: str | None = None,
) -> tuple[Any, ...]:
    """Parse `argv` into one instance per dataclass; `--config FILE` sets defaults first.

    Unknown keys in the config file are an error (with a close match suggested), as are
    unknown flags on the command line. Pass the module docstring as `description`: its
    example commands keep their lines in `--help`.
    """
    parser = command_line_parser(dataclass_types, description=description, prog=prog)
    parser.add_argument(
        "--config",
        default=None,
        help="YAML or JSON file of option values; flags given on the command line override it.",
    )
    config_only = argparse.ArgumentParser(add_help=False)
    config_only.add_argument("--config", default=None)
    known, _ = config_only.parse_known_args(argv)
    if known.config is not None:
        apply_config_defaults(parser, load_config_file(known.config), known.config)
    instances = parser.parse_dataclasses(argv)
    # --config is the one argument outside the dataclasses.
    return instances[: len(dataclass_types)]


def apply_config_defaults(
    parser: HfArgumentParser, config: dict[str, Any], source: str | Path
) -> None:
    """Make the config file's values the parser's defaults (and no longer required)."""
    # A bool field that defaults to True has two actions (--x and --no_x) with one dest.
    actions_by_dest: dict[str, list[argparse.Action]] = {}
    for action in parser.arguments:
        if action.dest not in ("help", "help_all", "config"):
            actions_by_dest.setdefault(action.dest, []).append(action)
    for key, value in config.items():
        if key not in actions_by_dest:
            close = difflib.get_close_matches(key, list(actions_by_dest), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise InputError(f"unknown option '{key}' in config file {source}{hint}")
        for action in actions_by_dest[key]:
            action.required = False
            if expected := _type_mismatch(action, value, key in parser.nullable):
                shown = "null" if value is None else repr(value)
                raise InputError(
                    f"option '{key}' in config file {source} is {shown}; it takes {expected}"
                )
            # argparse checks choices for command-line values only, never for defaults.
            if action.choices is not None and value is not None:
                for item in value if isinstance(value, list) else [value]:
                    if item not in action.choices:
                        allowed = ", ".join(map(str, action.choices))
                        raise InputError(
                            f"option '{key}' in config file {source} is {item!r}; "
                            f"choose from {allowed}"
                        )
        parser.set_defaults(**{key: value})
