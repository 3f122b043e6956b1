"""rune_fast side by side with SQLite at the same durability (ships with the package).

- :mod:`rune_fast.bench.workload`: a seeded, realistic agent-conversation workload.
- :mod:`rune_fast.bench.sqlite_store`: the stdlib SQLite baseline holding the same records.
- :mod:`rune_fast.bench.compare`: the side-by-side table of ratios, run by
  ``python -m rune_fast.bench`` or ``rune-fast bench`` from any folder.

The pytest-benchmark suites stay in the source checkout's ``bench/``.
"""
