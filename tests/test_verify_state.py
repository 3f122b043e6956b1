"""rune_fast.verify.verify_state leaves logging configuration alone, and
reports an archive pyarrow cannot read instead of raising.

The store logs an error for each read that fails its check. verify_state
does not silence that by changing the ``rune_fast`` logger (a global a library
call from several threads must not touch): an application's handlers still
get every record, and a handler given ``DuringVerifyFilter`` drops only the
records emitted inside a verify, by the verifying thread.
"""
from __future__ import annotations

import logging
import os
import threading

from rune_fast import ConversationMessageRecord, ConversationStateRepository
from rune_fast.verify import DuringVerifyFilter, verify_state


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _damaged_store(root: str) -> str:
    state = os.path.join(root, "state")
    target = b"flip target 5e2a"
    with ConversationStateRepository(state) as repo:
        repo.append_many([ConversationMessageRecord(role="user", content=f"fine {i}", channel_id="f")
                          for i in range(5)])
        repo.append(ConversationMessageRecord(role="user", content=target.decode(), channel_id="f"))
    tail = os.path.join(state, "hot", "conversation_tail.jsonl")
    with open(tail, "r+b") as f:
        data = f.read()
        pos = data.index(target) + 5
        f.seek(pos)
        f.write(bytes([data[pos] ^ 0x20]))
    return state


def test_verify_state_leaves_the_logger_alone(tmp_path):
    state = _damaged_store(str(tmp_path))
    store_log = logging.getLogger("rune_fast")
    everything, filtered = Collect(), Collect()
    filtered.addFilter(DuringVerifyFilter())
    seen_levels: list[int] = []

    class Progress:
        """verify_state's progress callback: runs inside the verify."""

        def update(self, done: int | None = None, note: str | None = None, *, force: bool = False) -> None:
            seen_levels.append(store_log.level)
            if done == 1:
                # Another thread logs while this one verifies: its record is
                # not the verify's, so the filter lets it through.
                other = threading.Thread(target=store_log.error, args=("from another thread",))
                other.start()
                other.join()
            if done == 2:
                # a record of the store emitted inside the verify, by its thread
                # (the store's checks report damage without logging it; an exact
                # read that met it would log SOURCE_CORRUPT)
                store_log.error("exact read of m: SOURCE_CORRUPT")

    before = store_log.level
    store_log.addHandler(everything)
    store_log.addHandler(filtered)
    try:
        report = verify_state(state, Progress())
        store_log.error("after the verify")
    finally:
        store_log.removeHandler(everything)
        store_log.removeHandler(filtered)

    assert not report["ok"]
    assert store_log.level == before and set(seen_levels) == {before}, seen_levels
    messages = [r.getMessage() for r in everything.records]
    corrupt = [m for m in messages if "SOURCE_CORRUPT" in m]
    assert corrupt, messages                        # the record reached the application's handler
    kept = [r.getMessage() for r in filtered.records]
    assert not [m for m in kept if "SOURCE_CORRUPT" in m], kept
    assert kept == ["from another thread", "after the verify"], kept


def test_an_archive_footer_pyarrow_cannot_read_is_reported_not_raised(tmp_path):
    """A flipped bit in a cool file's footer: the store refuses to open
    (the manifest's footer hash), and the offline scan that follows reads
    the file with pyarrow, which raises more than OSError and ValueError for
    some footers (ArrowNotImplementedError: "Integers with less than 8
    bits"). Each such file is a problem of the report, named, never an
    exception out of verify_state."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from test_lost_files import one_cool_file

    state, _msgs, path = one_cool_file(tmp_path)
    with open(path, "rb") as f:
        data = f.read()
    start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")

    def odd_error(b: bytes) -> bool:
        try:
            pf = pq.ParquetFile(pa.BufferReader(b), page_checksum_verification=True)
            for i in range(pf.num_row_groups):
                try:
                    pf.read_row_group(i)
                except (OSError, ValueError):
                    pass
        except (OSError, ValueError):
            return False
        except Exception:
            return True
        return False

    flips = ((p, bit) for p in range(len(data) - 9, start - 1, -1) for bit in range(8))
    found = next(((p, bit) for p, bit in flips
                  if odd_error(data[:p] + bytes([data[p] ^ (1 << bit)]) + data[p + 1:])), None)
    assert found is not None, "no footer flip makes pyarrow raise past OSError/ValueError"
    p, bit = found
    with open(path, "r+b") as f:
        f.seek(p)
        f.write(bytes([data[p] ^ (1 << bit)]))
    report = verify_state(state)
    assert not report["ok"]
    assert any(pr["file"] == path and "Parquet" in pr["message"] for pr in report["problems"]), report["problems"]
