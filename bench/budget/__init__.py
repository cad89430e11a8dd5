"""The budget table: how outputs fare as max_tokens approaches a constraint's minimum.

`python -m bench.budget` runs it (run.py: schemas, jobs, the engine); metrics.py measures
each output (parse, valid, degenerate, hollow share); forced.py proves which budgets leave
room for a non-degenerate output; report.py writes the table and the figure.
"""
