"""Command-line plumbing: each entry point is `main(argv)`, decorated with `entry_point`, reading
its options with `parse_args` (flags over `--config FILE`). Bad input raises `InputError`, a run
failing after good input `RunFailed`: one line on stderr, exit 2 or 3. Every number is finite, of
its option's type, null only where it takes None, in the `Range` its field declares, or refused."""

import argparse
import functools
import json
import logging
import shutil
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, is_dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import Any, NoReturn, get_args, get_type_hints

import yaml
from transformers import HfArgumentParser

from common.system import build_extensions_in_this_environment, use_allotted_cores
from common.values import TAKES, TRAINING_RANGES, integer, or_none, refusal

EXIT_BAD_INPUT = 2
# A run that failed after good input (diverged, disk full): for job scripts, not 1 nor 2.
EXIT_RUN_FAILED = 3
EXIT_INTERRUPTED = 128 + 2  # Ctrl-C (SIGINT), as a shell reports it


class InputError(Exception):
    """Bad input from the user: what is wrong, where, and how to fix it, in one line."""


class RunFailed(Exception):
    """A run that could not finish as asked: what happened, what was kept, what to do."""


def setup_logging(level: int = logging.INFO) -> None:
    """Log to stderr with timestamps; only entry points call this."""
    logging.basicConfig(  # sets the level only when it adds the handler: the root had none
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    logging.getLogger().setLevel(level)
    logging.getLogger("tensorboard").setLevel(max(level, logging.WARNING))  # a line per folder


def entry_point(main: Callable[[list[str] | None], int | None]) -> Callable[..., int]:
    """Wrap `main(argv)`: set up logging, torch's threads and extensions folder; `InputError`
    is one line and exit 2, `RunFailed` 3."""

    @functools.wraps(main)
    def wrapper(argv: list[str] | None = None) -> int:
        setup_logging()
        use_allotted_cores()
        build_extensions_in_this_environment()
        try:
            return main(argv) or 0
        except (InputError, RunFailed) as err:
            # One line whatever the message, in one write (print's two interleave with others').
            sys.stderr.write("error: " + " ".join(str(err).split()) + "\n")
            sys.stderr.flush()
            return EXIT_BAD_INPUT if isinstance(err, InputError) else EXIT_RUN_FAILED
        except KeyboardInterrupt:  # Ctrl-C with no stop handler: what was half-written is gone
            sys.stderr.write("error: interrupted (SIGINT); nothing unfinished was kept\n")
            return EXIT_INTERRUPTED

    return wrapper


def exception_chain(err: BaseException) -> list[BaseException]:
    """`err` and the exceptions it was raised from or during, innermost last."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def from_here(path: str | Path) -> str:
    """`path` for a message, with the folder a relative one is read from: a command run from
    another folder would otherwise name a path that exists elsewhere."""
    return str(path) if Path(path).is_absolute() else f"{path} (relative to {Path.cwd()})"


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping of option names to values."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"config file {from_here(path)} is a folder; pass a YAML or JSON file")
    if not path.is_file():
        raise InputError(
            f"config file {from_here(path)} does not exist; pass an existing YAML or JSON file"
        )
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
        else:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506
    except (yaml.YAMLError, ValueError) as err:
        line = str(err).splitlines()[0]
        raise InputError(f"config file {path} is not valid YAML/JSON: {line}") from None
    if not isinstance(data, dict | None):
        raise InputError(f"config file {path} must hold a mapping of option names to values")
    return data or {}


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


def config_path(argv: Sequence[str]) -> str | None:
    """The file of the last `--config FILE` (or `--config=FILE`) in `argv`, if any."""
    paths = [path for flag, path in zip(argv, argv[1:], strict=False) if flag == "--config"]
    paths += [arg.removeprefix("--config=") for arg in argv if arg.startswith("--config=")]
    return paths[-1] if paths else None


class CommandLineParser(HfArgumentParser):
    """TRL's `TrlParser` shape: `--config FILE` under the flags, `InputError`s, a group each."""

    def __init__(self, dataclass_types: Sequence[type], **kwargs: Any) -> None:
        # Every argument; those --help-all adds, with their help; each dataclass's; --a-b: --a_b.
        self.actions, self.hidden, self.groups, self.spellings, self.ranges = [], {}, {}, {}, {}
        self.config, self.config_source, self.given = {}, "", set()  # given: on the command line
        self.owners = {f.name: d for d in dataclass_types for f in fields(d) if f.init}
        kwargs.setdefault("usage", "%(prog)s [--config FILE] [options]")
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # examples
        super().__init__(dataclass_types, **kwargs)
        self.add_argument("--config", metavar="FILE", help="YAML or JSON option values; flags win.")
        if self.hidden:
            self.add_argument("--help-all", action="help", help="list the library's options too")

    def add_argument(self, *flags: str, **kwargs: Any) -> argparse.Action:
        # HfArgumentParser adds each field's option here (--x, --x-y: one), then maybe --no_x.
        name, default = kwargs.get("dest", flags[0].lstrip("-")), kwargs.get("default")
        if declared := kwargs.pop("range", None) or TRAINING_RANGES.get(name):
            self.ranges[name] = declared
        if kwargs.get("type") is int:
            kwargs["type"] = integer
        if kwargs.get("type") in (integer, float) and name in self.owners and self.nullable(name):
            kwargs["type"] = or_none(kwargs["type"])
        if "dest" in kwargs:  # --no_x, the complement of a bool that defaults to true
            kwargs["help"] = argparse.SUPPRESS
        elif kwargs.get("help") and default is not None and default is not argparse.SUPPRESS:
            kwargs["help"] += " (default: %(default)s)"
        if (dtype := self.owners.get(name)) and dtype not in self.groups:
            self.groups[dtype] = self.add_argument_group(dtype.__name__, self.describe(dtype))
        group = self.groups[dtype] if dtype else super()
        self.spellings.update(dict.fromkeys(flags[1:], flags[0]) if dtype else {})
        self.actions.append(action := group.add_argument(*flags[: 1 if dtype else None], **kwargs))
        if dtype and name not in self.declared(dtype):
            self.hidden[action], action.help = action.help, argparse.SUPPRESS
        return action

    def nullable(self, name: str) -> bool:
        """Whether option `name` takes None (null in a config file, none on the command line)."""
        dtype = self.owners[name]
        default = next(field.default for field in fields(dtype) if field.name == name)
        return default is None or type(None) in get_args(get_type_hints(dtype)[name])

    @staticmethod
    def declared(dtype: type) -> set[str]:
        """The fields of `dtype` but those it inherits unchanged (the very object) from a base."""
        inherited = {id(f) for b in dtype.__mro__[1:] if is_dataclass(b) for f in fields(b)}
        return {f.name for f in fields(dtype) if id(f) not in inherited}

    def describe(self, dtype: type) -> str:
        """`dtype`'s docstring's first paragraph, then its `brief_help_fields` with defaults."""
        doc = (dtype.__doc__ or "").split("\n\n")[0]
        doc = "" if doc.startswith(f"{dtype.__name__}(") else doc  # dataclass's made-up doc
        brief = set(getattr(dtype, "brief_help_fields", ())) - self.declared(dtype)
        named = [f"--{f.name}={self.get_default(f.name)}" for f in fields(dtype) if f.name in brief]
        if named:
            doc += f" Library options used here (with --config's values): {', '.join(named)}."
        width = shutil.get_terminal_size().columns - 4  # argparse's, less the indent
        return textwrap.fill(" ".join(doc.split()), width, break_on_hyphens=False)

    def format_help(self) -> str:
        for dtype, group in self.groups.items():  # the values --config set, not the fields'
            group.description = self.describe(dtype)
        return super().format_help()

    def error(self, message: str) -> NoReturn:  # a bad value, a missing required option
        raise InputError(f"{message.rstrip('.')}; see --help")

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, where an unknown flag, a stray value or a value refused is an error."""
        parts = (arg.partition("=") for arg in (sys.argv[1:] if args is None else args))
        args = [self.spellings.get(flag, flag) + equals + value for flag, equals, value in parts]
        for action, text in self.hidden.items() if "--help-all" in args else ():
            action.help = text
        options = [flag for action in self.actions for flag in action.option_strings]
        # Suggested: an option --help names that the flag begins (--max_train) or is close to;
        # else a hidden one close to it.
        brief = {name for dtype in self.groups for name in getattr(dtype, "brief_help_fields", ())}
        named = [a for a in self.actions if a.help != argparse.SUPPRESS or a.dest in brief]
        shown = [flag for action in named for flag in action.option_strings]
        flags = [arg.split("=")[0] for arg in args if arg.startswith("--")]
        self.given = {flag[2:] for flag in flags}
        for flag in (flag for flag in flags if flag not in [*options, "--"]):
            close = [o for o in shown if o.startswith(flag)] or get_close_matches(flag, shown, n=1)
            close = close or get_close_matches(flag, options, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise InputError(f"unknown option {flag}{hint}; see --help")
        namespace, extra = super().parse_known_args(args, namespace)
        if extra:  # values no option takes
            raise InputError(f"unexpected argument {' '.join(extra)}; see --help")
        for name in self.owners:
            where = f" in config file {self.config_source}" * (name in self.config)
            self.check(name, getattr(namespace, name), "" if name in self.given else where)
        return namespace, extra

    def parse_dataclasses(self, args: list[str] | None = None) -> tuple[Any, ...]:
        """TrlParser's `parse_args_and_config`: the dataclasses (then a namespace of the rest)."""
        args = sys.argv[1:] if args is None else list(args)
        if path := config_path(args):
            self.set_config_defaults(load_config_file(path), path)
        try:
            return self.parse_args_into_dataclasses(args, look_for_args_file=False)
        except (ValueError, TypeError) as err:  # a value a __post_init__ refuses
            raise InputError(f"invalid arguments: {err}") from None

    def set_config_defaults(self, config: Mapping[str, Any], source: str) -> None:
        """TrlParser's `set_defaults_with_config`, refusing a key no dataclass has."""
        for key in config:
            if key not in self.owners:
                close = get_close_matches(key, list(self.owners), n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise InputError(f"unknown option '{key}' in config file {source}{hint}")
            for action in (action for action in self.actions if action.dest == key):
                action.required = False
        self.set_defaults(**config)
        self.config, self.config_source = config, source

    def check(self, name: str, value: Any, where: str) -> None:
        """Refuse option `name`'s `value` (`where` it was given) unless it is of its type (a
        config file's is not argparse's to convert), null only where it takes None, one of its
        choices, and a finite number in its range."""
        action, declared = next(a for a in self.actions if a.dest == name), self.ranges.get(name)
        kinds, takes = TAKES.get(getattr(action.type, "number", action.type), (None, "a value"))
        if isinstance(declared, Mapping):  # a dict option's numbers, as a mapping or JSON text
            values = json.loads(value) if isinstance(value, str) else value
            keys = declared.items() if isinstance(values, Mapping) else ()
            items = [(f"--{name} {key}", values.get(key), each) for key, each in keys]
        else:
            many = isinstance(value, list) and action.nargs in ("+", "*")
            items = [(f"--{name}", item, declared) for item in (value if many else [value])]
        for flag, item, declared in items:
            if item is None:
                why = takes if where and not self.nullable(name) else None  # a config's null
            elif kinds and type(item) not in kinds:  # True is an int to Python, not a number
                why = takes
            elif action.choices is not None and item not in action.choices:
                why = f"one of {', '.join(map(str, action.choices))}"
            else:
                why = refusal(item, declared)
            if why:
                shown = "null" if item is None else repr(item)
                raise InputError(f"{flag} is {shown}{where}; give {why}")


def parse_args(dataclass_types: Sequence[type], argv: list[str] | None = None, **options: Any):
    """An instance per dataclass, flags over `--config FILE`; `options`: `prog`, `description`."""
    parsed = CommandLineParser(dataclass_types, **options).parse_dataclasses(argv)
    return parsed[: len(dataclass_types)]
