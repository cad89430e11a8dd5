"""The compile service: tables cached, compiled in worker processes, first masks served.

- cache.py: TableCache, one LRU in bytes per (constraint, whitespace, vocabulary);
  disk_cache.py beside it.
- pool.py, compile_job.py, worker.py, progress.py, warm.py: compiles scheduled over worker
  processes with CPU and memory limits, and what a 429's Retry-After reads.
- first_mask.py: FirstMasks, a LazyTable grown in the server while a constraint compiles.
- first_tables.py: FirstTables, a LazyTable's life in the cache: kept as its table's stand-in
  until the table lands.
"""
