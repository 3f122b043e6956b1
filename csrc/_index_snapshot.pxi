# _index_snapshot.pxi: the index snapshot file: its atomic write and its
# load from a private map, with every array checked before use
# (HotIndex.save_snapshot and HotIndex.load_snapshot call these).
# (Included by _index.pyx: one extension module, rune_fast._index; its
# cimports, constants and shared helpers are in scope here.)


cdef inline uint32_t _live_number(const uint32_t *remap, uint32_t e) except? 0xFFFFFFFFU:
    if remap[e] == 0xFFFFFFFFU:
        raise RuneError(f"save_snapshot: an array holds the free entry {e}")
    return remap[e]


def _write_atomic(str path, buf) -> None:
    d = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        mv = memoryview(buf)
        while mv:
            n = os.write(fd, mv)
            mv = mv[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(d, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _bad(path, msg, offset=None):
    return CorruptStateCheckpointError(f"index snapshot damaged: {msg}", path=path, offset=offset)


cdef object _load(unsigned char *o, Py_ssize_t total, str path):
    """Load a snapshot from its private map `o[:total]`, which the new index
    owns (unmapped when no array lives in it any more)."""
    cdef Py_ssize_t pos, need, i
    cdef uint32_t meta[4]
    cdef uint32_t n_cov, n_entries, n_chan, n_task
    cdef uint64_t n_slots, n_live, u64, digest
    cdef uint64_t *livebits = NULL
    cdef HotIndex idx = HotIndex()
    idx._map_base = o
    idx._map_len = <size_t>total
    if total < HEADER_LEN or memcmp(o, <const char *>SNAPSHOT_MAGIC, 8) != 0:
        raise _bad(path, "bad magic or short header", 0)
    memcpy(meta, o + 8, 8)
    if meta[0] not in (1, SNAPSHOT_VERSION) or meta[1] != HEADER_LEN:
        raise _bad(path, f"unknown version {meta[0]} (this build reads 1 to {SNAPSHOT_VERSION})", 8)
    cdef uint32_t version = meta[0]
    memcpy(&digest, o + 16, 8)
    memcpy(&u64, o + 24, 8)
    if u64 != <uint64_t>(total - HEADER_LEN):
        raise _bad(path, f"payload of {total - HEADER_LEN} bytes, header says {u64}", 24)
    with nogil:
        u64 = _xxh.XXH3_64bits(o + 24, <size_t>(total - 24))
    if u64 != digest:
        raise _bad(path, "digest mismatch", 16)
    memcpy(meta, o + 32, 16)
    n_cov, n_entries, n_chan, n_task = meta[0], meta[1], meta[2], meta[3]
    memcpy(&n_slots, o + 48, 8)
    memcpy(&n_live, o + 56, 8)
    if n_slots < 16 or n_slots > 0xFFFFFFFF or n_live > n_entries or n_live * 4 > n_slots * 3:
        raise _bad(path, "inconsistent counts", 32)
    need = (HEADER_LEN + 16 * <Py_ssize_t>n_cov + ((8 * <Py_ssize_t>n_entries + 7) & ~7)
            + 8 * <Py_ssize_t>n_slots + 16 * (<Py_ssize_t>n_chan + n_task))
    if need > total:
        raise _bad(path, "file shorter than its counts", total)
    pos = HEADER_LEN
    covered = {}
    cdef int64_t cs, co
    for i in range(n_cov):
        memcpy(&cs, o + pos, 8)
        memcpy(&co, o + pos + 8, 8)
        covered[cs] = co
        pos += 16
    if n_entries:
        # the entry array where it lies (its line lengths too, in _load_arrays)
        idx._c_locs = <int64_t *>(o + pos)
        idx._locs_mapped = 1
        idx._cap_entries = n_entries
    pos += (8 * n_entries + 7) & ~7
    idx._n_entries = n_entries
    if n_live < n_entries and _all_free(idx._c_locs + n_live, n_entries - n_live):
        # as many free entries at the end as are not live: the spare ones
        # save_snapshot leaves for the appends after an open, capacity rather
        # than free entries (the entries before them are then checked all live)
        idx._n_entries = <uint32_t>n_live
    # live entries as a bitmap (the checks below then stay in cache), unless
    # every entry is live, as in every snapshot of version 2
    if n_live != idx._n_entries:
        livebits = <uint64_t *>calloc((<size_t>n_entries >> 6) + 1, 8)
        if livebits == NULL:
            raise MemoryError("load_snapshot: entry bitmap")
    try:
        _load_arrays(idx, o, pos, total, idx._n_entries, n_entries, n_slots, n_live, n_chan, n_task, path,
                     livebits, version)
    finally:
        free(livebits)
    idx._unmap_if_unused()
    return idx, covered


cdef bint _all_free(const int64_t *locs, uint64_t n) noexcept:
    """Whether ``locs[:n]`` are all free (-1)."""
    cdef uint64_t j
    for j in range(n):
        if locs[j] != -1:
            return False
    return True


cdef int _load_arrays(HotIndex idx, const unsigned char *o, Py_ssize_t pos, Py_ssize_t total,
                      uint32_t n_entries, uint32_t n_stored, uint64_t n_slots, uint64_t n_live,
                      uint32_t n_chan, uint32_t n_task, str path, uint64_t *livebits,
                      uint32_t version) except -1:
    """The arrays after the entry array; ``n_entries`` of the ``n_stored``
    entries the file holds are in use (the rest are spare capacity)."""
    cdef uint32_t j, x
    cdef uint64_t live = 0, used = 0, s, u64
    cdef int64_t loc
    cdef Py_ssize_t i, keys_len = 0, nlist = 0
    cdef uint32_t meta[4]
    if livebits == NULL:
        # every entry in use (the spare ones after them aside) is live: none may be free
        u64 = rf_first_negative(idx._c_locs, n_entries)
        if u64 != n_entries:
            raise _bad(path, f"entry {u64} has a bad location" if idx._c_locs[u64] != -1
                       else "live entry count mismatch", pos)
    else:
        # one pass: live bitmap and free list (sized by the header's count, checked after)
        _grow_u32(&idx._c_free, &idx._cap_free, n_entries - <uint32_t>n_live)
        for j in range(n_entries):
            loc = idx._c_locs[j]
            if loc >= 0:
                live += 1
                livebits[j >> 6] |= (<uint64_t>1) << (j & 63)
            elif loc != -1:
                raise _bad(path, f"entry {j} has a bad location", pos)
            elif idx._n_free < n_entries - <uint32_t>n_live:
                idx._c_free[idx._n_free] = j
                idx._n_free += 1
        if live != n_live:
            raise _bad(path, "live entry count mismatch", 56)
    # the id table where it lies (8-aligned: every section is)
    free(idx._c_slots)
    idx._c_slots = <uint64_t *>(o + pos)
    idx._slots_mapped = 1
    idx._n_slots = n_slots
    pos += 8 * n_slots
    u64 = rf_check_slots(idx._c_slots, n_slots, livebits, n_entries, &used)
    if u64 != n_slots:
        raise _bad(path, f"id table slot {u64} names a bad entry")
    if used != n_live:
        raise _bad(path, "id table count mismatch")
    idx._n_live = n_live
    # the channel and task arrays: their sizes first (meta: length, unstamped, key length)
    cdef Py_ssize_t meta_pos = pos, chan_keys = 0, chan_list = 0, kstart
    for i in range(n_chan + n_task):
        memcpy(meta, o + pos, 16)
        pos += 16
        if meta[1] > meta[0]:
            raise _bad(path, "array with more unstamped entries than entries", pos - 16)
        keys_len += meta[2]
        nlist += meta[0]
        if i < n_chan:
            chan_keys += meta[2]
            chan_list += meta[0]
    kstart = pos
    pos += (keys_len + 7) & ~7
    if pos + 4 * nlist > total:
        raise _bad(path, "file shorter than its arrays", total)
    _load_lists(idx, True, o + meta_pos, o + kstart, o + pos, n_chan, n_entries, livebits, path, pos)
    pos += 4 * chan_list
    pos = (pos + 7) & ~7
    # the task arrays wait for the first call that needs them (see _ensure_tasks):
    # an open followed by window reads never pays for 25,000 tasks
    # (offsets into the map, which stays while they are pending)
    if n_task:
        idx._lazy_tasks = (meta_pos + 16 * n_chan, kstart + chan_keys, pos, n_task,
                           None if livebits == NULL else
                           PyBytes_FromStringAndSize(<const char *>livebits, 8 * ((n_entries >> 6) + 1)),
                           n_entries, path, pos)
        idx._tasks_mapped = 1
    pos += 4 * (nlist - chan_list)
    pos = (pos + 7) & ~7
    if version >= 2:
        # the line lengths (version 1 has none: they are measured when needed)
        if pos + 4 * <Py_ssize_t>n_stored > total:
            raise _bad(path, "file shorter than its line lengths", total)
        if n_stored:
            idx._c_lens = <uint32_t *>(o + pos)       # where they lie, like the entries
            idx._lens_mapped = 1
        pos += (4 * <Py_ssize_t>n_stored + 7) & ~7
    elif n_stored:
        idx._c_lens = <uint32_t *>calloc(<size_t>n_stored, sizeof(uint32_t))
        if idx._c_lens == NULL:
            raise MemoryError("load_snapshot: line lengths")
    if pos != total:
        raise _bad(path, f"{total - pos} bytes past the last array", pos)
    return 0


cdef int _load_lists(HotIndex idx, bint chan, const unsigned char *metas, const unsigned char *keys,
                     const unsigned char *arrays, uint32_t count, uint32_t n_entries,
                     const uint64_t *livebits, str path, Py_ssize_t where) except -1:
    """Make the `count` channel (or task) arrays of a snapshot: metas (16 bytes
    each), their keys back to back, their entry numbers back to back; every
    entry checked against the snapshot's live entries."""
    cdef uint32_t meta[4]
    cdef uint32_t i, j, x, nlen, nun, klen
    cdef int64_t li
    cdef rf_list *L
    cdef Py_ssize_t kp = 0, ap = 0
    for i in range(count):
        memcpy(meta, metas + 16 * <Py_ssize_t>i, 16)
        nlen, nun, klen = meta[0], meta[1], meta[2]
        li = idx._list_index(chan, keys + kp, klen, True)
        if li != i:
            raise _bad(path, f"duplicate key {PyBytes_FromStringAndSize(<const char *>keys + kp, klen)!r}")
        kp += klen
        L = &idx._c_chan[li] if chan else &idx._c_task[li]
        if nun:
            _grow_u32(&L.u, &L.cap_u, nun)
            memcpy(L.u, arrays + ap, 4 * nun)
        if nlen - nun:
            _grow_u32(&L.s, &L.cap_s, nlen - nun)
            memcpy(L.s, arrays + ap + 4 * nun, 4 * (nlen - nun))
        L.nu = nun
        L.ns = nlen - nun
        for j in range(nlen):
            x = _at(L, j)
            if x >= n_entries or (livebits != NULL and not (livebits[x >> 6] >> (x & 63)) & 1):
                raise _bad(path, f"array of {idx._chan_keys[li] if chan else idx._task_keys[li]!r} "
                                 f"names a bad entry", where + ap)
        ap += 4 * <Py_ssize_t>nlen
    return 0
