"""Benchmarks for latencyd: print figures (medians over repeated runs) next to their targets.

Run from the repository root as root: ``python -m bench`` (every registered benchmark) or
``python -m bench NAME [options]``. See bench/README.md for what each figure means.
"""
