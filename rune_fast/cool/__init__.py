"""The cool tier: Parquet archives of cooled conversation messages.

A :class:`CoolArchive` owns the folder ``state_dir/hot/conversation_cool/``.
Each cooling run writes one immutable Parquet file ``cool-<n:08d>.parquet``
(zstd, page checksums on) holding plain record dicts (the output of
``ConversationMessageRecord.to_dict()``) sorted by channel, then task, plus a sidecar
``cool-<n:08d>.idx`` that lets the archive answer id, channel and task queries
without reading every file. The Parquet file is the truth: a missing or
damaged sidecar is rebuilt from it.

Which files are live is the caller's business (the repository's manifest):
the archive opens from a list of names, and every change (``cool_table``,
``erase``, ``merge``) writes new files under new names and returns the new
list. The caller moves its manifest, then calls :meth:`CoolArchive.unlink_files` on the
files it no longer references. A crash at any point leaves the old set or the
new set referenced and intact; files nobody references are strays that
:meth:`CoolArchive.gc` removes.

Every row carries ``digest`` = xxh3_128 of the canonical JSON of its record
dict; every read that returns a row checks it, and a mismatch raises
:class:`~rune_fast.errors.CorruptStateCheckpointError` naming the file and row.
See ``docs/FORMAT.md`` (Cool archive) for the bytes.

The id index is each live file's sidecar's sorted xxh3_64 of its ids, mapped
and searched in place (``IdRuns``: a few probes a file), so ``contains``
(the append path's duplicate check) reads no row on a miss and the stored
id on a hit, and nothing is built at open; the sidecar also keeps each row
group's page directory, so a first exact read parses no page header. Row groups are decoded
column by column, on demand, into compact Python-side views (one ``bytes``
or ``str`` plus int32 offsets per string column) that rows are assembled from
without Arrow scalars; the cache (``cache_bytes``, 8 MiB by default, counted
honestly) compresses the content of its least recently used groups (LZ4
blocks of 16 rows) before it evicts any. Search runs
:func:`rune_fast._search.find_spans` over a group's content bytes;
case-insensitive search is exact Unicode casefolding (see ``search``).

The package, one owner a file: ``schema`` (columns, value types, digests,
names), ``sidecar`` (a file's ``.idx`` and ``.grams``, its footer), ``rows``
(decoded row groups and the rows assembled from them), ``tables`` (record
dicts and hot lines to Arrow), and :class:`CoolArchive` in ``archive`` as a
stack of layers, each above the one it calls: ``files`` (the archive's
state, the live file set, atomic writes, gc) -> ``cache`` (the row-group
cache) -> ``keys`` (rows' order keys and stamps from those columns alone)
-> ``reads`` (queries) -> ``search`` (scans, filters, the scan pool) ->
``writer`` (cool, erase, merge).
"""
from __future__ import annotations

from .archive import CoolArchive
from .writer import plan_merge
from .rows import SPECIAL_FOLD
from .schema import (
    COOL_SCHEMA, CoolChange, CoolProblem, CoolRow, CoolRun, ROW_GROUP_ROWS, StagedMerge, cool_loc,
    index_dir_for, record_digest,
)
from .search import ascii_fold_matcher, relevant_specials
from .tables import table_from_lines


# Private names other modules and the tests reach through the package
# (re-exported so that ``from rune_fast.cool import ...`` keeps working).
from .schema import _IDX_MAGIC, _file_no, _grams_name, _id_hash
from .sidecar import (
    _FileIndex, _build_index, _decode_grams, _encode_grams, _footer_hash, _id_hashes,
)
from .tables import _calls_texts, _table_from_records
from .search import _relevant_specials

__all__ = [
    "CoolArchive",
    "CoolRow",
    "CoolRun",
    "cool_loc",
    "CoolChange",
    "CoolProblem",
    "StagedMerge",
    "record_digest",
    "COOL_SCHEMA",
    "ROW_GROUP_ROWS",
    "SPECIAL_FOLD",
    "ascii_fold_matcher",
    "relevant_specials",
]
