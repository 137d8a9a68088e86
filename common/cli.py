"""Command-line plumbing shared by every entry point.

Every entry point is `main(argv: list[str] | None = None) -> int`, decorated with
`entry_point`, and parses its options with `parse_args`: dataclasses read by
`HfArgumentParser`, with `--config file.yaml` (or .json) supplying defaults that
command-line flags override. Bad input raises `InputError`, which becomes one line on
stderr and exit code 2 instead of a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger(__name__)

EXIT_BAD_INPUT = 2


class InputError(Exception):
    """Bad input from the user: what is wrong, where, and how to fix it, in one line."""


def setup_logging(level: int = logging.INFO) -> None:
    """Log to stderr with timestamps; only entry points call this."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
        root.addHandler(handler)
    root.setLevel(level)


def entry_point(main: Callable[[list[str] | None], int | None]) -> Callable[..., int]:
    """Wrap `main(argv)`: set up logging, turn `InputError` into one line and exit code 2."""

    @functools.wraps(main)
    def wrapper(argv: list[str] | None = None) -> int:
        setup_logging()
        try:
            return main(argv) or 0
        except InputError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT

    return wrapper


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping of option names to values."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"config file {path} does not exist; pass an existing YAML or JSON file")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        first_line = str(err).splitlines()[0]
        raise InputError(f"config file {path} is not valid YAML/JSON: {first_line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"config file {path} must hold a mapping of option names to values")
    return data


def parse_args(
    dataclass_types: Sequence[type],
    argv: list[str] | None = None,
    description: str | None = None,
    prog: str | None = None,
) -> tuple[Any, ...]:
    """Parse `argv` into one instance per dataclass; `--config FILE` sets defaults first.

    Unknown keys in the config file are an error (with a close match suggested), as are
    unknown flags on the command line.
    """
    from transformers import HfArgumentParser

    parser = HfArgumentParser(list(dataclass_types), description=description, prog=prog)
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

    values = vars(parser.parse_args(argv))
    values.pop("config", None)
    instances = []
    for dtype in dataclass_types:
        names = {f.name for f in dataclasses.fields(dtype) if f.init}
        try:
            instances.append(dtype(**{k: v for k, v in values.items() if k in names}))
        except (ValueError, TypeError) as err:
            raise InputError(f"invalid {dtype.__name__}: {err}") from None
    return tuple(instances)


def apply_config_defaults(
    parser: argparse.ArgumentParser, config: dict[str, Any], source: str | Path
) -> None:
    """Make the config file's values the parser's defaults (and no longer required)."""
    # A bool field that defaults to True has two actions (--x and --no_x) with one dest.
    actions_by_dest: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        if action.dest not in ("help", "config"):
            actions_by_dest.setdefault(action.dest, []).append(action)
    for key, value in config.items():
        if key not in actions_by_dest:
            close = difflib.get_close_matches(key, list(actions_by_dest), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise InputError(f"unknown option '{key}' in config file {source}{hint}")
        for action in actions_by_dest[key]:
            action.required = False
        parser.set_defaults(**{key: value})
