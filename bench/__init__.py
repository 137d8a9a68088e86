"""Benchmarks behind every speed and recipe claim (docs/BENCHMARKS.md)."""

import common  # noqa: F401 (first: Ctrl-C while the libraries import is one line)
