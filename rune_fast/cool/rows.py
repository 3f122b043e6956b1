"""Row groups in memory and the assembly of rows: column views of a decoded
row group (``_Group``; content as LZ4 blocks with trigram filters,
``_Content``), and the record dicts rebuilt from them (``_assemble_*``).
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Callable, Literal, NamedTuple, Sequence, cast

import numpy as np
import orjson
import pyarrow as pa
import xxhash

from .._search import block_grams, find_spans, gram_blocks
from .._encode import fresh_read_only_calls
from ..errors import CorruptStateCheckpointError
from ..records import _stored_calls_ok
from .schema import _COLS, record_digest

if TYPE_CHECKING:
    from typing_extensions import Buffer


# --------------------------------------------------------------------------- #
# Row groups in memory
# --------------------------------------------------------------------------- #

_NUM_FMT: dict[str, Literal["d", "q", "i"]] = {
    "ts": "d", "token_estimate": "q", "schema_version": "i", "ord": "q"}
_NUM_SIZE = {"d": 8, "q": 8, "i": 4}
#: per cached column: overhead beyond its bytes (Python objects, memoryviews,
#: Arrow buffer padding), counted against the cache budget (measured: the
#: accounted total is within a few percent of tracemalloc + Arrow's pool)
_COL_OVERHEAD = 4096
#: characters whose casefold holds an ASCII character (U+00DF sharp s -> "ss",
#: U+212A Kelvin -> "k", the "fi" ligatures, ...): the only way a non-ASCII
#: character can take part in a match of an ASCII needle. Checked against
#: unicodedata by tests/test_cool.py.
SPECIAL_FOLD = "\u00df\u0130\u0149\u017f\u01f0\u1e96\u1e97\u1e98\u1e99\u1e9a\u1e9e\u212a" \
               "\ufb00\ufb01\ufb02\ufb03\ufb04\ufb05\ufb06"
_SPECIAL_UTF8 = [c.encode("utf-8") for c in SPECIAL_FOLD]
#: rows per in-memory compressed block of a cached content column: LZ4 (half
#: the text; a 12 KB block opens in ~3 us, where zstd takes ~19 us for a third),
#: with a trigram filter of _GRAM_BITS bits per block that lets a search skip
#: the blocks that cannot hold its needle (32 bytes per cached row)
_BLOCK_ROWS = 16
_GRAM_BITS = 4096
#: tasks whose cool locations task_locs keeps (emptied when files come or go,
#: and when full): a warm task read at 1,000,000 messages walked 9 files' task
#: maps every time (~4 us of ~30)
_TASK_LOCS_KEPT = 8192
_LZ4 = pa.Codec("lz4_raw")

#: the columns records_from_columns takes: the string columns in schema
#: order, then ts, token_estimate, schema_version, ord
_STRING_COLS = [i for i, c in enumerate(_COLS) if c not in ("ts", "token_estimate", "schema_version", "ord")]
_TS, _TOK, _SV, _ORD = (_COLS.index(c) for c in ("ts", "token_estimate", "schema_version", "ord"))


def _calls_read(raw: bytes) -> tuple[tuple, bytes] | None:
    """A stored non-empty tool-call list as records_from_columns takes it:
    (the calls, read-only, as message_from_stored keeps them from a fresh decode; their
    canonical JSON for the digest), or None: the row takes the Python path.
    A spelling orjson does not give back (a long integer, a float json
    spells otherwise) fails the digest and takes that path too."""
    try:
        calls = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(calls) is list and calls and _stored_calls_ok(calls):
        try:
            canonical = orjson.dumps(calls, option=orjson.OPT_SORT_KEYS)
            return fresh_read_only_calls(calls), canonical
        except (orjson.JSONEncodeError, TypeError):
            return None
    return None


def _col_view(name: str, arr: pa.Array, path: str, first: int) -> tuple:
    """(getter, nbytes, data, offsets) of one column, for fast per-row access
    without Arrow scalars: ``getter(i)`` is row i's Python value. A string
    column keeps its UTF-8 bytes once (as one ``str`` when all ASCII, so a
    value is a slice) plus the int32 offsets; the Arrow array is not kept."""
    if arr.null_count:
        raise CorruptStateCheckpointError(f"cool column {name} holds nulls", path=path, offset=first)
    n, off = len(arr), arr.offset
    bufs = arr.buffers()
    fmt = _NUM_FMT.get(name)
    if fmt is not None:
        k = _NUM_SIZE[fmt]
        mv = memoryview(bufs[1]).cast("B")[k * off:k * (off + n)].cast(fmt)
        return mv.__getitem__, k * n + _COL_OVERHEAD, None, None, \
            (lambda rows, mv=mv: [mv[i] for i in rows])
    if bufs[1] is None:
        offs = memoryview(bytes(4 * (n + 1))).cast("i")
    else:
        offs = memoryview(bufs[1]).cast("B")[4 * off:4 * (off + n + 1)].cast("i")
    lo, hi = (offs[0], offs[n]) if n else (0, 0)
    data: bytes | None      # (None in the view of an ASCII column: its text is kept instead)
    data = bytes(memoryview(bufs[2]).cast("B")[lo:hi]) if bufs[2] is not None and hi > lo else b""
    if lo:
        # (numpy's stubs give ndarray its __buffer__ for Python >= 3.12 only)
        shifted = cast("Buffer", np.frombuffer(offs, dtype=np.int32) - np.int32(lo))
        offs = memoryview(shifted).cast("B").cast("i")
    nbytes = len(data) + 4 * (n + 1) + _COL_OVERHEAD
    if name == "content":
        return _content_view(data, offs, n)
    getter: Callable[[int], str]
    take: Callable[[list[int]], list[str]]
    if data.isascii():
        text = data.decode("ascii")
        if name != "content":
            data = None
        else:
            nbytes += len(text)

        def getter(i: int, s: str = text, o: memoryview = offs) -> str:
            return s[o[i]:o[i + 1]]

        def take(rows: list[int], s: str = text, o: memoryview = offs) -> list[str]:
            return [s[o[i]:o[i + 1]] for i in rows]
    else:
        def getter(i: int, b: bytes = data, o: memoryview = offs) -> str:
            return b[o[i]:o[i + 1]].decode("utf-8")

        def take(rows: list[int], b: bytes = data, o: memoryview = offs) -> list[str]:
            return [b[o[i]:o[i + 1]].decode("utf-8") for i in rows]
    return getter, nbytes, data, offs, take


class _Content:
    """A cached content column: its UTF-8 bytes and offsets, or, once the
    cache needs the room, LZ4 blocks of ``_BLOCK_ROWS`` rows (about half the
    size, ~3 us to open one block; the last block opened is kept, for
    sequential reads) with their trigram filters."""

    __slots__ = ("data", "blocks", "grams", "offs", "n", "last_k", "last")

    def __init__(self, data: bytes, offs: memoryview, n: int) -> None:
        self.data: bytes | None = data
        self.blocks: list[bytes] | None = None
        self.grams = b""      # with blocks: each block's trigram filter (_GRAM_BITS bits)
        self.offs, self.n = offs, n
        self.last_k, self.last = -1, b""

    def nbytes(self) -> int:
        if self.data is not None:
            return len(self.data) + len(self.grams) + 4 * (self.n + 1) + _COL_OVERHEAD
        return (sum(len(b) + 41 for b in cast("list[bytes]", self.blocks)) + len(self.grams) + 4 * (self.n + 1)
                + _COL_OVERHEAD)

    def compress(self) -> int:
        """Switch to compressed blocks (and their trigram filters, so that a
        search opens only the blocks that can hold its needle); returns the
        bytes saved."""
        if self.data is None:
            return 0
        before = self.nbytes()
        self.build_grams()
        data, o, n, comp = self.data, self.offs, self.n, _LZ4.compress
        self.blocks = [comp(data[o[k]:o[min(k + _BLOCK_ROWS, n)]], asbytes=True)
                       for k in range(0, n, _BLOCK_ROWS)]
        self.data = None
        return before - self.nbytes()

    def build_grams(self) -> None:
        """Compute the blocks' trigram filters (kept; a no-op once done)."""
        if not self.grams and self.data is not None:
            self.grams = block_grams(self.data, self.offs, _BLOCK_ROWS, _GRAM_BITS)

    def find(self, needle: bytes, ci: bool, lo: int, hi: int) -> np.ndarray:
        """Rows in [lo, hi) (ascending) whose bytes hold ``needle`` (ASCII
        letters either case with ``ci``; the needle already lowercased).

        The trigram filters are used once built (cached columns build them at
        their first search); a column read for one scan is searched whole."""
        if hi <= lo:
            return np.zeros(0, np.int64)
        o = np.frombuffer(self.offs, dtype=np.int32).astype(np.int64)
        data = self.data
        if not self.grams and data is not None:
            return find_spans(data, o[lo:hi], o[lo + 1:hi + 1], needle, ci) + lo
        self.build_grams()
        B = _BLOCK_ROWS
        ks = gram_blocks(self.grams, _GRAM_BITS, needle)
        ks = ks[(ks >= lo // B) & (ks <= (hi - 1) // B)]
        out = []
        for k in ks.tolist():
            a, b = max(lo, k * B), min(hi, (k + 1) * B, self.n)
            if data is not None:
                idx = find_spans(data, o[a:b], o[a + 1:b + 1], needle, ci)
            else:
                base = o[k * B]
                idx = find_spans(self._block(k), o[a:b] - base, o[a + 1:b + 1] - base, needle, ci)
            if len(idx):
                out.append(idx + a)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _block(self, k: int) -> bytes:
        if k != self.last_k:
            o, a = self.offs, k * _BLOCK_ROWS
            size = o[min(a + _BLOCK_ROWS, self.n)] - o[a]
            blk = cast("list[bytes]", self.blocks)[k]       # (blocks is set whenever data is None)
            self.last = _LZ4.decompress(blk, size, asbytes=True) if size else b""
            self.last_k = k
        return self.last

    def get(self, i: int) -> str:
        o = self.offs
        if self.data is not None:
            return self.data[o[i]:o[i + 1]].decode("utf-8")
        k = i // _BLOCK_ROWS
        b = self._block(k)
        base = o[k * _BLOCK_ROWS]
        return b[o[i] - base:o[i + 1] - base].decode("utf-8")

    def raw(self, i: int) -> bytes:
        """Row ``i``'s UTF-8 bytes."""
        o = self.offs
        if self.data is not None:
            return self.data[o[i]:o[i + 1]]
        k = i // _BLOCK_ROWS
        b = self._block(k)
        base = o[k * _BLOCK_ROWS]
        return b[o[i] - base:o[i + 1] - base]

    def take(self, rows: list[int]) -> list[str]:
        o = self.offs
        data = self.data
        if data is not None:
            return [data[o[i]:o[i + 1]].decode("utf-8") for i in rows]
        out = []
        for i in rows:
            k = i // _BLOCK_ROWS
            b = self._block(k)
            base = o[k * _BLOCK_ROWS]
            out.append(b[o[i] - base:o[i + 1] - base].decode("utf-8"))
        return out

    def all_bytes(self) -> bytes:
        """The whole column's UTF-8 bytes (for search)."""
        if self.data is not None:
            return self.data
        o, n, dec = self.offs, self.n, _LZ4.decompress
        out = []
        for k, blk in enumerate(cast("list[bytes]", self.blocks)):
            a = k * _BLOCK_ROWS
            size = o[min(a + _BLOCK_ROWS, n)] - o[a]
            out.append(dec(blk, size, asbytes=True) if size else b"")
        return b"".join(out)


def _content_view(data: bytes, offs: memoryview, n: int) -> tuple:
    c = _Content(data, offs, n)
    return c.get, c.nbytes(), c, offs, c.take


class _Group:
    """The decoded columns of one row group, loaded column by column on
    demand (compact: UTF-8 bytes + offsets per string column)."""

    __slots__ = ("n", "cols", "nbytes", "acc", "takes")

    def __init__(self, n: int) -> None:
        self.n = n
        self.cols: dict[str, tuple] = {}
        self.nbytes = 200
        self.acc: list | None = None          # the 15 getters in column order, once all loaded
        self.takes: list | None = None        # the 15 bulk getters (rows -> values)

    def add(self, table: pa.Table, path: str, first: int) -> None:
        for name in table.column_names:
            if name in self.cols:
                continue
            arr = table.column(name).combine_chunks()
            if len(arr) != self.n:
                raise CorruptStateCheckpointError(
                    f"cool column {name} has {len(arr)} rows in a group of {self.n}", path=path, offset=first)
            v = _col_view(name, arr, path, first)
            self.cols[name] = v
            self.nbytes += v[1]
        if self.acc is None and len(self.cols) == len(_COLS):
            self.acc = [self.cols[name][0] for name in _COLS]
            self.takes = [self.cols[name][4] for name in _COLS]

    def spans(self) -> tuple[bytes, np.ndarray]:
        """(content bytes, int64 offsets) for find_spans."""
        _g, _nb, content, offs, _t = self.cols["content"]
        return content.all_bytes(), np.frombuffer(offs, dtype=np.int32).astype(np.int64)

    def compress(self) -> int:
        """Compress the cached content column (if loaded and not yet); returns
        the bytes saved."""
        c = self.cols.get("content")
        if c is None or c[2].data is None:
            return 0
        saved = c[2].compress()
        self.nbytes -= saved
        return saved


def _assemble_at(acc: list, i: int) -> tuple[dict | None, int, str, bool]:
    """(record dict, ord, digest, plain) of row ``i`` of a fully loaded group;
    a malformed row gives (None, ord, reason, False). ``plain``: see
    :func:`_row_digest`."""
    (mid, ch, task, hlc, content, ts, role, tok, tc, tcid, origin, sv, extra, o, dig) = acc
    try:
        tcs = tc(i)
        ex = extra(i)
        calls = [] if tcs == "[]" else _loads(tcs)
        rec = {"msg_id": mid(i), "channel_id": ch(i), "task_id": task(i), "hlc": hlc(i),
               "content": content(i), "ts": ts(i), "role": role(i), "token_estimate": tok(i),
               "tool_calls": calls,
               "tool_call_id": tcid(i), "origin": origin(i), "schema_version": sv(i)}
        ordv = o(i)
        digest = dig(i)
        plain = ex == "{}" and (not calls or _same_spelling(calls, tcs))
        if ex != "{}":
            more = _loads(ex)
            if not isinstance(more, dict):
                return None, ordv, "extra is not a JSON object", False
            rec.update(more)
    except UnicodeDecodeError as exc:
        return None, o(i), f"invalid UTF-8: {exc}", False
    except ValueError as exc:
        return None, o(i), f"bad JSON in tool_calls or extra: {exc}", False
    except IndexError as exc:
        return None, 0, f"offsets out of range: {exc}", False
    return rec, ordv, digest, plain


_LONG_NUMBER = re.compile(r"\d{19}")


def _loads(text: str) -> Any:
    """A stored JSON text (json.dumps wrote it), parsed as json.loads parses
    it: with orjson, unless a run of 19 or more digits may be an integer
    beyond 64 bits (orjson would give a float) or orjson refuses the text."""
    if _LONG_NUMBER.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def _same_spelling(value: Any, text: str) -> bool:
    """True if orjson writes ``value`` (parsed from the stored JSON ``text``,
    which json.dumps wrote) as exactly ``text``: then it spells every number
    as json does, and orjson may make the record's canonical JSON."""
    try:
        return orjson.dumps(value) == text.encode("utf-8")
    except (orjson.JSONEncodeError, UnicodeEncodeError):
        return False


def _row_digest(rec: dict, plain: bool) -> str:
    """The digest of a record read from a file. ``plain`` (no extra fields,
    tool calls that orjson spells as stored) lets orjson make the canonical
    JSON without walking the values: if its bytes hash to the stored digest
    they are the bytes the writer hashed, so the record is the one written."""
    if plain:
        ts = rec["ts"]
        if ts == 0.0 or 1e-4 <= abs(ts) < 1e16:
            try:
                return xxhash.xxh3_128_hexdigest(orjson.dumps(rec, option=orjson.OPT_SORT_KEYS))
            except orjson.JSONEncodeError:
                pass
    return record_digest(rec)


def _assemble_columns(cols: Sequence[Sequence[Any]]) -> list[tuple[dict | None, int, str, bool] | None]:
    """:func:`_assemble_many` of rows already taken: ``cols`` holds the 15
    columns' values of just those rows."""
    return _assemble_many([lambda rs, v=v: v for v in cols], [0] * (len(cols[0]) if cols else 0))


def _assemble_many(takes: list, local: list[int]) -> list[tuple[dict | None, int, str, bool] | None]:
    """_assemble_at for many rows at once, column by column; a row that
    fails to decode is redone alone (to name its problem)."""
    try:
        cols = [t(local) for t in takes]
    except (UnicodeDecodeError, IndexError):
        return [None] * len(local)  # the caller redoes each row with _assemble_at
    out: list[tuple[dict | None, int, str, bool] | None] = []
    loads = _loads
    for (mid, ch, task, hlc, content, ts, role, tok, tc, tcid, origin, sv, extra, o, dig) in zip(*cols):
        try:
            calls = [] if tc == "[]" else loads(tc)
            rec = {"msg_id": mid, "channel_id": ch, "task_id": task, "hlc": hlc,
                   "content": content, "ts": ts, "role": role, "token_estimate": tok,
                   "tool_calls": calls,
                   "tool_call_id": tcid, "origin": origin, "schema_version": sv}
            if extra != "{}":
                more = loads(extra)
                if not isinstance(more, dict):
                    out.append((None, o, "extra is not a JSON object", False))
                    continue
                rec.update(more)
                plain = False
            else:
                plain = not calls or _same_spelling(calls, tc)
        except ValueError as exc:
            out.append((None, o, f"bad JSON in tool_calls or extra: {exc}", False))
            continue
        out.append((rec, o, dig, plain))
    return out


def _table_group(table: pa.Table, path: str = "", first: int = 0) -> _Group:
    g = _Group(table.num_rows)
    g.add(table.select(_COLS), path, first)
    return g


class _Located(NamedTuple):
    no: int
    row: int
