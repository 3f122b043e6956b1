"""Benchmarks of rune_fast against SQLite at the same durability.

- :mod:`bench.workload`: a seeded, realistic agent-conversation workload.
- :mod:`bench.sqlite_store`: the stdlib SQLite baseline holding the same records.
- :mod:`bench.compare`: ``python -m bench.compare``, the side-by-side table of ratios.
- ``bench/test_*.py``: pytest-benchmark suites, run only by ``pytest bench/``.
"""
