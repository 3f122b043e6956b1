# _index_search.pxi: the scan of a whole-store search over the attached
# segments: the trigram filters of their blocks and the region scans
# that HotIndex.search and HotIndex.scan_segment run without the GIL.
# (Included by _index.pyx: one extension module, rune_fast._index; its
# cimports, constants and shared helpers are in scope here.)


# ---- trigram filters of hot segments (search over every channel) ----------
#
# A whole-store search scans every attached segment. Block b of a segment's
# buffer (GR_BLOCK bytes) gets a filter of the trigrams starting in it or in
# the GR_OVER bytes after it (rf_gram: ASCII letters lowercased): a needle of
# 3 to GR_OVER + 2 bytes that starts in block b has every trigram in b's
# filter, so a block whose filter lacks one is skipped without reading its
# bytes. Only a segment attached as not growing gets filters: a tail another
# process writes may show a line's newline before the bytes before it
# (string stores are not ordered), and a filter built then would stay
# wrong. A writer's own tail gets them over its complete lines, up to the
# end its writer sets (set_lines_end), past which only reserved zeros lie.
# Building them costs about five plain scans, so a store searched
# once never pays it: the second search that can use them builds them
# (memory: 1/32 of the bytes covered), every later one extends them over
# the blocks since; they are dropped when the segment is detached or
# attached again (but for a writer's tail remapped: attach's keep_lines).
# The bytes past the last full block are always scanned.
cdef enum:
    GR_BLOCK = 16384
    GR_OVER = 256
    GR_LG = 12                 # 4096 bits a filter
    GR_WORDS = 64


cdef inline int64_t _seg_end(rf_seg *sg) noexcept nogil:
    """Where the lines of segment `sg`'s buffer end as far as a search goes:
    its writer's lines end where set (set_lines_end: the zeros a tail
    reserves after its lines hold none), else the buffer's end."""
    if 0 <= sg.lines_end < sg.len:
        return sg.lines_end
    return sg.len


cdef inline bint _region(rf_seg *sg, int reg, const unsigned char **base, int64_t *end,
                         int64_t *off0) noexcept nogil:
    """Region `reg` of an attached segment: 0 its mapped buffer, 1 the bytes
    appended after it (a copy; file offsets from off0). False if empty."""
    if reg == 0:
        if sg.state != 1:
            return False
        base[0], end[0], off0[0] = sg.ptr, _seg_end(sg), 0
    else:
        if sg.state == 0 or sg.ov_len == 0:
            return False
        base[0], end[0], off0[0] = sg.ov, sg.ov_len, sg.len
    return True


#: (GR_BLOCK, GR_OVER, GR_LG, GR_WORDS): a kept filters file names them, so
#: one made by a build that cut blocks otherwise is not taken
SEARCH_FILTER_LAYOUT = (GR_BLOCK, GR_OVER, GR_LG, GR_WORDS)


cdef int64_t _gr_blocks(rf_seg *sg) noexcept nogil:
    """The blocks of segment `sg` whose filters can be built (see _gr_build)."""
    cdef int64_t stable, end = _seg_end(sg)
    cdef const unsigned char *p = sg.ptr
    if sg.state != 1 or end < GR_BLOCK + GR_OVER + 2:
        return 0
    stable = rf_line_start(p, p + end) - p      # after the last newline
    if stable < GR_BLOCK + GR_OVER + 2:
        return 0
    return (stable - GR_OVER - 2) // GR_BLOCK


cdef void _gr_drop(rf_seg *sg) noexcept:
    """Forget the filters of segment `sg` (freed, or their map released)."""
    if sg.gr_owned:
        free(sg.gr)
    if sg.gr_mapped:
        PyBuffer_Release(&sg.gr_view)
    sg.gr = NULL
    sg.gr_n = 0
    sg.gr_owned = False
    sg.gr_mapped = False


cdef int _gr_build(rf_seg *sg) noexcept nogil:
    """Extend the filters of segment `sg` over every full block of its buffer
    that lies before its last newline (block b needs bytes up to (b + 1) *
    GR_BLOCK + GR_OVER + 2): a mapped tail goes on past its lines (zeros the
    writer's appends overwrite, or a line being written), and only complete
    lines never change. 0, or -1 when memory runs out (the filters stay as
    they were)."""
    cdef int64_t want, b
    cdef uint64_t *w
    cdef const unsigned char *p = sg.ptr
    want = _gr_blocks(sg)
    if want <= sg.gr_n:
        return 0
    if sg.gr_owned or sg.gr == NULL:
        w = <uint64_t *>realloc(sg.gr, <size_t>want * GR_WORDS * sizeof(uint64_t))
    else:                   # mapped from a kept file: a copy grows (the map goes at _gr_drop)
        w = <uint64_t *>malloc(<size_t>want * GR_WORDS * sizeof(uint64_t))
        if w != NULL and sg.gr_n:
            memcpy(w, sg.gr, <size_t>sg.gr_n * GR_WORDS * sizeof(uint64_t))
    if w == NULL:
        return -1
    sg.gr = w
    sg.gr_owned = True
    memset(w + sg.gr_n * GR_WORDS, 0, <size_t>(want - sg.gr_n) * GR_WORDS * sizeof(uint64_t))
    cdef rf_gram_acc acc
    for b in range(sg.gr_n, want):
        rf_gram_acc_init(&acc, sg.gr + b * GR_WORDS, GR_LG)
        rf_gram_acc_add(&acc, p + b * GR_BLOCK, GR_BLOCK + GR_OVER + 2)
        rf_gram_acc_done(&acc)
    sg.gr_n = want
    return 0


cdef inline bint _gr_may(const uint64_t *w, const uint32_t *hs, size_t k) noexcept nogil:
    """Does a filter hold each of the k trigram bits hs?"""
    cdef size_t i
    for i in range(k):
        if not (w[hs[i] >> 6] >> (hs[i] & 63)) & 1:
            return False
    return True


cdef int _scan_region(const unsigned char *base, int64_t *ppos, int64_t hi, int64_t end,
                      const unsigned char *nd, size_t m, bint ci, bint na, int64_t seg, int64_t off0,
                      rf_i64vec *hits, rf_i64vec *bad) noexcept nogil:
    """The candidate lines of base[0:end) whose match (of the needle, or with
    `na` a non-ASCII byte) starts in [*ppos, hi): each line whose content holds
    the needle joins `hits`, a line that does not parse joins `bad` (locs of
    segment `seg`, whose offset of base[0] is off0). *ppos ends past the last
    line seen (end if a final line has no newline). Nonzero on memory error."""
    cdef int64_t pos = ppos[0], lim, loc, ln
    cdef const unsigned char *p
    cdef const unsigned char *c
    cdef const unsigned char *nl
    cdef const unsigned char *nh = NULL
    cdef const unsigned char *hb = NULL
    cdef rf_msg msg
    cdef int oom = 0
    # needle matches starting before hi lie within base[:lim]
    lim = hi + <int64_t>m - 1 if m else hi
    if lim > end:
        lim = end
    while pos < hi and not oom:
        # jump to the next line that can match: a needle candidate or (with
        # na) a non-ASCII byte; each stream scans forward once
        p = base + pos
        if nh == NULL or nh < p:
            nh = rf_find(p, <size_t>(lim - pos), nd, m, ci) if lim > pos else NULL
            if nh == NULL:
                nh = base + end
        c = nh
        if na:
            if hb == NULL or hb < p:
                hb = rf_find_nonascii(p, <size_t>(hi - pos))
                if hb == NULL:
                    hb = base + end
            if hb < c:
                c = hb
        if c >= base + hi:
            pos = hi
            break
        p = rf_line_start(base, c)
        nl = <const unsigned char *>memchr(c, b'\n', <size_t>(base + end - c))
        if nl == NULL:
            pos = end          # a torn or in-flight final line: never indexed
            break
        ln = nl - p
        loc = (seg << 40) | (off0 + (p - base))
        # checksums are checked when a hit is read (line()); a candidate line
        # that does not even parse is damage if live
        if rf_parse_msg(p, <size_t>ln, &msg, 0) != RF_OK:
            oom = rf_i64vec_push(bad, loc)
        elif msg.kind == b'm':
            c = p + msg.content_off
            if rf_content_has(c, nl, nd, m, ci) or (na and rf_has_nonascii(c, <size_t>(nl - c))):
                oom = rf_i64vec_push(hits, loc)
        pos = (nl - base) + 1
    if pos > ppos[0]:
        ppos[0] = pos
    return oom


cdef size_t _needle_grams(const unsigned char *nd, size_t m, uint32_t *hs) noexcept nogil:
    """The trigram bits of a needle of 3 to GR_OVER + 2 bytes into hs (room
    for GR_OVER); returns how many (m - 2): what _scan_blocks tests."""
    cdef size_t k
    for k in range(m - 2):
        hs[k] = rf_gram(nd[k], nd[k + 1], nd[k + 2], GR_LG)
    return m - 2


cdef int _scan_blocks(rf_seg *sg, const unsigned char *base, int64_t *ppos, int64_t end,
                      const unsigned char *nd, size_t m, bint ci, bint na, int64_t seg,
                      const uint32_t *hs, size_t k, rf_i64vec *hits, rf_i64vec *bad) noexcept nogil:
    """_scan_region over the runs of blocks of sg's mapped buffer (region 0:
    file offset 0) whose filters hold the k trigram bits hs; *ppos ends at or
    past the last filtered block, from where the caller scans the rest
    plainly. Nonzero on memory error."""
    cdef int64_t pos = ppos[0], b = 0, b2
    cdef int oom = 0
    while b < sg.gr_n and not oom and pos < end:
        if not _gr_may(sg.gr + b * GR_WORDS, hs, k):
            b += 1
            continue
        b2 = b + 1     # a run of candidate blocks: one pass
        while b2 < sg.gr_n and _gr_may(sg.gr + b2 * GR_WORDS, hs, k):
            b2 += 1
        if pos < b * GR_BLOCK:
            pos = b * GR_BLOCK
        oom = _scan_region(base, &pos, b2 * GR_BLOCK, end, nd, m, ci, na, seg, 0, hits, bad)
        b = b2
    if pos < b * GR_BLOCK:
        pos = b * GR_BLOCK
    ppos[0] = pos
    return oom


cdef inline bint _bsearch(const int64_t *v, size_t n, int64_t x) noexcept nogil:
    cdef size_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if v[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo < n and v[lo] == x


# ---- newest first: the order of a search's hits ---------------------------
#
# A search with a limit wants the newest hits only. Its order is the one
# rule of rune_fast._order over every channel: unstamped messages by their
# append sequence (the line's "s"; -1 where a line has none), before the
# stamped ones by (hlc, msg_id) as the strings spell them (rf_cmp_json); a
# tie (lines without "s") keeps the order of the whole search's hit list:
# channel by channel in channel order, each in its own order. NewestWalk
# merges the channels' order arrays from their newest ends (a heap of one
# cursor a channel) and tests each line for the needle, so the newest
# `limit` hits of a needle in every message cost `limit` lines whatever
# the size of the store. order_sort puts the hits of a full scan in that
# order. Both read the order keys from the line bytes, never from records.

cdef struct rf_okey:
    # the order key of one line, pointing into its bytes
    const unsigned char *hp
    const unsigned char *ip
    int64_t seq
    int64_t loc
    int64_t rank          # place in the search's hit list order (ties)
    uint32_t hl
    uint32_t il


cdef inline int _okey_cmp(const rf_okey *a, const rf_okey *b) noexcept nogil:
    """<0, 0, >0 as line a sorts before, with, after line b."""
    cdef int c
    if a.hl == 0 or b.hl == 0:
        if a.hl != 0:
            return 1
        if b.hl != 0:
            return -1
        if a.seq != b.seq:
            return -1 if a.seq < b.seq else 1
    else:
        c = rf_cmp_json(a.hp, a.hl, b.hp, b.hl)
        if c == 0:
            c = rf_cmp_json(a.ip, a.il, b.ip, b.il)
        if c != 0:
            return c
    return (a.rank > b.rank) - (a.rank < b.rank)


cdef int _okey_qsort_cmp(const void *a, const void *b) noexcept nogil:
    return _okey_cmp(<const rf_okey *>a, <const rf_okey *>b)


cdef extern from "<stdlib.h>" nogil:
    void qsort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *) noexcept nogil)


cdef int _okey_of(HotIndex ix, int64_t loc, rf_okey *k, const unsigned char **line,
                  const unsigned char **nl, uint32_t *content_off, bint check) noexcept nogil:
    """Fill k with the order key of the message line at loc (and give the
    line, its newline and where its content starts); -1 if the line is not
    a parsed message line, -2 if its segment is not attached, and with
    `check` the verdict of its frame check (> 0) if it fails it."""
    cdef const unsigned char *p
    cdef const unsigned char *e
    cdef size_t avail
    cdef rf_msg m
    cdef int v
    if ix._line_at(loc, &p, &avail) != 0:
        return -2
    if avail > RF_MAX_LINE:
        avail = RF_MAX_LINE
    e = <const unsigned char *>memchr(p, b'\n', avail)
    if e == NULL:
        return -1
    if check:
        v = rf_check_frame(p, <size_t>(e - p))
        if v != RF_OK:
            return v
    if rf_parse_msg(p, <size_t>(e - p), &m, 0) != RF_OK:
        return -1
    k.hp = p + m.hlc_off
    k.hl = m.hlc_len
    k.ip = p + m.id_off
    k.il = m.id_len
    k.seq = rf_line_seq(p, <size_t>(e - p)) if m.hlc_len == 0 else -1
    k.loc = loc
    line[0] = p
    nl[0] = e
    content_off[0] = m.content_off
    return 0


cdef object _unreadable_loc(HotIndex ix, int64_t loc, int why):
    if why == -2:
        return RuneError(f"search: segment {loc >> 40} is not attached")
    if why > 0:
        return CorruptStateCheckpointError(f"line fails its check: {rf_reason(why).decode()}",
                                           path=ix._where(loc >> 40), offset=loc & OFF_MASK)
    return CorruptStateCheckpointError("search: indexed line is not a readable message line",
                                       path=ix._where(loc >> 40), offset=loc & OFF_MASK)


def order_sort(HotIndex index not None, locs):
    """The hit locations `locs` (int64s: a search's hits in its list order)
    sorted by the order of messages, oldest first, from their lines' bytes
    (ties keep the given order). CorruptStateCheckpointError (file, offset)
    for a line that is not a readable message line."""
    cdef const int64_t[::1] ls = np.ascontiguousarray(locs, dtype=np.int64)
    cdef Py_ssize_t n = ls.shape[0], i
    cdef rf_okey *ks
    cdef const unsigned char *p
    cdef const unsigned char *e
    cdef uint32_t co
    cdef int bad = 0
    cdef int64_t bad_loc = -1
    out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out
    cdef int64_t[::1] ov = out
    index._guard()
    ks = <rf_okey *>malloc(<size_t>n * sizeof(rf_okey))
    if ks == NULL:
        raise MemoryError(f"order_sort: {n} keys")
    index._c_busy = 1
    try:
        with nogil:
            for i in range(n):
                bad = _okey_of(index, ls[i], &ks[i], &p, &e, &co, False)
                if bad != 0:
                    bad_loc = ls[i]
                    break
                ks[i].rank = i
            if bad == 0:
                qsort(ks, <size_t>n, sizeof(rf_okey), _okey_qsort_cmp)
                for i in range(n):
                    ov[i] = ks[i].loc
        if bad != 0:
            raise _unreadable_loc(index, bad_loc, bad)
        return out
    finally:
        index._c_busy = 0
        free(ks)


def live_locs(HotIndex index not None, locs, ch_key=None):
    """The `locs` (int64s, a segment scan's message lines, live or not) that
    are indexed messages (of the channel `ch_key`, if given), in the given
    order, each once: the id on the line names it in the id table. Lines
    that do not parse are not indexed messages (the line check of a search
    raised for any live one)."""
    cdef const int64_t[::1] ls = np.ascontiguousarray(locs, dtype=np.int64)
    cdef Py_ssize_t n = ls.shape[0], i
    cdef bytes ck = _key_bytes(ch_key, "ch_key") if ch_key is not None else None
    cdef const unsigned char *cp = <const unsigned char *>PyBytes_AS_STRING(ck) if ck is not None else NULL
    cdef size_t cl = <size_t>PyBytes_GET_SIZE(ck) if ck is not None else 0
    cdef const unsigned char *p
    cdef size_t avail
    cdef rf_msg m
    cdef int64_t slot, k = 0, loc
    cdef const unsigned char *e
    out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out
    cdef int64_t[::1] ov = out
    index._guard()
    index._c_busy = 1
    try:
        with nogil:
            for i in range(n):
                loc = ls[i]
                if index._line_at(loc, &p, &avail) != 0:
                    continue
                if avail > RF_MAX_LINE:
                    avail = RF_MAX_LINE
                e = <const unsigned char *>memchr(p, b'\n', avail)
                if e == NULL or rf_parse_msg(p, <size_t>(e - p), &m, 0) != RF_OK or m.kind != b'm':
                    continue
                if cp != NULL and (m.ch_len != cl or memcmp(p + m.ch_off, cp, cl) != 0):
                    continue
                slot = index._find_slot(_xxh.XXH3_64bits(p + m.id_off, m.id_len), p + m.id_off, m.id_len)
                if slot < 0 or index._c_locs[(index._c_slots[slot] & 0xFFFFFFFFULL) - 1] != loc:
                    continue
                if k and _bsearch_any(&ov[0], k, loc):
                    continue
                ov[k] = loc
                k += 1
        return out[:k].copy()
    finally:
        index._c_busy = 0


cdef inline bint _bsearch_any(const int64_t *v, int64_t n, int64_t x) noexcept nogil:
    # (a plain scan: duplicates are rare and the lists short)
    cdef int64_t i
    for i in range(n):
        if v[i] == x:
            return True
    return False


def contents(HotIndex index not None, locs):
    """The escaped content bytes (between the quotes) of the message lines
    at `locs`, as a list of bytes: what a fold check of a candidate reads
    (no record is built). CorruptStateCheckpointError (file, offset) for a
    line that is not a readable message line."""
    cdef const unsigned char *p
    cdef const unsigned char *e
    cdef size_t avail
    cdef rf_msg m
    cdef int64_t loc
    out = []
    index._guard()
    for loc in locs:
        if index._line_at(loc, &p, &avail) != 0:
            raise _unreadable_loc(index, loc, -2)
        if avail > RF_MAX_LINE:
            avail = RF_MAX_LINE
        e = <const unsigned char *>memchr(p, b'\n', avail)
        if e == NULL or rf_parse_msg(p, <size_t>(e - p), &m, 1) != RF_OK:
            raise _unreadable_loc(index, loc, -1)
        out.append(PyBytes_FromStringAndSize(<const char *>p + m.content_off, m.content_len))
    return out


cdef struct rf_cur:
    # a channel's cursor of a NewestWalk: the entry at position j of its
    # order (u then s), and that line's order key
    rf_okey k
    const unsigned char *line
    const unsigned char *nl
    uint32_t content_off
    uint32_t li
    int64_t j


cdef enum:
    # NewestWalk.next() states
    W_MORE = 0          # more lines may hold hits
    W_DONE = 1          # every line of the channels was visited
    W_BUDGET = 2        # the visit budget is spent: scan instead
    W_UNORDERED = 3     # a channel's unstamped lines are out of sequence order: scan and sort instead

WALK_MORE, WALK_DONE, WALK_BUDGET, WALK_UNORDERED = W_MORE, W_DONE, W_BUDGET, W_UNORDERED


cdef class NewestWalk:
    """The hit candidates of a search over the hot index, newest first (the
    order of rune_fast._order over every channel, see order_sort), found by
    walking every channel's order array from its newest end and testing each
    line's content: a line holding `needle` (ASCII-case-blind with `ci`) is
    an exact candidate; one holding one of `probes` (exact bytes; ASCII-
    case-blind with `probe_ci`), or with
    `na` any byte >= 0x80, is a candidate the caller checks. ``next(want)``
    gives the next `want` candidates. Every line the walk reaches is
    checked (its frame's checksum) before its key is trusted: a line it
    does not reach lies behind, in its channel's order, every line it
    reached, so a limited search needs no check of the other lines. Valid
    while the index does not change:
    the caller holds the repository's lock from the first call to the last.
    After `budget` lines visited it stops (WALK_BUDGET): a rare needle is
    found faster by a scan of the segments."""

    cdef HotIndex _ix
    cdef rf_cur *_c_cur
    cdef uint32_t *_c_heap
    cdef uint32_t _n_heap
    cdef bytes _nd
    cdef bint _ci
    cdef bint _na
    cdef bint _has_nd
    cdef const unsigned char *_c_nd
    cdef size_t _nd_len
    cdef list _probes
    cdef bint _probe_ci
    cdef const unsigned char **_c_pp
    cdef size_t *_c_pl
    cdef Py_ssize_t _n_probes
    cdef int64_t _visited
    cdef int64_t _budget
    cdef int _state
    cdef int64_t _bad_loc
    cdef int _bad

    def __cinit__(self, HotIndex index not None, needle, bint ci, probes=(), bint na=False, ch_key=None,
                  int64_t budget=-1, bint probe_ci=False):
        cdef Py_ssize_t i
        cdef uint32_t li, n, c = 0, e
        cdef bytearray nd
        self._ix = index
        self._has_nd = needle is not None
        if self._has_nd:
            nd = bytearray(_key_bytes(needle, "needle"))
            if ci:
                for i in range(len(nd)):
                    nd[i] = rf_lower(nd[i])
            self._nd = bytes(nd)
        else:
            self._nd = b""
        self._c_nd = <const unsigned char *>PyBytes_AS_STRING(self._nd)
        self._nd_len = <size_t>PyBytes_GET_SIZE(self._nd)
        self._ci = ci
        self._na = na
        self._probes = [_key_bytes(p, "probe").lower() if probe_ci else _key_bytes(p, "probe") for p in probes]
        self._probe_ci = probe_ci
        self._n_probes = len(self._probes)
        self._budget = budget
        self._c_pp = <const unsigned char **>malloc(<size_t>(self._n_probes + 1) * sizeof(void *))
        self._c_pl = <size_t *>malloc(<size_t>(self._n_probes + 1) * sizeof(size_t))
        if self._c_pp == NULL or self._c_pl == NULL:
            raise MemoryError("NewestWalk: probes")
        for i in range(self._n_probes):
            self._c_pp[i] = <const unsigned char *>PyBytes_AS_STRING(self._probes[i])
            self._c_pl[i] = <size_t>PyBytes_GET_SIZE(self._probes[i])
        index._guard()
        if ch_key is None:
            lo, hi = 0, index._n_chan
        else:
            idx = index._chan_ids.get(_key_bytes(ch_key, "ch_key"))
            lo, hi = (0, 0) if idx is None else (idx, idx + 1)
        n = <uint32_t>(hi - lo)
        self._c_cur = <rf_cur *>calloc(<size_t>n + 1, sizeof(rf_cur))
        self._c_heap = <uint32_t *>malloc((<size_t>n + 1) * sizeof(uint32_t))
        if self._c_cur == NULL or self._c_heap == NULL:
            raise MemoryError(f"NewestWalk: {n} channels")
        # ask for every channel's newest line first: loading them one after
        # the other waited for each line's memory in turn (after a pass that
        # left the caches cold, 100 channels: ~130 -> ~110 us)
        for li in range(<uint32_t>lo, <uint32_t>hi):
            if _len(&index._c_chan[li]) != 0:
                e = _at(&index._c_chan[li], _len(&index._c_chan[li]) - 1)
                index._prefetch_line(index._c_locs[e], index._c_lens[e])
        for li in range(<uint32_t>lo, <uint32_t>hi):
            if _len(&index._c_chan[li]) == 0:
                continue
            self._c_cur[c].li = li
            self._c_cur[c].j = <int64_t>_len(&index._c_chan[li]) - 1
            if self._load(c) != 0:
                raise _unreadable_loc(index, self._bad_loc, self._bad)
            self._push(c)
            c += 1
        self._state = W_MORE if self._n_heap else W_DONE

    def __dealloc__(self):
        free(self._c_cur)
        free(self._c_heap)
        free(self._c_pp)
        free(self._c_pl)

    cdef int _load(self, uint32_t c) noexcept nogil:
        """Read the key of cursor c's entry; nonzero (and _bad set) if its line does not read."""
        cdef rf_cur *u = &self._c_cur[c]
        cdef rf_list *L = &self._ix._c_chan[u.li]
        cdef int64_t loc = self._ix._c_locs[_at(L, <uint32_t>u.j)]
        cdef int r = _okey_of(self._ix, loc, &u.k, &u.line, &u.nl, &u.content_off, True)
        if r != 0:
            self._bad = r
            self._bad_loc = loc
            return r
        # ties between channels: the later channel's line is the later hit,
        # and within a channel the later position
        u.k.rank = (<int64_t>u.li << 32) | u.j
        return 0

    cdef inline bint _newer(self, uint32_t a, uint32_t b) noexcept nogil:
        return _okey_cmp(&self._c_cur[a].k, &self._c_cur[b].k) > 0

    cdef void _push(self, uint32_t c) noexcept nogil:
        cdef uint32_t i = self._n_heap, parent
        self._n_heap += 1
        while i > 0:
            parent = (i - 1) >> 1
            if not self._newer(c, self._c_heap[parent]):
                break
            self._c_heap[i] = self._c_heap[parent]
            i = parent
        self._c_heap[i] = c

    cdef void _sift_top(self) noexcept nogil:
        cdef uint32_t i = 0, l, r, best, c = self._c_heap[0], n = self._n_heap
        while True:
            l = 2 * i + 1
            if l >= n:
                break
            r = l + 1
            best = r if r < n and self._newer(self._c_heap[r], self._c_heap[l]) else l
            if not self._newer(self._c_heap[best], c):
                break
            self._c_heap[i] = self._c_heap[best]
            i = best
        self._c_heap[i] = c

    cdef int _test(self, rf_cur *u) noexcept nogil:
        """2: an exact candidate, 1: a candidate to check, 0: no match."""
        cdef const unsigned char *s = u.line + u.content_off
        cdef Py_ssize_t i
        if self._has_nd and rf_content_has(s, u.nl, self._c_nd, self._nd_len, self._ci):
            return 2
        for i in range(self._n_probes):
            if rf_content_has(s, u.nl, self._c_pp[i], self._c_pl[i], self._probe_ci):
                return 1
        if self._na and rf_has_nonascii(s, <size_t>(u.nl - s)):
            return 1
        return 0

    cdef int _step(self, Py_ssize_t want, rf_i64vec *out, rf_i64vec *flags) noexcept nogil:
        """Visit lines until `want` candidates are out or the walk stops."""
        cdef uint32_t c
        cdef rf_cur *u
        cdef int t
        cdef int64_t seq
        cdef uint32_t hl
        while self._state == W_MORE and <Py_ssize_t>out.n < want:
            if self._n_heap == 0:
                self._state = W_DONE
                break
            if self._budget >= 0 and self._visited >= self._budget:
                self._state = W_BUDGET
                break
            c = self._c_heap[0]
            u = &self._c_cur[c]
            self._visited += 1
            t = self._test(u)
            if t:
                if rf_i64vec_push(out, u.k.loc) or rf_i64vec_push(flags, t):
                    return -1
            # the cursor moves to the channel's next older line
            seq = u.k.seq
            hl = u.k.hl
            u.j -= 1
            if u.j < 0:
                self._n_heap -= 1
                if self._n_heap:
                    self._c_heap[0] = self._c_heap[self._n_heap]
                    self._sift_top()
                continue
            if self._load(c) != 0:
                self._state = -1
                break
            if u.k.hl == 0 and hl == 0 and u.k.seq > seq:
                self._state = W_UNORDERED
                break
            self._sift_top()
        return 0

    def next(self, Py_ssize_t want):
        """(locs, exact, state): up to `want` more candidates, newest first
        (int64 locations; a bool array, True where the line holds the needle
        itself, False where the caller must check it), and the walk's state
        after them (WALK_*). A line that does not read raises
        CorruptStateCheckpointError (file, offset)."""
        cdef rf_i64vec out, flags
        cdef int r
        memset(&out, 0, sizeof(out))
        memset(&flags, 0, sizeof(flags))
        self._ix._guard()
        self._ix._c_busy = 1
        try:
            with nogil:
                r = self._step(want, &out, &flags)
            if r != 0:
                raise MemoryError("NewestWalk.next")
            if self._state == -1:
                raise _unreadable_loc(self._ix, self._bad_loc, self._bad)
            return _vec_array(&out), _vec_array(&flags) == 2, self._state
        finally:
            self._ix._c_busy = 0
            free(out.v)
            free(flags.v)

    @property
    def visited(self) -> int:
        """Lines visited so far."""
        return self._visited

    @property
    def budget(self) -> int:
        """Lines the walk may visit in all (-1: no bound); raising it lets
        a walk that stopped at WALK_BUDGET go on."""
        return self._budget

    @budget.setter
    def budget(self, int64_t value):
        self._budget = value
        if self._state == W_BUDGET and (value < 0 or self._visited < value):
            self._state = W_MORE if self._n_heap else W_DONE
