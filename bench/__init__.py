"""Benchmarks: each runs gclm and its baseline side by side and prints the ratios.

Run them from the repository root as modules, e.g. `python -m bench.compile --json out.json`.
"""
