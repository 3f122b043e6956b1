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
# wrong. Building them costs about five plain scans, so a store searched
# once never pays it: the second search that can use them builds them
# (memory: 1/32 of the bytes covered), every later one extends them over
# the blocks since; they are dropped when the segment is detached or
# attached again. The bytes past the last full block are always scanned.
cdef enum:
    GR_BLOCK = 16384
    GR_OVER = 256
    GR_LG = 12                 # 4096 bits a filter
    GR_WORDS = 64


cdef inline bint _region(rf_seg *sg, int reg, const unsigned char **base, int64_t *end,
                         int64_t *off0) noexcept nogil:
    """Region `reg` of an attached segment: 0 its mapped buffer, 1 the bytes
    appended after it (a copy; file offsets from off0). False if empty."""
    if reg == 0:
        if sg.state != 1:
            return False
        base[0], end[0], off0[0] = sg.ptr, sg.len, 0
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
    cdef int64_t stable
    cdef const unsigned char *p = sg.ptr
    if sg.state != 1 or sg.len < GR_BLOCK + GR_OVER + 2:
        return 0
    stable = rf_line_start(p, p + sg.len) - p      # after the last newline
    if stable < GR_BLOCK + GR_OVER + 2:
        return 0
    return (stable - GR_OVER - 2) // GR_BLOCK


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
    w = <uint64_t *>realloc(sg.gr, <size_t>want * GR_WORDS * sizeof(uint64_t))
    if w == NULL:
        return -1
    sg.gr = w
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
