"""``python -m rune_fast.cli``, the same as ``rune-fast`` and ``python -m rune_fast``."""
from . import main

raise SystemExit(main())
