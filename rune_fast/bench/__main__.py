"""``python -m rune_fast.bench``: the SQLite comparison (see :mod:`rune_fast.bench.compare`)."""
from .compare import main

raise SystemExit(main())
