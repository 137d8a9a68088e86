"""Markdown tables of run summaries: numbers formatted for reading, one column per run, the
settings that differ between runs. Knows nothing of any stage; a section picks the rows."""

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from report.run_folder import RunRecord

SIGNIFICANT_DIGITS = 4
MISSING = "n/a"


def format_number(value: float | int) -> str:
    """Integers in full; floats to 4 significant digits without trailing zeros or exponent."""
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    decimals = max(0, SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_value(value: Any) -> str:
    """A summary value as one Markdown table cell."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return format_number(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return " ".join(text.split()).replace("|", "\\|")


def format_hardware(hardware: Any) -> str:
    """One line: the GPUs when there were any, else the CPU."""
    if not isinstance(hardware, dict):
        return format_value(hardware)
    gpus = hardware.get("gpus")
    if isinstance(gpus, list) and gpus and all(isinstance(gpu, dict) for gpu in gpus):
        counts = Counter(
            f"{gpu.get('name', '?')} ({gpu.get('memory_gib', '?')} GiB)" for gpu in gpus
        )
        return format_value(", ".join(f"{n} x {name}" for name, n in counts.items()))
    if "cpu" not in hardware:
        return format_value(hardware)
    return format_value(f"CPU {hardware['cpu']}, {hardware.get('cpu_count', '?')} cores")


@dataclass(frozen=True)
class Row:
    """A table row: a label and the summary key it shows."""

    label: str
    key: str
    formatter: Callable[[Any], str] = format_value


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def summary_table(runs: Sequence[RunRecord], rows: Sequence[Row]) -> list[str]:
    """One column per run, one row per summary value."""
    return mapping_table(runs, [run.summary for run in runs], rows)


def summary_mappings(runs: Sequence[RunRecord], key: str) -> list[dict[str, Any]]:
    """The dict-valued summary entry `key` of each run ({} where a run lacks it)."""
    return [run.summary.get(key) if isinstance(run.summary.get(key), dict) else {} for run in runs]


def mapping_table(
    runs: Sequence[RunRecord], mappings: Sequence[dict[str, Any]], rows: Sequence[Row | str]
) -> list[str]:
    """One column per run (its mapping), one row per `Row` or per name (the row of the name's
    value); [] when there are no rows."""
    rows = [row if isinstance(row, Row) else Row(row, row) for row in rows]
    body = [
        [row.label] + [row.formatter(m[row.key]) if row.key in m else MISSING for m in mappings]
        for row in rows
    ]
    return markdown_table(["", *(f"`{run.name}`" for run in runs)], body) if body else []


def mapping_section(runs: Sequence[RunRecord], key: str, heading: str) -> list[str]:
    """Every entry of a dict-valued summary key (union over runs); [] when no run has one."""
    mappings = summary_mappings(runs, key)
    names = list(dict.fromkeys(name for mapping in mappings for name in mapping))
    table = mapping_table(runs, mappings, names)
    return [heading, "", *table, ""] if table else []


def settings_section(runs: Sequence[RunRecord]) -> list[str]:
    """The options in the summaries' `config`: of one run those that hold a value; of several,
    those that differ between them in a table and those alike in one line."""
    mappings = summary_mappings(runs, "config")
    names = list(dict.fromkeys(name for mapping in mappings for name in mapping))
    if len(runs) == 1:
        shown = [name for name in names if mappings[0][name] is not None]
        table = mapping_table(runs, mappings, shown)
        return ["### Settings", "", *table, ""] if table else []
    absent = object()  # an option a run's summary does not hold differs from every value
    differing, alike = [], []
    for name in names:
        values = [mapping.get(name, absent) for mapping in mappings]
        if any(value != values[0] for value in values[1:]):
            differing.append(name)
        elif values[0] is not None:
            alike.append(name)
    if not differing and not alike:
        return []
    lines = ["### Settings that differ between the runs", ""]
    lines += mapping_table(runs, mappings, differing) or ["None."]
    if alike:
        shared = ", ".join(f"`{name}` {format_value(mappings[0][name])}" for name in alike)
        lines += ["", f"Alike in every run: {shared}."]
    return [*lines, ""]
