"""The tuning knobs of the conversation store, read at each use (tests lower them).

Every module reads them as ``tuning.NAME`` at call time, never by ``from
tuning import NAME``, so that one assignment here changes them all.
"""
from __future__ import annotations

#: Roll the tail into a sealed segment past this size at a compaction.
ROLL_BYTES = 8 << 20
#: Rewrite a segment (the tail: roll, then rewrite) when less than this
#: fraction of its bytes is live and it is larger than SPARSE_MIN_BYTES: cooled
#: lines do not linger (dead bytes stay under 70% of the hot files), and each
#: line is copied at most 1/(1 - 0.3) times on average. Measured on a bulk
#: load of 100,000 messages: 0.25 left 110-134 MiB on disk at 2.5 bytes
#: written per content byte; 0.4 leaves 94-104 MiB at 2.6-2.8. Measured again
#: in session 27 (the bench's write-amplification job: bulk 100,000 +
#: compact(), 4 runs each, bytes written per content byte): 0.4 3.07-3.20,
#: 0.3 2.88-2.99 (the hot files then 70-77 MB either way); at 1,000,000
#: messages the hot tier is under a tenth of the store.
SPARSE_FRACTION = 0.3
SPARSE_MIN_BYTES = 64 << 10
#: An automatic compaction rewrites one run of sparse segments, of at most
#: this many live bytes (a single segment holding more is rewritten whole;
#: compact() and erasures run up to ROLL_BYTES). Measured at 1,000,000
#: messages (bench/cooling_profile.py, 2 shared cores): runs of up to
#: ROLL_BYTES (8 MiB) took 33-84 ms of CPU, 92-356 ms of one append_many;
#: the bytes copied are the same in smaller runs, spread over more calls.
REWRITE_RUN_BYTES = 2 << 20
#: An automatic cooling run of at least this many messages is written by a
#: background thread (appends go on meanwhile); smaller runs, and every run of
#: an explicit compact(), are written inline (every automatic run with the
#: shipped COOL_DUE_ROWS; smaller windows' runs can be smaller). At 512, on a store of
#: 1,000,000 messages taking single appends (100 channels, the bench's
#: workload) every run (about 250 messages every 250 appends) was written
#: inline, 10-15 ms of one append's time: most of what a durable append
#: costs beyond its write and fdatasync (session 27: the appender's CPU per
#: append in mode "none" 75-88 -> 37-43 us at 128, on the shared machine).
BG_COOL_MIN_ROWS = 128
#: At most this many messages a background cooling run (BG_COOL_MAX_ROWS
#: once the excess holds that many): its lines are copied (and checked)
#: under the lock on appenders' time (a BG_COOL_PART_ROWS part a
#: compaction), and its thread writes each part as it is parsed
#: (``CoolArchive.stage_parts``: the run is never held whole; what it
#: keeps is the columns its adoption reads, ~100 bytes a row). A run takes
#: every channel's excess up to this. The rest of the excess goes in the
#: next runs (each channel's excess is oldest first, channel by channel,
#: so a run cools a prefix of each channel it reaches).
BG_COOL_RUN_ROWS = 16384
#: An automatic compaction cools once the excess over hot_window of every
#: channel together reaches this many messages (windows of 64 or more),
#: in one run of BG_COOL_RUN_ROWS: a file of its merge tier from the start.
#: Each cooling cycle has costs that do not grow with its rows (the run's
#: start and task order, its adoption's syncs and manifest, the segment
#: passes after it: 40-60 ms of appenders' time at 1,000,000 messages).
#: Cooling once a channel's excess reached a quarter window made runs of
#: 1,000-5,000 rows on the bench's store (100 channels, the busiest with
#: 12% of the messages): a cycle every ~4 append_many(1,000) calls (the
#: bench's line at 1,000,000: 10.7 -> 8.0 ms a batch with this).
#: The hot tier then holds up to this many messages beyond the windows.
COOL_DUE_ROWS = 16384
#: A run takes this many messages when the excess holds that many (cooling
#: fell far behind the appends: a bulk load on a machine whose cores the
#: merges and the appender share): its file lands a merge tier above
#: BG_COOL_RUN_ROWS (fanout 4), the merge of four of those saved (merges
#: were 12-14 s of CPU of a bulk load of 1,000,000 messages, cooling 6-7).
#: Runs between the two sizes are not made: a file of, say, 40,000 rows
#: is in the tier of 16,384 (floor(log4(rows)) = 7), and its merge would
#: write its extra rows again for nothing.
BG_COOL_MAX_ROWS = 65536
#: While the last background cooling run left more than this many rows of
#: the excess for the next (cooling is behind the appends), no merge of cool
#: files is started in the background: on 2 cores the merges (12-14 s of
#: CPU in a bulk load of 1,000,000 messages) took the core the cooling runs
#: needed, and the final compact() paid the backlog inline (10 s). The
#: merges go on once cooling caught up, and at compact() and in an idle
#: writer (``IDLE_MERGE_SECONDS``), which need no cooling run.
MERGE_BACKLOG_ROWS = 0
#: ... unless the archive holds more than this many files: then merges go on
#: while cooling is behind (without a bound a bulk load of 10,000,000
#: messages would end with ~150 files of 65,536 rows, each visited by every
#: search and by open, until compact() or an idle writer merged them; the
#: bench's load of 1,000,000 ends with 14-22)
MERGE_WAIT_FILES = 32
#: A background cooling run's lines are copied (and checked) under the
#: lock this many at a time: the compaction that starts the run copies the
#: first part, each automatic compaction after it the next (an append_many
#: of 1,000 runs one), one that waits for the run the rest. Measured at
#: 1,000,000 messages (bench/cooling_profile.py, 2 shared cores): a run of
#: 16,384 lines copied whole took 46-86 ms of CPU, up to 145 ms of one
#: append_many.
BG_COOL_PART_ROWS = 4096
#: An automatic compaction copies the next part of a background cooling
#: run only while its thread holds fewer than this many parts it has not
#: taken yet: the parts otherwise piled up behind a slower thread (a part
#: a call, the thread ~2.5 s a run of 65,536 rows on the shared cores),
#: up to 11 parts of ~2.5 MB of lines each waiting at the peak of a bulk
#: load of 1,000,000 messages (bench/cooling_profile.py). A run still
#: gets a part every call while it keeps up: its parts are copied on
#: appenders' time either way, and one that waits for the run copies
#: the rest.
BG_COOL_QUEUED_PARTS = 2
#: At most this many messages a part of a compaction's inline cooling (its
#: files are written a part at a time, see COOL_FILE_ROWS): a part's lines
#: are copied and parsed whole. Measured with bench/memory_probe.py on a bulk
#: load of 1,000,000 messages: the final compact() cooled what the
#: background runs had left in one run and peaked at 641 bytes a message
#: of resident memory (the appends before it: 204). The file's row groups
#: do not depend on it (the writer cuts them, ``_FileSet._write_parts``),
#: nor does the adoption (``Cooling._cooled`` unindexes a part of this
#: many at a time). 16,384 -> 4,096 (session 30, bench/cooling_profile.py's
#: compact() of 248,800 hot lines on copies of one store, 3 pairs): peak
#: RssAnon growth of the compact() 16-17 -> 14 MiB with the other changes
#: of that session (24 before them), CPU 3.2-3.9 s either way.
COOL_RUN_MAX_ROWS = 4096
#: At most this many messages a file of a compaction's inline cooling, written
#: COOL_RUN_MAX_ROWS lines at a time (``CoolArchive.cool_parts``): a file
#: holds only its index keys whole (12 bytes a row: 3 MB at this size, see
#: ``cool.sidecar._KeyParts``) and the adoption's columns (id, channel, hlc). The compact() after a bulk load of 1,000,000
#: messages wrote 28 files of 16,384 rows (454,000 left by the background
#: runs), each to be merged three times more (fanout 4); files of this size
#: are a tier of their own (log4(262,144) = 9).
COOL_FILE_ROWS = 262144
#: Merge cool files MERGE_FANOUT at a time, each of the same size tier
#: (``floor(log_fanout(rows))``): a row is rewritten about
#: ``log_fanout(rows / run)`` times. Measured on bulk loads of 1,000,000
#: messages (two runs side by side, 2 shared cores), with cooling runs
#: beside merges: fanout 4 left 1.3 s to compact() and peaked at 205
#: bytes a message of resident memory; 8 rewrote less but its merges of
#: 8 files of ~100,000 rows, written beside a cooling run, peaked at 305
#: (a merge holds its rows' ids, channels and tasks for the new file's
#: index). Right after a bulk load more files are left than when
#: compact() merged every full tier (24 against 10 at 1,000,000: see
#: MERGE_INLINE_ROWS); the automatic compactions that follow merge them.
#: Measured again with bench/cooling_profile.py at 1,000,000 (three run
#: pairs, 2 cores shared with other loads, so CPU, not wall): fanout 8
#: cut the merge thread's CPU 13.6-19.6 -> 8.1-9.1 s with the same peak
#: (140-198 against 146-176 bytes a message) and the same cooling, but
#: left 45 files after the final compact() against 27 (24-25 against
#: 20-23 in the first pairs), and 15 against 13 once merged to the end
#: (the idle watcher): searches within the noise, cold task reads 72-85
#: against 89-122 ms (20 tasks of ~900 messages). Kept at 4 for the reads.
MERGE_FANOUT = 4
#: compact() (and close()) merge inline at most MERGE_INLINE_ROWS plus
#: MERGE_INLINE_PER_COOLED rows for each row they cooled; a larger group of
#: files is left to the automatic compactions, which merge it in a thread.
#: Merging every full tier at once made the compact() right after a bulk
#: load of 1,000,000 messages rewrite most of the archive (22 s of 25).
MERGE_INLINE_ROWS = 65536
MERGE_INLINE_PER_COOLED = 4
#: compact() merges inline only groups of fewer rows than this (or than
#: BG_COOL_MIN_ROWS, if more; within the budget above); a larger group is
#: started in the merge thread as compact()
#: returns (one at a time; the automatic compactions, or the next compact(),
#: adopt it and start the next). SPEC asks compact() to cool; merging is our
#: policy. Measured with bench/cooling_profile.py at 1,000,000 messages: the
#: compact() right after the load spent 6.8 of its 12.5 s merging inline
#: (its budget, MERGE_INLINE_PER_COOLED a row cooled: 1.25 million rows).
MERGE_INLINE_GROUP_ROWS = 16384
#: A writer that made no change (append, delete, compact) for this many
#: seconds does what the next automatic compaction would: adopts a merge or
#: cooling run its threads finished, starts the merge of a full tier in the
#: merge thread, cools an excess (``Compaction._idle_loop``). Without it a
#: store closed right after a bulk load (compact() leaves the merges of
#: MERGE_INLINE_GROUP_ROWS rows or more to the thread, and close() cancels
#: them) kept its unmerged files until a later session appended enough: 66
#: cool files at 10,000,000 messages, and a read-mostly store never merged
#: them (every archived search and task read touches each file). The
#: watcher wakes once a period and takes the repository lock only when
#: something is due; None: no watcher (the tests' default, whose schedules
#: are exact).
IDLE_MERGE_SECONDS: float | None = 1.0
#: lines a background cooling run parses per call (see _stage_cooling): a
#: whole part (BG_COOL_PART_ROWS). cool_columns' blocks keep the lines in
#: the caches either way; what the size of a call decides is how often the
#: thread takes the GIL back, and each time it waited for the appender's
#: switch interval (up to 5 ms): at 256 lines a call the thread ran ~15%
#: of its wall time in a bulk load of 1,000,000 and left ~470,000 rows to
#: the final compact() (bench/bulk_ab.py, 2 rounds: that compact() 4.0 ->
#: 3.1 s, the load 11.2-11.3 -> 10.9-11.1 us a message; 1,024: 3.4 s)
PARSE_PART = BG_COOL_PART_ROWS
#: lines compact()'s cooling parses per call (``_cool_table_at``): a whole
#: part (COOL_RUN_MAX_ROWS), for the same reason: the Parquet writer's and
#: the filters' threads wait for the GIL the caller takes back after each
#: call (512 lines a call, chosen for the caches when one thread did the
#: work: 2.45 against 2.7 us a line at 1,024; with those threads, 4,096:
#: the compact() after a bulk load of 1,000,000 3.1 -> 2.9 s)
COOL_PARSE_PART = COOL_RUN_MAX_ROWS
#: close() leaves the index snapshot as it is when it still matches the files
#: (the same sealed segments, tail and cool files) and at most this many
#: changes (appended lines, deletions) came after it: the next open scans those
#: tail lines (about 1 ms, then 3 us a line, measured at 100,000 messages)
#: instead of this close rewriting the whole index (10 ms at 100,000 messages,
#: 70-100 ms and 17 MB at 1,000,000).
SNAPSHOT_SLACK = 256
#: A compaction writes the index snapshot once the changes since the last
#: one (appended lines, cooled and deleted messages) reach this fraction of
#: the hot index's entries (at least 4,096). At 1.0 the lines an open after a
#: crash scans past the snapshot are at most what a rebuild of the whole hot
#: index scans, which every tail roll or segment rewrite asks of the next
#: open anyway until a snapshot follows it. Measured on the bench's bulk
#: load of 100,000 messages (+ compact): 0.25 wrote 8-11 snapshots, 9-12 MB
#: (0.2-0.28 bytes a content byte of the 3.1-3.4 written); 1.0 wrote 4-5,
#: 4-7 MB.
SNAPSHOT_EVERY = 1.0

#: Decoded records kept by location (the newest appends and reads), so a
#: window read decodes nothing; bytes are still checksummed on every read.
#: At most this many entries in each of the two record caches (hot lines,
#: cool rows); what bounds them is their share of the repository's
#: ``cache_bytes`` (see CACHE_BYTES). 8,192 holds the last 8 messages of
#: 1,000 channels: measured on a 1,000,000-message store, window(ch, 8) over
#: random channels takes 7.7 us with it and 52 us with 1,024.
DECODE_CACHE = 8192
#: A search keeps in the decode cache the records of its newest this many
#: hot hits, and decodes the older ones without keeping them: a common
#: needle's unlimited search (33,000 hot hits at 1,000,000 messages) put
#: every hit in, leaving the cache its oldest 8,192 -- neither the next
#: limited search's hits (the newest) nor the windows' records.
SEARCH_KEEP_HITS = 1024
#: append_many keeps at most this many of a batch's records in the decode
#: cache (its newest): a window on the channel of a one-channel batch then
#: stays cached, and a batch of 1,000 over many channels does not put (and
#: push out) 1,000 records that a later read decodes anyway if it asks
#: (measured at 1,000,000 messages: ~0.75 ms of an append_many(1,000)
#: went to caching its records and dropping as many older ones).
APPEND_CACHE_MAX = 64
#: The repository's default ``cache_bytes`` (``cache_bytes=None``) grows
#: with the store: CACHE_MIN_BYTES for its first CACHE_FLOOR_MESSAGES
#: messages taken (its append sequence: known at the open, which reads no
#: cool sidecar) and CACHE_MESSAGE_BYTES for each one beyond, at most
#: CACHE_BYTES (issue 33: never above 64 MiB), recomputed at each open and
#: as appends grow the store by an eighth (``HotReads._scale_caches``). The
#: bound the issue sets is per message (64 bytes of resident memory after
#: the read mix, from 100,000 messages on); a reading process's fixed costs
#: (~2 MB: casefold tables, the archive's first reads, a search's buffers)
#: are ~20 of them at 100,000, hence the floor there (3.25 MiB: the
#: working sets of the bench's windows and gets, the cool rows as lines),
#: and 48 bytes a message beyond: 44.5 MiB at 1,000,000, 48 MiB from
#: 1,080,000 on. (Until session 39 a quarter of the bytes on disk: 16.5
#: MiB at 100,000 messages, whose hot segments are most of their 66 MB,
#: left 165 bytes a message after the read mix; 32 bytes a message from
#: the first, tried in the same session, gave 1,000,000 messages 30.5 MiB
#: and their task loops ~20% slower.) ``_conv.reads.cache_budgets`` splits
#: it between the hot records, the cool records, the cool rows' lines and
#: the row groups (and says why).
#:
#: Measured with bench/cache_scale.py before session 38 (fresh process per
#: setting, the stores of bench/build_10m.py and their read mix: window on
#: every channel, messages_for_task on 1% of tasks, get_message on 10,000
#: ids, five searches; growth of RssAnon per stored message, then each read
#: repeated; 2 shared cores, one run each unless said):
#:
#: ==================  =============  ============  ===============  ==============
#: store, cache_bytes  RssAnon/msg    window alone  window after mix  get (repeated)
#: ==================  =============  ============  ===============  ==============
#: 100,000, 48 MiB     244 B          4.2 us        5.7 us           127 us
#: 100,000, 8 MiB      134 B          5.5 us        37 us            132 us
#: 100,000, 4 MiB      107-108 B      3.2-3.5 us    32-39 us         128-144 us
#: 1,000,000, 48 MiB   76.6 B         3.1 us        6.0 us           155 us
#: 1,000,000, 16 MiB   73.1 B         2.4 us        3.8 us           146 us
#: 1,000,000, 8 MiB    72.2 B         2.6 us        5.6 us           148 us
#: ==================  =============  ============  ===============  ==============
#:
#: A repeated get of the mix's 10,000 ids (mostly archived) is not served by
#: these caches at any size (a cool point read decodes from its row group's
#: pages); a window read alone keeps its working set at 4 MiB; only a window
#: read again after 10,000 gets of other messages finds its records evicted
#: below 48 MiB at 100,000 (the gets' hot records took their place).
CACHE_BYTES = 48 << 20
CACHE_MIN_BYTES = 13 << 18
CACHE_FLOOR_MESSAGES = 100_000
CACHE_MESSAGE_BYTES = 48
#: What a decoded record held in a cache costs beyond ``sys.getsizeof`` of
#: its content: the record object, its other strings, the (record, seq)
#: tuple, the allocators' share -- and per tool call. Measured on the
#: bench's workload at 1,000,000 messages: tracemalloc sees about 580 bytes
#: a record beyond its content (hot lines; 730 for cool rows), resident
#: memory about 1,600 (window reads of 7,583 records: 31 MiB). At 100,000
#: messages (session 39) 6,000 gets' records and lines grew RssAnon by
#: 0.81 of what 1,024 counted: ~1,770 bytes a record, ~1,190 of them its
#: content (the bench's text is 30% non-ASCII, two or four bytes a
#: character in a str). 1,024 until then.
RECORD_OVERHEAD = 640
TOOL_CALL_BYTES = 512
#: What a cool row's line kept in the dense cache costs beyond its length
#: (the bytes object's header, the cache's slot and ring entry, the
#: allocator's rounding). The bench's lines are ~790 bytes.
DENSE_LINE_OVERHEAD = 96
#: A bulk task read keeps what it decodes (its archived rows in the caches
#: of verified cool records, its hot lines in the decode cache) only when
#: the same task was read lately enough that they would still be there
#: (``HotReads._admit_task``): fewer archived rows read by
#: task reads since than the dense cache holds, counting this many bytes a
#: row (a ~900-byte line and DENSE_LINE_OVERHEAD). Reads spread over more
#: tasks than the cache holds (a loop over a few hundred tasks of ~900
#: messages: the lines' share of a 48 MiB budget holds ~8,000 rows) read
#: each from its pages without churning the cache
#: (~1 us a row of insertion and eviction saved). A task of at most
#: 1/TASK_FEW_ROWS of the cache's reach is kept at its first read (a few
#: rows cost the cache little). At most TASK_ASKS_KEPT tasks are remembered
#: (then forgotten all at once). 1/16 (sessions 35-39: tasks of up to 512
#: rows at 1,000,000 messages) kept the bench's loop over 200 tasks its
#: smaller tasks, a tenth of its rows, at ~14 us a row where a read from
#: the pages costs ~3.7 (the keeping re-encodes each row's line), and the
#: loop came round to none of them before they left: messages_for_task
#: 4.43 -> 3.30 ms a call at 1,000,000 (avg 905 messages), 0.55 -> 0.45
#: ms at 100,000 (avg 91), each task once in a fresh process ~4.4 -> ~3.6
#: ms, with 1/256 (session 40).
TASK_ROW_BYTES = 1000
TASK_FEW_ROWS = 256
TASK_ASKS_KEPT = 4096
#: An export (export_ops) reads the archived rows this many at a time,
#: straight from their pages (CoolArchive.records_at: each row group's
#: pages once), holding the archive's lock for one part (~20 ms; an append
#: asks the archive whether its id is archived) and not the repository's.
EXPORT_PART_ROWS = 4096
#: merge_ops appends the messages of the ops this many at a time (each part
#: an append_many: durable on its own, the lock let go between parts).
MERGE_PART = 8192
#: Resident file pages (the segment and tail maps' share) that the hot reads
#: may add before the pages they mapped are released (see ``_release_maps``),
#: looked at every MAP_RELEASE_READS lines decoded from the maps. A read
#: fault maps a whole page-cache folio (64 KiB to 2 MiB on a kernel with
#: large folios; about 110 KiB a read measured on a 1,000,000-message store),
#: so reads spread over 700 MB of segments left them all resident: ~290 of
#: 470 bytes a message after touching every channel once. A release costs
#: one madvise a map (0.15-0.35 ms for that store's 65 maps) and, after it,
#: a fault for each page a read maps again: up to ~110 us for the first read
#: of a cached task of 40 messages. The budget keeps a working set under it
#: mapped (no release at all), and a larger one from growing without bound.
MAP_BUDGET_BYTES = 128 << 20
MAP_RELEASE_READS = 256
#: At most this much of ``cache_bytes`` goes to the decoded Parquet row groups
#: the cool tier keeps (bounded memory, see stats()); 48 MiB held the whole
#: cool tier of a 100,000-message store of the bench's workload.
COOL_CACHE_BYTES = 48 << 20
#: A search with a limit walks every channel's messages from the newest
#: (``_index.NewestWalk``) and stops at ``limit`` hits: a needle in most
#: messages costs ``limit`` lines at any store size. After this many lines
#: (plus 64 a hit asked for) without the hits it wants it scans the
#: segments instead (a rare needle: the scan's filters skip most bytes);
#: and after SEARCH_WALK_PROBE lines without any hit at once.
SEARCH_WALK_LINES = 4096
SEARCH_WALK_PROBE = 256
#: A limited search whose archived hits number at most this many times its
#: limit reads them whole (kept by the decode cache, as an unlimited search
#: does) instead of their order keys first and then the rows it returns: a
#: rare needle's limited search then costs no more than the unlimited one.
SEARCH_COOL_FEW = 4

#: append_many: a batch of at least this many new messages starts the tail's
#: fdatasync in a thread of its own right after its write, and indexes, caches
#: and journals the batch meanwhile (WritePath._write_messages). Smaller
#: batches and single appends sync in the appending thread as before: for
#: them the thread's start costs more than the overlap gains.
SYNC_OVERLAP_MIN = 64
