"""pytest-benchmark suites of rune_fast, run only by ``pytest bench/`` (``make bench``).

The side-by-side comparison with SQLite (its workload, its SQLite store and
the table) ships inside the package: :mod:`rune_fast.bench`, run by
``python -m rune_fast.bench`` or ``rune-fast bench``.
"""
