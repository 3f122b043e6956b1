# Declarations of rune_fast._index: the id hash index and the offset arrays.
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

from rf_core cimport rf_msg


cdef struct rf_list:
    # entry numbers of one channel or task; its order is u (hlc == "", in
    # append order) followed by s (by (hlc, msg_id))
    uint32_t *u
    uint32_t nu
    uint32_t cap_u
    uint32_t *s
    uint32_t ns
    uint32_t cap_s
    # copy of the order key (hlc bytes then msg_id bytes) of s[ns - 1], so an
    # in-order append compares without touching the mapped line
    unsigned char *lk
    uint32_t lk_cap
    uint32_t lk_hl
    uint32_t lk_il
    uint32_t lk_ok


cdef struct rf_seg:
    # the attached read-only buffer of one segment (state 0: none, 1: buffer,
    # 2: empty), and a copy of the bytes appended after it (append_bytes) that
    # logically follow it: file offsets [len, len + ov_len)
    Py_buffer view
    const unsigned char *ptr
    int64_t len
    int state
    unsigned char *ov
    int64_t ov_len
    int64_t ov_cap
    # trigram filters of the first gr_n blocks of the buffer (see
    # HotIndex.search), built by the first search that can use them, or
    # read from a kept file: gr_owned, gr was malloc'd; gr_mapped, gr_view
    # holds the buffer (a mapped file) gr pointed into when it was set
    uint64_t *gr
    int64_t gr_n
    bint gr_owned
    bint gr_mapped
    Py_buffer gr_view
    bint growing        # a file another process writes (a viewer's tail): no filters
    # where the complete lines of a file this process writes end (its
    # writer's tail: set_lines_end), -1 unknown: a search's scans and
    # filters stop there, not at the zeros reserved after it
    int64_t lines_end


#: own_calls as a C function (rune_fast._encode.OWN_CALLS_C; HotIndex._window_cached)
ctypedef int (*own_fn)(object) except -1


cdef class HashIndex:
    cdef uint64_t *_c_keys
    cdef int64_t *_c_vals
    cdef uint8_t *_c_used
    cdef size_t _cap
    cdef size_t _n

    cdef int _alloc(self, size_t cap) except -1
    cdef int _room(self, size_t n) except -1
    cdef int _insert(self, uint64_t h, int64_t v) except -1
    cdef void _place(self, uint64_t h, int64_t v) noexcept nogil


cdef struct rf_cslot:
    int64_t loc         # -1: empty
    void *val           # a strong reference (PyObject *)


cdef class LocCache:
    cdef rf_cslot *_c_slots        # open addressing, linear probing, load <= 1/2 (grows)
    cdef uint64_t *_c_serial       # slot -> its insertion number (its place in the ring)
    cdef int64_t *_c_size          # slot -> the bytes its value was put with
    cdef uint64_t _mask            # table size - 1
    cdef int64_t *_c_ring          # insertion order: the loc of insertion s at s % _ring_n
    cdef uint64_t _ring_n
    cdef uint64_t _head            # insertions [_head, _tail) may still be held
    cdef uint64_t _tail
    cdef Py_ssize_t _n
    cdef Py_ssize_t _cap
    cdef int64_t _bytes            # the sum of the held values' sizes
    cdef int64_t _max_bytes        # -1: no bound in bytes
    cdef bint _aged                # an insertion that needs room drops one of the older half
    cdef uint64_t _rng             # xorshift64 state of that choice (fixed seed)

    cdef int64_t _find(self, int64_t loc) noexcept nogil
    cdef void _prefetch(self, int64_t loc) noexcept nogil
    cdef int _drop_for_room(self) except -1
    cdef object _take(self, uint64_t i)
    cdef int _set(self, int64_t loc, object value, int64_t nbytes) except -1
    cdef int _grow_table(self) except -1
    cdef int _grow_ring(self) except -1
    cdef int _compact_ring(self) noexcept nogil
    cdef int _drop_oldest(self) except -1
    cdef list _in_order(self, int what)
    cdef Py_ssize_t _values(self, const int64_t *locs, Py_ssize_t k, void **vals, bint first,
                            list out) except -1


cdef class HotIndex:
    cdef int64_t *_c_locs          # entry -> loc; -1 free; bit 63 set: removed, sweep pending
    cdef uint32_t *_c_lens         # entry -> line length incl. newline; 0: not measured yet
    cdef uint32_t _n_entries
    cdef uint32_t _cap_entries
    cdef uint32_t *_c_free         # free entry numbers
    cdef uint32_t _n_free
    cdef uint32_t _cap_free
    cdef uint64_t *_c_slots        # id table: (hash >> 32) << 32 | (entry + 1); 0 empty
    cdef uint64_t _n_slots
    cdef uint64_t _n_live
    cdef rf_list *_c_chan
    cdef uint32_t _n_chan
    cdef uint32_t _cap_chan
    cdef rf_list *_c_task
    cdef uint32_t _n_task
    cdef uint32_t _cap_task
    cdef rf_seg *_c_segs
    cdef int64_t _n_segs
    cdef int64_t _n_scans          # whole-store searches a trigram filter could serve
    cdef int _c_busy               # a nogil pass is running
    cdef dict _chan_ids
    cdef dict _chan_names          # channel id (str) -> list index, filled by window_read
    cdef list _chan_keys
    cdef dict _task_ids
    cdef list _task_keys
    cdef dict _views               # seg -> memoryview held while attached
    cdef dict _paths               # seg -> path, for error messages
    cdef list _pending_dead
    cdef set _dirty_chan
    cdef set _dirty_task
    cdef object _lazy_tasks        # task arrays of a loaded snapshot, made at first need
    cdef uint32_t *_pend_task      # entries indexed while the task arrays wait: their task
    cdef uint32_t _n_pend_task     # insertions, replayed in order when the arrays are made
    cdef uint32_t _cap_pend_task
    cdef uint32_t _pend_next       # (how many of them were inserted)
    cdef bint _replaying
    cdef void *_map_base           # private map of a loaded snapshot that arrays still live in
    cdef size_t _map_len
    cdef bint _locs_mapped
    cdef bint _lens_mapped
    cdef bint _slots_mapped
    cdef bint _tasks_mapped        # _lazy_tasks points into the map
    # name hash -> list index (+1), verified against the key bytes: the fast
    # path of ingest, without building a bytes object per line
    cdef uint64_t *_c_nmh[2]
    cdef uint32_t *_c_nmi[2]
    cdef uint64_t _nm_cap[2]

    cdef int _guard(self) except -1
    cdef int _ensure_tasks(self) except -1
    cdef int _defer_task(self, uint32_t e) except -1
    cdef int _replay_tasks(self) except -1
    cdef _write_snapshot(self, path, covered, const uint32_t *remap, uint32_t n_new, uint32_t spare,
                         write)
    cdef void _unmap_if_unused(self) noexcept nogil
    cdef object _where(self, int64_t seg)
    cdef int _line_at(self, int64_t loc, const unsigned char **p, size_t *avail) noexcept nogil
    cdef int _line_state(self, int64_t loc, const unsigned char **p, size_t *n,
                         uint32_t length=*) noexcept nogil
    cdef object _line_error(self, int64_t loc, int state)
    cdef int _checked_line(self, int64_t loc, const unsigned char **p, size_t *n,
                           uint32_t length=*) except -1
    cdef void _prefetch_line(self, int64_t loc, uint32_t length=*) noexcept nogil
    cdef int _parse_entry(self, uint32_t e, const unsigned char **p, rf_msg *m) noexcept nogil
    cdef int64_t _find_slot(self, uint64_t h, const unsigned char *key, size_t klen) noexcept nogil
    cdef int64_t _located_slot(self, int64_t loc, uint64_t h) noexcept nogil
    cdef int _table_reserve(self, uint64_t need) except -1
    cdef int _table_fit(self) except -1
    cdef int _table_resize(self, uint64_t nc) except -1
    cdef void _table_put(self, uint64_t h, uint32_t e) noexcept nogil
    cdef void _table_del(self, uint64_t slot) noexcept nogil
    cdef int64_t _new_entry(self, int64_t loc) except -1
    cdef int64_t _list_index(self, bint chan, const unsigned char *key, size_t klen,
                             bint create) except -2
    cdef int _list_insert(self, rf_list *L, uint32_t e, const unsigned char *p, rf_msg *m) except -1
    cdef int64_t _index_line(self, int64_t loc, const unsigned char *p, rf_msg *m, uint64_t h) except -1
    cdef int _kill(self, uint64_t slot) except -1
    cdef int _sweep(self) except -1
    cdef object _locs_of(self, rf_list *L, uint32_t start)
    cdef tuple _hits(self, rf_list *L, uint32_t start, LocCache cache, bint record)
    cdef object _read_records(self, const int64_t *locs, const uint32_t *lens, Py_ssize_t k,
                              LocCache cache, object decode, object cost, Py_ssize_t *decoded)
    cdef object _window_cached(self, str channel_id, Py_ssize_t n, LocCache cache, dict verdicts,
                               object own, own_fn own_c)
    cdef int _grow_entries(self, uint64_t nc) except -1
    cdef int _cmp_entry(self, uint32_t x, const unsigned char *hp, size_t hl,
                        const unsigned char *ip, size_t il, int *out) noexcept nogil
    cdef object _unreadable(self, uint32_t e)
    cdef void _release(self, int64_t seg)
    cdef int64_t _seg_of(self, int64_t seg) except -1
    cdef int _set_lk(self, rf_list *L, const unsigned char *hp, uint32_t hl,
                     const unsigned char *ip, uint32_t il) except -1
    cdef int _nm_put(self, int which, uint64_t h, uint32_t idx) except -1
    cdef object _search_all(self, const unsigned char *nd, size_t m, bint ci, bint na)
    cdef object _ingest_at(self, int64_t seg, const unsigned char *p0, int64_t off0, int64_t n,
                           int64_t min_seq)
