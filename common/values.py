"""What an option's value may be: an integer written in full or scaled (12M), None where the
option takes it, and the `Range` of numbers its field declares."""

import math
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

from transformers.hf_argparser import string_to_bool

# A whole number's scale suffixes, as people write token budgets and step counts: 12M, 1.5k.
SCALES = {"k": 10**3, "K": 10**3, "m": 10**6, "M": 10**6, "g": 10**9, "G": 10**9}


def integer(text: str) -> int:
    """Every integer option's type: a whole number in full (12000000, 12_000_000) or scaled."""
    digits, scale = (text[:-1], SCALES[text[-1]]) if text[-1:] in SCALES else (text, 1)
    try:
        value = Decimal(digits.replace("_", "")) * scale
    except InvalidOperation:
        raise ValueError(text) from None
    if not value.is_finite() or value != value.to_integral_value():
        raise ValueError(text)
    return int(value)


def or_none(number: Callable[[str], Any]) -> Callable[[str], Any]:
    """The type of a number option that takes None: `none` clears a config file's value."""

    def convert(text: str) -> Any:
        return None if text.lower() in ("none", "null") else number(text)

    convert.number, convert.__name__ = number, number.__name__  # argparse names it in errors
    return convert


class Range(NamedTuple):
    """The numbers an option takes, declared on its field: `metadata={"range": Range(...)}` (a
    dict option's: {key: Range}). The parser refuses others as `--name is value; give {rule}`."""

    fits: Callable[[Any], bool]
    rule: str  # what to give instead: "a positive number"


def at_least(low: int) -> Range:
    return Range(lambda value: value >= low, f"at least {low}")


POSITIVE = Range(lambda value: value > 0, "a positive number")
NOT_NEGATIVE = Range(lambda value: value >= 0, "a number >= 0")
BELOW_ONE = Range(lambda value: 0 <= value < 1, "a number in [0, 1)")
SHARE = Range(lambda value: 0 < value < 1, "a number in (0, 1)")

# TrainingArguments' numbers, which it leaves unchecked (a zero rate trains without a word) and
# whose fields take no metadata of ours: the range of a field of that name with none declared.
TRAINING_RANGES = {
    **dict.fromkeys(["learning_rate", "num_train_epochs", "adam_epsilon"], POSITIVE),
    **dict.fromkeys(["weight_decay", "max_grad_norm"], NOT_NEGATIVE),
    **dict.fromkeys(["adam_beta1", "adam_beta2"], BELOW_ONE),
    **dict.fromkeys(["per_device_train_batch_size", "per_device_eval_batch_size"], at_least(1)),
    "gradient_accumulation_steps": at_least(1),
}
# What a config file's value must be of an option of each type (argparse converts only strings).
TAKES = {integer: ((int,), "an integer"), float: ((int, float), "a number")}
TAKES[string_to_bool] = ((bool,), "true or false")


def refusal(value: Any, declared: Range | None) -> str | None:
    """What to give instead of `value` if it is a number not finite, or not in `declared`."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and not math.isfinite(value):
        return "a finite number"
    return declared.rule if declared and not (number and declared.fits(value)) else None
