"""`python -m bench.budget`: the budget table (bench/budget/run.py)."""

from __future__ import annotations

from bench.budget.run import main

main()
