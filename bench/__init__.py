"""Benchmarks behind every speed and recipe claim (docs/BENCHMARKS.md)."""
