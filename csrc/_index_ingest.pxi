# _index_ingest.pxi: the scan of a segment's lines that HotIndex.ingest
# indexes (each line framed, parsed and its id hashed), and the
# IngestReport it returns.
# (Included by _index.pyx: one extension module, rune_fast._index; its
# cimports, constants and shared helpers are in scope here.)


cdef struct rf_rec:
    int64_t off
    uint32_t len        # the line's bytes with its newline
    uint64_t h
    rf_msg m


@cython.boundscheck(False)
@cython.wraparound(False)
cdef Py_ssize_t _scan_messages(const unsigned char *buf, int64_t pos, int64_t end,
                               rf_rec *recs, Py_ssize_t cap, rf_scan_result *r,
                               bint *more) noexcept nogil:
    """Check, parse and hash up to `cap` message lines of buf[pos:end]."""
    cdef Py_ssize_t n = 0
    cdef const unsigned char *nl
    cdef int64_t ln
    cdef int v
    more[0] = False
    r.torn_offset = -1
    r.damaged_offset = -1
    r.damage = RF_OK
    while pos < end:
        if n == cap:
            more[0] = True
            break
        nl = <const unsigned char *>memchr(buf + pos, b'\n', <size_t>(end - pos))
        if nl == NULL:
            if not rf_all_zero(buf + pos, <size_t>(end - pos)):
                r.torn_offset = pos
            break
        ln = nl - (buf + pos)
        v = rf_check_frame(buf + pos, <size_t>ln)
        if v == RF_OK:
            v = rf_parse_msg(buf + pos, <size_t>ln, &recs[n].m, 1)
        if v != RF_OK:
            r.damaged_offset = pos
            r.damage = v
            break
        recs[n].off = pos
        recs[n].len = <uint32_t>(ln + 1)
        recs[n].h = _xxh.XXH3_64bits(buf + pos + recs[n].m.id_off, recs[n].m.id_len)
        n += 1
        pos += ln + 1
    r.good_end = pos
    return n


class IngestReport:
    """What :meth:`HotIndex.ingest` found in a region of a segment."""

    __slots__ = ("good_end", "torn_offset", "damaged_offset", "damage", "n_lines",
                 "added", "dup_locs", "tombstones", "last_seq")

    def __init__(self, good_end, torn_offset, damaged_offset, damage, n_lines, added,
                 dup_locs, tombstones, last_seq=-1):
        self.good_end = good_end
        self.last_seq = last_seq    # the append sequence of the last message line taken
        self.torn_offset = torn_offset
        self.damaged_offset = damaged_offset
        self.damage = damage
        self.n_lines = n_lines
        self.added = added
        self.dup_locs = dup_locs
        self.tombstones = tombstones

    def __repr__(self):
        return (f"IngestReport(good_end={self.good_end}, torn_offset={self.torn_offset}, "
                f"damaged_offset={self.damaged_offset}, damage={self.damage!r}, "
                f"n_lines={self.n_lines}, added={len(self.added)}, "
                f"dup_locs={len(self.dup_locs)}, tombstones={len(self.tombstones)})")
