"""rune_fast._arrays.unique is np.unique for the arrays the reads give it,
and a reading process never imports numpy.ma (numpy 2's np.unique does at
its first call: ~0.9 MB resident for nothing)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rune_fast._arrays import unique


@given(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=60))
def test_unique_is_np_unique(values):
    a = np.array(values, dtype=np.int64)
    got = unique(a)
    assert got.dtype == np.int64
    assert got.tolist() == np.unique(a).tolist()


def test_unique_takes_sequences_and_empty():
    assert unique([3, 1, 3, 2]).tolist() == [1, 2, 3]
    assert unique(np.zeros(0, np.int64)).tolist() == []


def test_reads_do_not_import_numpy_ma(tmp_path):
    """A task read over archived rows and a search in a fresh process."""
    code = textwrap.dedent(f"""
        import sys
        from rune_fast import ConversationStateRepository, ConversationMessageRecord
        with ConversationStateRepository({str(tmp_path)!r}, durability="none", hot_window=4) as repo:
            repo.append_many([ConversationMessageRecord(msg_id=f"m{{i}}", ts=1.0 + i, role="user",
                              content=f"note {{i}} zürich", channel_id=f"c{{i % 3}}", task_id=f"t{{i % 5}}")
                              for i in range(300)])
            repo.compact()
        with ConversationStateRepository({str(tmp_path)!r}) as repo:
            assert repo._cool.files(), "nothing archived"
            assert len(repo.messages_for_task("t1")) == 60
            assert len(repo.search("ZÜRICH")) == 300
        print("numpy.ma" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
