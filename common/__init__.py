"""Helpers shared by every stage: CLI parsing and errors, atomic files, the corpus reader."""
