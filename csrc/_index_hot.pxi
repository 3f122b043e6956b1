# _index_hot.pxi: HotIndex, the index of every live message line of the
# hot tier and the tail (id table, entry arrays, per channel and per
# task lists), and the helpers of its growable arrays.
# (Included by _index.pyx: one extension module, rune_fast._index; its
# cimports, constants and shared helpers are in scope here.)

cdef extern from "Python.h":
    object PyObject_GenericGetDict(object o, void *context)
    PyObject *PyDict_GetItem(object d, object key)
    void *PyCapsule_GetPointer(object capsule, const char *name) except? NULL
    ctypedef int PyLockStatus
    ctypedef void *PyThread_type_lock
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds,
                                             int intr_flag) nogil
    void PyThread_release_lock(PyThread_type_lock lock) nogil
    unsigned long PyThread_get_thread_ident() nogil
    int PY_LOCK_ACQUIRED
    PyObject *Py_False      # (a cast <PyObject *>False would be the C 0)

cdef extern from *:
    """
    /* _thread.RLock's instance as CPython 3.11 lays it out
       (Modules/_threadmodule.c); used only when _rlock_probe finds the
       fields where they are said to be */
    typedef struct {
        PyObject_HEAD
        void *rlock_lock;
        unsigned long rlock_owner;
        unsigned long rlock_count;
        PyObject *in_weakreflist;
    } rf_rlock;
    """
    ctypedef struct rf_rlock:
        void *rlock_lock
        unsigned long rlock_owner
        unsigned long rlock_count


# lines remove_lines asks for ahead of the one it checks
cdef enum:
    _REMOVE_AHEAD = 16

# lines gather_lines asks for ahead of the one it checks
cdef enum:
    _GATHER_AHEAD = 8

# what HotIndex._line_state finds wrong with a line (a failed checksum or
# frame: the negated rf_check_frame verdict)
cdef enum:
    _LINE_NEGATIVE = 1
    _LINE_DETACHED = 2
    _LINE_PAST_END = 3
    _LINE_NO_NEWLINE = 4


cdef inline uint32_t _len(rf_list *L) noexcept nogil:
    return L.nu + L.ns


cdef inline uint32_t _at(rf_list *L, uint32_t i) noexcept nogil:
    # the i-th entry in order: unstamped ones first
    return L.u[i] if i < L.nu else L.s[i - L.nu]


cdef void *_grown(void *arr, bint *mapped, size_t old_bytes, size_t new_bytes, str what) except NULL:
    """``arr`` grown to ``new_bytes``: reallocated, or, if it lives in a
    snapshot's map (``mapped``, cleared here), copied to the heap."""
    cdef void *p
    if mapped[0]:
        p = malloc(new_bytes)
        if p != NULL:
            memcpy(p, arr, old_bytes)
            mapped[0] = 0
    else:
        p = realloc(arr, new_bytes)
    if p == NULL:
        raise MemoryError(f"HotIndex: cannot grow the {what} array to {new_bytes} bytes")
    return p


cdef int _grow_u32(uint32_t **arr, uint32_t *cap, uint32_t need) except -1:
    cdef uint64_t nc
    cdef uint32_t *p
    if need <= cap[0]:
        return 0
    nc = <uint64_t>cap[0] + (cap[0] >> 2) + 4
    if nc < need:
        nc = need
    if nc > 0xFFFFFFFFULL:
        raise RuneError("HotIndex: more than 2**32 entries")
    p = <uint32_t *>realloc(arr[0], <size_t>nc * sizeof(uint32_t))
    if p == NULL:
        raise MemoryError(f"HotIndex: cannot grow an array to {nc} entries")
    arr[0] = p
    cap[0] = <uint32_t>nc
    return 0


cdef void _free_lists(rf_list *lists, uint32_t n) noexcept nogil:
    """Free an array of channel or task lists and what each holds."""
    cdef uint32_t i
    if lists == NULL:
        return
    for i in range(n):
        free(lists[i].u)
        free(lists[i].s)
        free(lists[i].lk)
    free(lists)


cdef class HotIndex:
    """Index of every live message line of the hot tier and the tail.

    Per message it keeps 8 bytes of location, a slot in the id table (8 bytes,
    load <= 0.75) and one 4-byte entry in its channel's array (and its task's).
    Keys are the escaped JSON bytes of the ids (``codec.key``).
    """

    def __cinit__(self):
        self._chan_ids = {}
        self._chan_names = {}
        self._chan_keys = []
        self._task_ids = {}
        self._task_keys = []
        self._views = {}
        self._paths = {}
        self._pending_dead = []
        self._dirty_chan = set()
        self._dirty_task = set()
        self._lazy_tasks = None
        self._table_reserve(1)

    def __dealloc__(self):
        cdef uint32_t i
        cdef int64_t s
        if self._c_segs != NULL:
            for s in range(self._n_segs):
                if self._c_segs[s].state == 1:
                    PyBuffer_Release(&self._c_segs[s].view)
                free(self._c_segs[s].ov)
                _gr_drop(&self._c_segs[s])
            free(self._c_segs)
        _free_lists(self._c_chan, self._n_chan)
        _free_lists(self._c_task, self._n_task)
        if not self._locs_mapped:
            free(self._c_locs)
        if not self._lens_mapped:
            free(self._c_lens)
        free(self._pend_task)
        free(self._c_free)
        if not self._slots_mapped:
            free(self._c_slots)
        if self._map_base != NULL:
            munmap(self._map_base, self._map_len)
        for i in range(2):
            free(self._c_nmh[i])
            free(self._c_nmi[i])

    # ---- internals -------------------------------------------------------

    cdef int _ensure_tasks(self) except -1:
        """Make the task arrays a snapshot left for later (a no-op otherwise),
        then insert the entries indexed since. Called before anything reads or
        changes a task array, and before any entry is removed (the arrays name
        entries as the snapshot knew them)."""
        if self._lazy_tasks is None:
            return self._replay_tasks() if self._n_pend_task else 0
        saved = self._lazy_tasks
        metas, keys, arrays, n_task, live, n_entries, path, where = saved
        cdef const unsigned char *o = <const unsigned char *>self._map_base
        cdef const uint64_t *lv = NULL          # NULL: every entry was live
        if live is not None:
            lv = <const uint64_t *>PyBytes_AS_STRING(live)
        self._lazy_tasks = None      # _load_lists makes the arrays through _list_index
        self._replaying = 1          # (which must not replay the pending entries meanwhile)
        try:
            _load_lists(self, False, o + <Py_ssize_t>metas, o + <Py_ssize_t>keys, o + <Py_ssize_t>arrays,
                        n_task, n_entries, lv, path, where)
        except BaseException:
            _free_lists(self._c_task, self._n_task)
            self._c_task = NULL
            self._n_task = self._cap_task = 0
            self._task_ids.clear()
            del self._task_keys[:]
            free(self._c_nmh[1])
            free(self._c_nmi[1])
            self._c_nmh[1] = NULL
            self._c_nmi[1] = NULL
            self._nm_cap[1] = 0
            self._lazy_tasks = saved     # every later call fails the same way
            raise
        finally:
            self._replaying = 0
        self._tasks_mapped = 0
        self._unmap_if_unused()
        return self._replay_tasks() if self._n_pend_task else 0

    cdef int _replay_tasks(self) except -1:
        """The task insertions of the entries indexed while the arrays waited,
        in order (all live: a removal makes the arrays first). An entry whose
        line no longer reads raises, now and at every later task call."""
        cdef uint32_t e
        cdef const unsigned char *p
        cdef rf_msg m
        cdef int64_t ti
        if self._replaying:
            return 0
        self._replaying = 1
        try:
            while self._pend_next < self._n_pend_task:
                e = self._pend_task[self._pend_next]
                if self._parse_entry(e, &p, &m) != 0:
                    raise self._unreadable(e)
                ti = self._list_index(False, p + m.task_off, m.task_len, True)
                self._list_insert(&self._c_task[ti], e, p, &m)
                self._pend_next += 1
        finally:
            self._replaying = 0
        free(self._pend_task)
        self._pend_task = NULL
        self._n_pend_task = self._cap_pend_task = self._pend_next = 0
        return 0

    cdef int _defer_task(self, uint32_t e) except -1:
        """Leave entry e's task insertion for _ensure_tasks (the arrays wait)."""
        _grow_u32(&self._pend_task, &self._cap_pend_task, self._n_pend_task + 1)
        self._pend_task[self._n_pend_task] = e
        self._n_pend_task += 1
        return 0

    cdef void _unmap_if_unused(self) noexcept nogil:
        """Drop the snapshot's private map once no array lives in it."""
        if (self._map_base != NULL and not self._locs_mapped and not self._lens_mapped
                and not self._slots_mapped and not self._tasks_mapped):
            munmap(self._map_base, self._map_len)
            self._map_base = NULL
            self._map_len = 0

    cdef int _guard(self) except -1:
        if self._c_busy:
            raise RuneError("HotIndex is in use by another thread (calls must be serialised)")
        return 0

    cdef object _where(self, int64_t seg):
        path = self._paths.get(seg)
        return path if path is not None else f"segment {seg}"

    cdef int _line_at(self, int64_t loc, const unsigned char **p, size_t *avail) noexcept nogil:
        cdef int64_t seg = (loc & LOC_MASK) >> 40, off = loc & OFF_MASK
        cdef rf_seg *sg
        if seg >= self._n_segs or self._c_segs[seg].state == 0:
            return -1
        sg = &self._c_segs[seg]
        if off < sg.len:
            p[0] = sg.ptr + off
            avail[0] = <size_t>(sg.len - off)
            return 0
        off -= sg.len
        if off < sg.ov_len:
            p[0] = sg.ov + off
            avail[0] = <size_t>(sg.ov_len - off)
            return 0
        return -1

    cdef void _prefetch_line(self, int64_t loc, uint32_t length=0) noexcept nogil:
        """Ask for the line at loc: its `length` bytes (at most 4 KiB), or its
        first 256 if that is not known (0). A read that checks many lines far
        apart asks for each before checking the first, so that their memory
        latencies overlap."""
        cdef const unsigned char *p
        cdef size_t avail, j, want = 256 if length == 0 else min(length, 4096)
        if self._line_at(loc, &p, &avail) == 0:
            j = 0
            while j < avail and j < want:
                rf_prefetch(p + j)
                j += 64

    cdef int _parse_entry(self, uint32_t e, const unsigned char **p, rf_msg *m) noexcept nogil:
        cdef size_t avail
        if self._line_at(self._c_locs[e], p, &avail) != 0:
            return -1
        if avail > RF_MAX_LINE:
            avail = RF_MAX_LINE
        if rf_parse_msg(p[0], avail, m, 0) != RF_OK:
            return -1
        return 0

    cdef int64_t _find_slot(self, uint64_t h, const unsigned char *key, size_t klen) noexcept nogil:
        """Slot of the id `key` (hash h), -1 if absent, -2 if a candidate line
        cannot be read (its segment is not attached)."""
        cdef uint64_t tag = h >> 32, n = self._n_slots
        cdef uint64_t i = _home(tag, n), s
        cdef const unsigned char *p
        cdef size_t avail
        while True:
            s = self._c_slots[i]
            if s == 0:
                return -1
            if (s >> 32) == tag:
                if self._line_at(self._c_locs[(s & 0xFFFFFFFFULL) - 1], &p, &avail) != 0:
                    return -2
                if (avail > RF_ID_OFF + klen and p[RF_ID_OFF + klen] == b'"'
                        and memcmp(p + RF_ID_OFF, key, klen) == 0):
                    return <int64_t>i
            i += 1
            if i == n:
                i = 0

    cdef int _table_reserve(self, uint64_t need) except -1:
        cdef uint64_t nc
        if self._c_slots != NULL and need * 4 <= self._n_slots * 3:
            return 0
        nc = self._n_slots + (self._n_slots >> 1)
        if nc < need * 10 // 7 + 1:
            nc = need * 10 // 7 + 1
        return self._table_resize(nc)

    cdef int _table_fit(self) except -1:
        """Shrink the id table to half full once under a sixth of it is in use:
        a hot tier that cooled most of what a bulk load put in it kept a
        table sized for the peak (900,000 slots for 51,500 hot messages at
        1,000,000 stored: 7 MB resident, and 87% of the index snapshot that
        every open reads and hashes)."""
        if self._n_slots <= 1024 or self._n_live * 6 >= self._n_slots:
            return 0
        return self._table_resize(self._n_live * 2 + 16)

    cdef int _table_resize(self, uint64_t nc) except -1:
        cdef uint64_t i, j, s, old_n = self._n_slots
        cdef uint64_t *old = self._c_slots
        cdef uint64_t *slots
        if nc < 16:
            nc = 16
        if nc > 0xFFFFFFFFULL:
            raise RuneError("HotIndex: id table would exceed 2**32 slots")
        slots = <uint64_t *>calloc(<size_t>nc, sizeof(uint64_t))
        if slots == NULL:
            raise MemoryError(f"HotIndex: cannot allocate an id table of {nc} slots")
        for i in range(old_n):
            s = old[i]
            if s:
                j = _home(s >> 32, nc)
                while slots[j]:
                    j += 1
                    if j == nc:
                        j = 0
                slots[j] = s
        if self._slots_mapped:
            self._slots_mapped = 0
            self._unmap_if_unused()
        else:
            free(old)
        self._c_slots = slots
        self._n_slots = nc
        return 0

    cdef void _table_put(self, uint64_t h, uint32_t e) noexcept nogil:
        cdef uint64_t tag = h >> 32, n = self._n_slots
        cdef uint64_t i = _home(tag, n)
        while self._c_slots[i]:
            i += 1
            if i == n:
                i = 0
        self._c_slots[i] = (tag << 32) | (<uint64_t>e + 1)

    cdef void _table_del(self, uint64_t i) noexcept nogil:
        cdef uint64_t n = self._n_slots, j = i, k, s
        while True:
            j += 1
            if j == n:
                j = 0
            s = self._c_slots[j]
            if s == 0:
                break
            k = _home(s >> 32, n)
            if (i < k <= j) if i <= j else (i < k or k <= j):
                continue
            self._c_slots[i] = s
            i = j
        self._c_slots[i] = 0

    cdef int64_t _new_entry(self, int64_t loc) except -1:
        cdef uint32_t e
        if self._n_free:
            self._n_free -= 1
            e = self._c_free[self._n_free]
        else:
            if self._n_entries == 0xFFFFFFFEULL:
                raise RuneError("HotIndex: more than 2**32 - 2 entries")
            if self._n_entries == self._cap_entries:
                self._grow_entries(<uint64_t>self._cap_entries + (self._cap_entries >> 2) + 64)
            e = self._n_entries
            self._n_entries += 1
        self._c_locs[e] = loc
        self._c_lens[e] = 0
        return e

    cdef int _grow_entries(self, uint64_t nc) except -1:
        if nc <= self._cap_entries:
            return 0
        if nc > 0xFFFFFFFFULL:
            nc = 0xFFFFFFFFULL
        # (an array that still lives in the snapshot's private map moves out)
        self._c_locs = <int64_t *>_grown(self._c_locs, &self._locs_mapped, self._cap_entries * sizeof(int64_t),
                                         nc * sizeof(int64_t), "entry")
        self._c_lens = <uint32_t *>_grown(self._c_lens, &self._lens_mapped, self._cap_entries * sizeof(uint32_t),
                                          nc * sizeof(uint32_t), "length")
        self._unmap_if_unused()
        memset(self._c_lens + self._cap_entries, 0, (<size_t>nc - self._cap_entries) * sizeof(uint32_t))
        self._cap_entries = <uint32_t>nc
        return 0

    cdef int64_t _list_index(self, bint chan, const unsigned char *key, size_t klen,
                             bint create) except -2:
        cdef int which = 0 if chan else 1
        cdef uint64_t h = _xxh.XXH3_64bits(key, klen), mask, i
        cdef uint32_t x
        cdef list keys
        cdef bytes k
        cdef rf_list *arr
        cdef uint32_t n, cap
        if not chan and (self._lazy_tasks is not None or (self._n_pend_task and not self._replaying)):
            self._ensure_tasks()
        keys = self._chan_keys if chan else self._task_keys
        if self._nm_cap[which]:
            mask = self._nm_cap[which] - 1
            i = h & mask
            while True:
                x = self._c_nmi[which][i]
                if x == 0:
                    break
                if self._c_nmh[which][i] == h:
                    k = <bytes>PyList_GET_ITEM(keys, x - 1)
                    if <size_t>PyBytes_GET_SIZE(k) == klen and memcmp(PyBytes_AS_STRING(k), key, klen) == 0:
                        return x - 1
                i = (i + 1) & mask
        if not create:
            return -1
        k = PyBytes_FromStringAndSize(<const char *>key, klen)
        n = self._n_chan if chan else self._n_task
        cap = self._cap_chan if chan else self._cap_task
        if n == cap:
            cap = cap + (cap >> 2) + 8
            arr = <rf_list *>realloc(self._c_chan if chan else self._c_task,
                                     cap * sizeof(rf_list))
            if arr == NULL:
                raise MemoryError("HotIndex: cannot grow the channel/task table")
            if chan:
                self._c_chan = arr
                self._cap_chan = cap
            else:
                self._c_task = arr
                self._cap_task = cap
        arr = self._c_chan if chan else self._c_task
        memset(&arr[n], 0, sizeof(rf_list))
        self._nm_put(which, h, n)
        (self._chan_ids if chan else self._task_ids)[k] = n
        keys.append(k)
        if chan:
            self._n_chan += 1
        else:
            self._n_task += 1
        return n

    cdef int _nm_put(self, int which, uint64_t h, uint32_t idx) except -1:
        cdef uint64_t cap = self._nm_cap[which], nc, i, j, mask
        cdef uint64_t *nh
        cdef uint32_t *ni
        cdef uint32_t count = (self._n_chan if which == 0 else self._n_task) + 1
        if <uint64_t>count * 4 > cap * 3:
            nc = cap * 2 if cap else 16
            nh = <uint64_t *>calloc(<size_t>nc, sizeof(uint64_t))
            ni = <uint32_t *>calloc(<size_t>nc, sizeof(uint32_t))
            if nh == NULL or ni == NULL:
                free(nh)
                free(ni)
                raise MemoryError("HotIndex: name table")
            mask = nc - 1
            for i in range(cap):
                if self._c_nmi[which][i]:
                    j = self._c_nmh[which][i] & mask
                    while ni[j]:
                        j = (j + 1) & mask
                    nh[j] = self._c_nmh[which][i]
                    ni[j] = self._c_nmi[which][i]
            free(self._c_nmh[which])
            free(self._c_nmi[which])
            self._c_nmh[which] = nh
            self._c_nmi[which] = ni
            self._nm_cap[which] = nc
            cap = nc
        mask = cap - 1
        i = h & mask
        while self._c_nmi[which][i]:
            i = (i + 1) & mask
        self._c_nmh[which][i] = h
        self._c_nmi[which][i] = idx + 1
        return 0

    cdef int _cmp_entry(self, uint32_t x, const unsigned char *hp, size_t hl,
                        const unsigned char *ip, size_t il, int *out) noexcept nogil:
        """out = order of entry x against the key (hlc, id); -1 if x is unreadable."""
        cdef const unsigned char *p
        cdef rf_msg m
        cdef int c
        if self._parse_entry(x, &p, &m) != 0:
            return -1
        c = rf_cmp_json(p + m.hlc_off, m.hlc_len, hp, hl)
        if c == 0:
            c = rf_cmp_json(p + m.id_off, m.id_len, ip, il)
        out[0] = c
        return 0

    cdef int _list_insert(self, rf_list *L, uint32_t e, const unsigned char *p, rf_msg *m) except -1:
        cdef uint32_t pos, lo, hi, mid
        cdef const unsigned char *lp
        cdef rf_msg lm
        cdef int c = 0
        cdef const unsigned char *hp = p + m.hlc_off
        cdef const unsigned char *ip = p + m.id_off
        if m.hlc_len == 0:
            # unstamped: append order, always at the end of u
            if L.nu == L.cap_u:
                _grow_u32(&L.u, &L.cap_u, L.nu + 1)
            L.u[L.nu] = e
            L.nu += 1
            return 0
        pos = L.ns
        if L.ns:
            if not L.lk_ok:
                if self._parse_entry(L.s[L.ns - 1], &lp, &lm) != 0:
                    raise (self._unreadable(L.s[L.ns - 1]))
                self._set_lk(L, lp + lm.hlc_off, lm.hlc_len, lp + lm.id_off, lm.id_len)
            c = rf_cmp_json(L.lk, L.lk_hl, hp, m.hlc_len)
            if c == 0:
                c = rf_cmp_json(L.lk + L.lk_hl, L.lk_il, ip, m.id_len)
            if c > 0:
                # out of order: binary search for the first element after the key
                lo = 0
                hi = L.ns - 1
                while lo < hi:
                    mid = lo + (hi - lo) // 2
                    if self._cmp_entry(L.s[mid], hp, m.hlc_len, ip, m.id_len, &c) != 0:
                        raise (self._unreadable(L.s[mid]))
                    if c > 0:
                        hi = mid
                    else:
                        lo = mid + 1
                pos = lo
        if L.ns == L.cap_s:
            _grow_u32(&L.s, &L.cap_s, L.ns + 1)
        if pos < L.ns:
            memmove(L.s + pos + 1, L.s + pos, (L.ns - pos) * sizeof(uint32_t))
        L.s[pos] = e
        L.ns += 1
        if pos == L.ns - 1:
            self._set_lk(L, hp, m.hlc_len, ip, m.id_len)
        return 0

    cdef int _set_lk(self, rf_list *L, const unsigned char *hp, uint32_t hl,
                     const unsigned char *ip, uint32_t il) except -1:
        cdef unsigned char *p
        if hl + il > L.lk_cap:
            p = <unsigned char *>realloc(L.lk, hl + il)
            if p == NULL:
                raise MemoryError("HotIndex: order key")
            L.lk = p
            L.lk_cap = hl + il
        if hl:
            memcpy(L.lk, hp, hl)
        if il:
            memcpy(L.lk + hl, ip, il)
        L.lk_hl = hl
        L.lk_il = il
        L.lk_ok = 1
        return 0

    cdef object _unreadable(self, uint32_t e):
        """The error for an indexed line that cannot be parsed: RuneError if its
        segment is not attached, else CorruptStateCheckpointError (file, offset)."""
        cdef int64_t loc = self._c_locs[e] & LOC_MASK
        cdef int64_t seg = loc >> 40
        if seg >= self._n_segs or self._c_segs[seg].state == 0:
            return RuneError(f"indexed line at offset {loc & OFF_MASK} of segment {seg} cannot "
                             f"be read: the segment is not attached")
        return CorruptStateCheckpointError("indexed line is no longer a readable message line",
                                           path=self._where(seg), offset=loc & OFF_MASK)

    cdef int64_t _index_line(self, int64_t loc, const unsigned char *p, rf_msg *m, uint64_t h) except -1:
        """Index the checked, parsed message line p at loc (its id is not indexed);
        returns its entry."""
        cdef int64_t e, ci, ti
        self._table_reserve(self._n_live + 1)
        e = self._new_entry(loc)
        self._table_put(h, <uint32_t>e)
        self._n_live += 1
        ci = self._list_index(True, p + m.ch_off, m.ch_len, True)
        self._list_insert(&self._c_chan[ci], <uint32_t>e, p, m)
        if m.task_len:
            if self._lazy_tasks is not None:
                self._defer_task(<uint32_t>e)
            else:
                ti = self._list_index(False, p + m.task_off, m.task_len, True)
                self._list_insert(&self._c_task[ti], <uint32_t>e, p, m)
        return e

    cdef int _kill(self, uint64_t slot) except -1:
        """Drop the entry in `slot` from the id table now; its channel and task
        arrays drop it at the next _sweep."""
        cdef uint32_t e = <uint32_t>((self._c_slots[slot] & 0xFFFFFFFFULL) - 1)
        cdef const unsigned char *p
        cdef rf_msg m
        cdef int64_t ci, ti
        self._ensure_tasks()
        if self._parse_entry(e, &p, &m) != 0:
            # a damaged line can still be removed: its channel and task are
            # unknown, so every array drops it at the sweep
            err = self._unreadable(e)
            if isinstance(err, CorruptStateCheckpointError):
                self._dirty_chan.update(range(self._n_chan))
                self._dirty_task.update(range(self._n_task))
            else:
                raise err
        else:
            ci = self._list_index(True, p + m.ch_off, m.ch_len, False)
            if ci >= 0:
                self._dirty_chan.add(ci)
            if m.task_len:
                ti = self._list_index(False, p + m.task_off, m.task_len, False)
                if ti >= 0:
                    self._dirty_task.add(ti)
        self._table_del(slot)
        self._c_locs[e] |= DEAD_BIT
        self._pending_dead.append(e)
        self._n_live -= 1
        return 0

    cdef int _sweep(self) except -1:
        cdef uint32_t i, k, nu, x
        cdef rf_list *L
        cdef int64_t idx
        cdef bint chan
        if not self._pending_dead and not self._dirty_chan and not self._dirty_task:
            return 0
        self._ensure_tasks()     # (a no-op: whatever made work here made the task arrays)
        for chan, dirty in ((True, self._dirty_chan), (False, self._dirty_task)):
            for idx in dirty:
                L = &self._c_chan[idx] if chan else &self._c_task[idx]
                k = 0
                for i in range(L.nu):
                    x = L.u[i]
                    if self._c_locs[x] >= 0:
                        L.u[k] = x
                        k += 1
                L.nu = k
                k = 0
                for i in range(L.ns):
                    x = L.s[i]
                    if self._c_locs[x] >= 0:
                        L.s[k] = x
                        k += 1
                L.ns = k
                L.lk_ok = 0
            dirty.clear()
        _grow_u32(&self._c_free, &self._cap_free, self._n_free + len(self._pending_dead))
        for x in self._pending_dead:
            self._c_locs[x] = -1
            self._c_free[self._n_free] = x
            self._n_free += 1
        self._pending_dead.clear()
        return self._table_fit()

    cdef object _locs_of(self, rf_list *L, uint32_t start):
        arr = np.empty(_len(L) - start, dtype=np.int64)
        cdef int64_t[::1] out = arr
        cdef uint32_t i
        for i in range(start, _len(L)):
            out[i - start] = self._c_locs[_at(L, i)]
        return arr

    cdef tuple _hits(self, rf_list *L, uint32_t start, LocCache cache, bint record):
        """``(locs, hits, misses)`` of the entries ``[start, len)`` of `L`,
        oldest first: every line checked as :meth:`line` checks it, then
        ``hits[i]`` the value `cache` holds for ``locs[i]`` (its first item
        if `record`), None where it holds none (`misses` of them). The
        fetches of all the lines and slots, then of all the values and
        records (:meth:`LocCache._values`) are each asked for before the
        first is used."""
        cdef uint32_t k = _len(L) - start, i, e
        cdef const unsigned char *p
        cdef size_t ln
        cdef Py_ssize_t misses
        cdef int64_t *locs = <int64_t *>malloc(<size_t>k * (sizeof(int64_t) + sizeof(void *)) + 1)
        if locs == NULL:
            raise MemoryError(f"HotIndex: cannot read {k} lines")
        out_locs = []
        out_hits = []
        try:
            for i in range(k):
                e = _at(L, start + i)
                locs[i] = self._c_locs[e]
                self._prefetch_line(locs[i], self._c_lens[e])
                cache._prefetch(locs[i])
            for i in range(k):
                self._checked_line(locs[i], &p, &ln, self._c_lens[_at(L, start + i)])
                out_locs.append(locs[i])
            misses = cache._values(locs, k, <void **>(locs + k), record, out_hits)
        finally:
            free(locs)
        return out_locs, out_hits, misses

    cdef int64_t _seg_of(self, int64_t seg) except -1:
        if seg < 0 or seg > MAX_SEG:
            raise FramingError(f"segment number {seg} outside [0, {MAX_SEG}]")
        return seg

    # ---- buffers ---------------------------------------------------------

    def attach(self, int64_t seg, buf, path=None, *, bint growing=False, bint keep_lines=False) -> None:
        """(Re)register the read-only buffer (an mmap, bytes, memoryview) of
        segment `seg`; None or an empty buffer registers an empty segment. The
        index holds the buffer until :meth:`detach` (so an mmap cannot be closed
        under it); attach again after remapping a grown file. `path` only
        names the file in error messages. `growing`: the buffer maps a file
        that another process may still write (a viewer's tail): search never
        builds filters over it (see _gr_build). `keep_lines`: the buffer
        maps the same file as the one attached, grown (a writer's tail
        remapped): the lines end set before (:meth:`set_lines_end`) and
        the filters built over the bytes before it stay, those bytes being
        the same; else both go."""
        cdef rf_seg *segs
        cdef int64_t n
        cdef uint64_t *kept_gr = NULL
        cdef int64_t kept_n = 0, kept_end = -1
        self._guard()
        self._seg_of(seg)
        mv = None
        if buf is not None:
            try:
                mv = memoryview(buf)
            except TypeError:
                raise FramingError(f"attach: buffer of segment {seg} must support the buffer "
                                   f"protocol, got {type(buf).__name__}") from None
            if not mv.c_contiguous:
                raise FramingError(f"attach: buffer of segment {seg} is not contiguous")
            if mv.itemsize != 1 or mv.ndim != 1:
                mv = mv.cast("B")
        if seg >= self._n_segs:
            n = max(seg + 1, self._n_segs * 2)
            segs = <rf_seg *>realloc(self._c_segs, <size_t>n * sizeof(rf_seg))
            if segs == NULL:
                raise MemoryError("HotIndex.attach: segment table")
            memset(&segs[self._n_segs], 0, <size_t>(n - self._n_segs) * sizeof(rf_seg))
            self._c_segs = segs
            self._n_segs = n
        cdef int64_t old_len = self._c_segs[seg].len, new_len, shift
        cdef rf_seg *sg = &self._c_segs[seg]
        if keep_lines and not growing and sg.state != 0 and not sg.growing and sg.lines_end >= 0:
            kept_end = sg.lines_end
            if sg.gr_owned:         # (the filters move past _release's drop)
                kept_gr, kept_n = sg.gr, sg.gr_n
                sg.gr, sg.gr_n, sg.gr_owned = NULL, 0, False
        self._release(seg)
        sg.growing = growing
        if mv is None or len(mv) == 0:
            sg.state = 2
        else:
            PyObject_GetBuffer(mv, &sg.view, PyBUF_SIMPLE)
            sg.ptr = <const unsigned char *>sg.view.buf
            sg.len = sg.view.len
            sg.state = 1
            self._views[seg] = mv
        if kept_end >= 0 and kept_end <= sg.len:
            sg.lines_end = kept_end
            if kept_gr != NULL:
                sg.gr, sg.gr_n, sg.gr_owned = kept_gr, kept_n, True
        else:
            free(kept_gr)
        # bytes kept by append_bytes that the new buffer now covers are dropped
        new_len = sg.len
        if sg.ov_len:
            if new_len >= old_len + sg.ov_len or new_len < old_len:
                sg.ov_len = 0
            elif new_len > old_len:
                shift = new_len - old_len
                memmove(sg.ov, sg.ov + shift, <size_t>(sg.ov_len - shift))
                sg.ov_len -= shift
        if path is not None:
            self._paths[seg] = os.fspath(path)

    cdef void _release(self, int64_t seg):
        if seg < self._n_segs:
            if self._c_segs[seg].state == 1:
                PyBuffer_Release(&self._c_segs[seg].view)
            self._c_segs[seg].state = 0
            self._c_segs[seg].ptr = NULL
            self._c_segs[seg].len = 0
            self._c_segs[seg].lines_end = -1
            _gr_drop(&self._c_segs[seg])       # the filters were of the old buffer
        self._views.pop(seg, None)

    def set_lines_end(self, int64_t seg, int64_t end) -> None:
        """Where the complete lines of segment `seg` end: a file this
        process writes (a writer's tail, attached as not growing), whose
        bytes before `end` never change (appends go after them) and whose
        bytes after it are zeros reserved for the next appends. A search
        scans the segment, and builds its filters, up to `end` only (the
        filters of a tail extend with its lines: see _gr_build). A smaller
        end than before drops the filters built so far."""
        self._guard()
        self._seg_of(seg)
        cdef rf_seg *sg
        if seg >= self._n_segs or self._c_segs[seg].state == 0 or self._c_segs[seg].growing:
            raise ValueError(f"set_lines_end: segment {seg} is not an attached segment of this writer")
        sg = &self._c_segs[seg]
        if end < 0 or end > (sg.len if sg.state == 1 else 0):
            raise ValueError(f"set_lines_end: {end} is outside segment {seg}'s "
                             f"{sg.len if sg.state == 1 else 0} bytes")
        if 0 <= end < sg.lines_end:
            _gr_drop(sg)
        sg.lines_end = end

    def seg_filters(self, int64_t seg) -> bytes:
        """The search filters built so far over sealed segment `seg`'s blocks
        (GR_WORDS little-endian u64 words a block, from its first block;
        b"" if none): what a later open may hand to :meth:`set_seg_filters`."""
        self._guard()
        self._seg_of(seg)
        if seg >= self._n_segs or self._c_segs[seg].gr_n == 0:
            return b""
        return PyBytes_FromStringAndSize(<const char *>self._c_segs[seg].gr,
                                         self._c_segs[seg].gr_n * GR_WORDS * sizeof(uint64_t))

    def seg_filters_mapped(self, int64_t seg) -> bool:
        """Whether the filters of segment `seg` are read where a kept file's
        map holds them (set_seg_filters with ``borrow``), not copied."""
        self._guard()
        self._seg_of(seg)
        return seg < self._n_segs and self._c_segs[seg].gr_mapped and not self._c_segs[seg].gr_owned

    def seg_filter_blocks(self, int64_t seg) -> int:
        """How many blocks of segment `seg` have search filters (0: none)."""
        self._guard()
        self._seg_of(seg)
        return self._c_segs[seg].gr_n if seg < self._n_segs else 0

    def set_seg_filters(self, int64_t seg, data, bint borrow=False) -> int:
        """Take filters :meth:`seg_filters` gave for the same bytes of
        segment `seg` (attached, not growing); returns the blocks they cover.
        The caller vouches that they were built over these bytes (a kept
        file bound to the segment). ValueError if they cannot be (a length
        that is not whole blocks, more blocks than the buffer holds, a
        growing or unattached segment). Filters already as long are kept
        (but a copy, given the very same words to borrow, takes them).
        ``borrow``: `data` (a read-only buffer, a kept file's map) is used
        where it lies, held until the filters go, if its words are aligned:
        its pages are the page cache's, not this process's memory (1/32 of
        the sealed segments' bytes: ~1.8 MB of a 100,000-message store's,
        ~19 MB of a 1,000,000's); otherwise, or without, they are copied."""
        self._guard()
        self._seg_of(seg)
        cdef Py_buffer view
        cdef Py_ssize_t n
        cdef int64_t blocks
        cdef rf_seg *sg
        cdef uint64_t *w
        cdef bint aligned
        if seg >= self._n_segs or self._c_segs[seg].state != 1 or self._c_segs[seg].growing:
            raise ValueError(f"set_seg_filters: segment {seg} is not an attached sealed segment")
        sg = &self._c_segs[seg]
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            n = view.len
            blocks = n // (GR_WORDS * sizeof(uint64_t))
            if n % (GR_WORDS * sizeof(uint64_t)) or blocks > _gr_blocks(sg):
                raise ValueError(f"set_seg_filters: {n} bytes are not whole filters of segment {seg}'s "
                                 f"{_gr_blocks(sg)} blocks")
            aligned = borrow and (<uintptr_t>view.buf) % sizeof(uint64_t) == 0
            if blocks < sg.gr_n or (blocks == sg.gr_n and not (
                    aligned and sg.gr_owned and memcmp(sg.gr, view.buf, <size_t>n) == 0)):
                return sg.gr_n      # (the same words borrowed in place of a copy: the copy goes)
            if aligned:
                _gr_drop(sg)
                PyObject_GetBuffer(data, &sg.gr_view, PyBUF_SIMPLE)     # (held while the filters are)
                sg.gr_mapped = True
                sg.gr = <uint64_t *>sg.gr_view.buf
                sg.gr_n = blocks
                return blocks
            if sg.gr_owned or sg.gr == NULL:
                w = <uint64_t *>realloc(sg.gr, <size_t>n)
            else:
                w = <uint64_t *>malloc(<size_t>n)
            if w == NULL:
                raise MemoryError("HotIndex.set_seg_filters")
            memcpy(w, view.buf, <size_t>n)
            if not sg.gr_owned:
                _gr_drop(sg)
            sg.gr = w
            sg.gr_owned = True
            sg.gr_n = blocks
            return blocks
        finally:
            PyBuffer_Release(&view)

    def detach(self, int64_t seg) -> None:
        """Release the buffer of segment `seg` and the bytes appended to it
        with append_bytes (its entries stay indexed; reads of them raise until
        it is attached again)."""
        self._guard()
        self._seg_of(seg)
        self._release(seg)
        if seg < self._n_segs:
            free(self._c_segs[seg].ov)
            self._c_segs[seg].ov = NULL
            self._c_segs[seg].ov_len = 0
            self._c_segs[seg].ov_cap = 0
        self._paths.pop(seg, None)

    def attached(self) -> list:
        """Numbers of the segments with a registered buffer (empty ones too)."""
        return [s for s in range(self._n_segs) if self._c_segs[s].state]

    # ---- building --------------------------------------------------------

    def ingest(self, int64_t seg, int64_t start=0, int64_t end=-1, int64_t min_seq=-1):
        """Check every line of segment `seg` in [start, end) (end -1: to the end
        of its buffer), index each message line and apply each tombstone line.
        Stops at the first damaged complete line or at a torn final line and
        reports it; lines before it are indexed. A message line's append
        sequence must rise above `min_seq` (the last one before the region)
        and the line before it: one that does not is damage. Returns an
        IngestReport (its `last_seq`: the last sequence taken, else `min_seq`)."""
        cdef Py_buffer view
        self._guard()
        self._seg_of(seg)
        if seg >= self._n_segs or self._c_segs[seg].state == 0:
            raise RuneError(f"ingest: segment {seg} is not attached")
        if self._c_segs[seg].state == 2:
            if start != 0 or end > 0:
                raise FramingError(f"ingest: region [{start}, {end}) of the empty segment {seg}")
            return IngestReport(0, -1, -1, "", 0, np.empty(0, np.int64), np.empty(0, np.int64), [],
                                min_seq)
        PyObject_GetBuffer(self._views[seg], &view, PyBUF_SIMPLE)
        try:
            if end < 0:
                end = view.len
            if start < 0 or start > end or end > view.len:
                raise FramingError(f"ingest: region [{start}, {end}) outside segment {seg} "
                                   f"of {view.len} bytes")
            with nogil:
                rf_prefault(<const unsigned char *>view.buf + start, <size_t>(end - start))
            return self._ingest_at(seg, <const unsigned char *>view.buf + start, start, end - start,
                                   min_seq)
        finally:
            PyBuffer_Release(&view)

    def append_bytes(self, int64_t seg, int64_t offset, data):
        """Index the lines just appended to segment `seg` at `offset` (what
        TailWriter.append returned) from a copy of their bytes, without
        remapping the file: `data` must start at the logical end of the segment
        (its attached buffer plus earlier append_bytes). The index keeps the
        copy until an attach covers those bytes (then it is dropped) or the
        segment is detached. Returns an IngestReport like ingest()."""
        cdef Py_buffer view
        cdef rf_seg *sg
        cdef int64_t nc, logical_end
        cdef unsigned char *p
        self._guard()
        self._seg_of(seg)
        if seg >= self._n_segs or self._c_segs[seg].state == 0:
            raise RuneError(f"append_bytes: segment {seg} is not attached")
        sg = &self._c_segs[seg]
        logical_end = sg.len + sg.ov_len
        if offset != logical_end:
            raise FramingError(f"append_bytes: offset {offset} of segment {seg} is not its "
                               f"end ({logical_end}); attach the file instead")
        try:
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        except (TypeError, BufferError):
            raise FramingError(f"append_bytes: data must be bytes, got {type(data).__name__}") from None
        try:
            if offset + view.len > OFF_MASK:
                raise FramingError(f"append_bytes: segment {seg} would exceed 2**40 bytes")
            if sg.ov_len + view.len > sg.ov_cap:
                nc = max(sg.ov_cap * 2, sg.ov_len + view.len, 65536)
                p = <unsigned char *>realloc(sg.ov, <size_t>nc)
                if p == NULL:
                    raise MemoryError("append_bytes: tail copy")
                sg.ov = p
                sg.ov_cap = nc
            if view.len:
                memcpy(sg.ov + sg.ov_len, view.buf, <size_t>view.len)
            sg.ov_len += view.len
            r = self._ingest_at(seg, sg.ov + (sg.ov_len - view.len), offset, view.len, -1)
            if r.good_end != offset + view.len:
                # keep only what was indexed: a torn or damaged line is the caller's to handle
                sg.ov_len -= offset + view.len - r.good_end
            return r
        finally:
            PyBuffer_Release(&view)

    cdef object _ingest_at(self, int64_t seg, const unsigned char *p0, int64_t off0, int64_t n,
                           int64_t min_seq):
        """Ingest the bytes p0[0:n), which are file offsets [off0, off0 + n) of seg."""
        cdef rf_rec *recs = NULL
        cdef rf_scan_result r
        cdef rf_i64vec added, dups
        cdef Py_ssize_t nrec, i, n_lines = 0
        cdef bint more = True
        cdef int64_t pos, loc, slot
        cdef rf_rec *rec
        cdef const unsigned char *p
        cdef const unsigned char *last_ch = NULL
        cdef const unsigned char *last_task = NULL
        cdef size_t last_ch_len = 0, last_task_len = 0
        cdef int64_t last_ci = -1, last_ti = -1, e
        cdef int64_t seq, last_seq = min_seq
        cdef list tombstones = []
        memset(&added, 0, sizeof(added))
        memset(&dups, 0, sizeof(dups))
        memset(&r, 0, sizeof(r))
        try:
            if off0 + n > OFF_MASK:
                raise FramingError(f"ingest: segment {seg} is larger than 2**40 bytes")
            recs = <rf_rec *>malloc(CHUNK * sizeof(rf_rec))
            if recs == NULL:
                raise MemoryError("HotIndex.ingest: line table")
            pos = 0
            r.good_end = 0
            r.torn_offset = -1
            r.damaged_offset = -1
            while more:
                self._c_busy = 1
                with nogil:
                    nrec = _scan_messages(p0, pos, n, recs, CHUNK, &r, &more)
                self._c_busy = 0
                n_lines += nrec
                for i in range(nrec):
                    rec = &recs[i]
                    p = p0 + rec.off
                    if i + 8 < nrec:
                        # the id table slot of a later line: its miss overlaps this work
                        rf_prefetch(&self._c_slots[_home(recs[i + 8].h >> 32, self._n_slots)])
                    if rec.m.kind == b'm':
                        # the append sequence rises line by line: a line moved
                        # or repeated (each line sound) is damage, not an order
                        seq = rf_line_seq(p, rec.len)
                        if seq >= 0:
                            if seq <= last_seq:
                                r.good_end = rec.off
                                r.damaged_offset = rec.off
                                r.torn_offset = -1
                                r.damage = RF_SEQ_ORDER
                                more = False
                                break
                            last_seq = seq
                    loc = (seg << 40) | (off0 + rec.off)
                    slot = self._find_slot(rec.h, p + rec.m.id_off, rec.m.id_len)
                    if slot == -2:
                        raise RuneError(f"ingest: an indexed line of a detached segment shares "
                                        f"the id at offset {off0 + rec.off} of {self._where(seg)}")
                    if rec.m.kind == b'd':
                        if slot >= 0:
                            self._kill(<uint64_t>slot)
                        tombstones.append((PyBytes_FromStringAndSize(<const char *>p + rec.m.id_off, rec.m.id_len),
                                           PyBytes_FromStringAndSize(<const char *>p + rec.m.ch_off, rec.m.ch_len)))
                        continue
                    if slot >= 0:
                        if rf_i64vec_push(&dups, loc):
                            raise MemoryError("HotIndex.ingest")
                        continue
                    # inline of _index_line with the channel/task of the previous
                    # line remembered: runs of one channel skip the name lookup
                    self._table_reserve(self._n_live + 1)
                    e = self._new_entry(loc)
                    self._c_lens[e] = rec.len
                    self._table_put(rec.h, <uint32_t>e)
                    self._n_live += 1
                    if not (last_ch != NULL and last_ch_len == rec.m.ch_len
                            and memcmp(last_ch, p + rec.m.ch_off, last_ch_len) == 0):
                        last_ci = self._list_index(True, p + rec.m.ch_off, rec.m.ch_len, True)
                        last_ch = p + rec.m.ch_off
                        last_ch_len = rec.m.ch_len
                    self._list_insert(&self._c_chan[last_ci], <uint32_t>e, p, &rec.m)
                    if rec.m.task_len and self._lazy_tasks is not None:
                        self._defer_task(<uint32_t>e)
                    elif rec.m.task_len:
                        if not (last_task != NULL and last_task_len == rec.m.task_len
                                and memcmp(last_task, p + rec.m.task_off, last_task_len) == 0):
                            last_ti = self._list_index(False, p + rec.m.task_off, rec.m.task_len, True)
                            last_task = p + rec.m.task_off
                            last_task_len = rec.m.task_len
                        self._list_insert(&self._c_task[last_ti], <uint32_t>e, p, &rec.m)
                    if rf_i64vec_push(&added, loc):
                        raise MemoryError("HotIndex.ingest")
                pos = r.good_end
            return IngestReport(off0 + r.good_end,
                                -1 if r.torn_offset < 0 else off0 + r.torn_offset,
                                -1 if r.damaged_offset < 0 else off0 + r.damaged_offset,
                                rf_reason(r.damage).decode("ascii"), n_lines,
                                _vec_array(&added), _vec_array(&dups), tombstones, last_seq)
        finally:
            self._c_busy = 0
            self._sweep()
            free(recs)
            free(added.v)
            free(dups.v)

    def add(self, int64_t loc) -> bool:
        """Index the message line already written at `loc` (its segment must be
        attached and cover it). False if its id is already indexed. A line that
        fails its check raises CorruptStateCheckpointError; a tombstone line
        raises FramingError (use :meth:`remove`)."""
        cdef const unsigned char *p
        cdef const unsigned char *nl
        cdef size_t avail
        cdef rf_msg m
        cdef int v
        cdef int64_t slot, e, seg = loc >> 40
        cdef uint64_t h
        self._guard()
        if loc < 0:
            raise FramingError(f"add: negative loc {loc}")
        if self._line_at(loc, &p, &avail) != 0:
            raise RuneError(f"add: offset {loc & OFF_MASK} is not inside the attached buffer of "
                            f"{self._where(seg)}")
        if avail > RF_MAX_LINE:
            avail = RF_MAX_LINE
        nl = <const unsigned char *>memchr(p, b'\n', avail)
        if nl == NULL:
            raise CorruptStateCheckpointError("add: no complete line", path=self._where(seg),
                                              offset=loc & OFF_MASK)
        v = rf_check_frame(p, <size_t>(nl - p))
        if v == RF_OK:
            v = rf_parse_msg(p, <size_t>(nl - p), &m, 1)
        if v != RF_OK:
            raise CorruptStateCheckpointError(f"add: line fails its check: {rf_reason(v).decode()}",
                                              path=self._where(seg), offset=loc & OFF_MASK)
        if m.kind != b'm':
            raise FramingError(f"add: the line at offset {loc & OFF_MASK} of {self._where(seg)} "
                               f"is a tombstone; use remove()")
        h = _xxh.XXH3_64bits(p + m.id_off, m.id_len)
        slot = self._find_slot(h, p + m.id_off, m.id_len)
        if slot == -2:
            raise RuneError("add: an indexed line with a matching hash is in a detached segment")
        if slot >= 0:
            return False
        e = self._index_line(loc, p, &m, h)
        self._c_lens[e] = <uint32_t>(nl - p) + 1
        return True

    # ---- reads -----------------------------------------------------------

    def find(self, id_key) -> int:
        """Location of the message with this id key, or -1."""
        cdef bytes k = _key_bytes(id_key, "id_key")
        cdef const unsigned char *kp = <const unsigned char *>PyBytes_AS_STRING(k)
        cdef size_t kl = <size_t>PyBytes_GET_SIZE(k)
        cdef int64_t slot = self._find_slot(_xxh.XXH3_64bits(kp, kl), kp, kl)
        if slot == -2:
            raise RuneError(f"find({k!r}): a candidate line is in a detached segment")
        if slot < 0:
            return -1
        return self._c_locs[(self._c_slots[slot] & 0xFFFFFFFFULL) - 1]

    def find_id(self, str msg_id) -> int:
        """:meth:`find` of the id as a str (what an exact read is given):
        -2 if its key is not its UTF-8 bytes (it needs JSON escapes: ask
        :meth:`find` with ``codec.key``), so the common id skips building
        its escaped key in Python."""
        cdef bytes k = msg_id.encode("utf-8")
        cdef const unsigned char *kp = <const unsigned char *>PyBytes_AS_STRING(k)
        cdef size_t kl = <size_t>PyBytes_GET_SIZE(k), i
        cdef int64_t slot
        for i in range(kl):
            if kp[i] < 0x20 or kp[i] == c'"' or kp[i] == c'\\':
                return -2
        slot = self._find_slot(_xxh.XXH3_64bits(kp, kl), kp, kl)
        if slot == -2:
            raise RuneError(f"find({k!r}): a candidate line is in a detached segment")
        if slot < 0:
            return -1
        return self._c_locs[(self._c_slots[slot] & 0xFFFFFFFFULL) - 1]

    def candidates(self, id_key):
        """int64 array of the locations of every entry whose id hash has the
        same 32-bit tag as `id_key`, whatever the id bytes of its line say.
        For telling a damaged id (its line then fails its checksum) from an
        unknown one after `find` returned -1."""
        cdef bytes k = _key_bytes(id_key, "id_key")
        cdef uint64_t h = _xxh.XXH3_64bits(<const unsigned char *>PyBytes_AS_STRING(k),
                                           <size_t>PyBytes_GET_SIZE(k))
        cdef uint64_t tag = h >> 32, n = self._n_slots
        cdef uint64_t i, s
        out = []
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        i = _home(tag, n)
        while True:
            s = self._c_slots[i]
            if s == 0:
                break
            if (s >> 32) == tag:
                out.append(self._c_locs[(s & 0xFFFFFFFFULL) - 1])
            i += 1
            if i == n:
                i = 0
        return np.array(out, dtype=np.int64)

    def find_many(self, id_keys):
        """int64 array of the locations of every id key (-1: not indexed).
        Lookups are pipelined: the table slot, entry and line of later keys are
        prefetched while earlier ones are verified."""
        cdef list keys = [_key_bytes(x, "id_key") for x in id_keys]
        cdef Py_ssize_t n = len(keys), i, j
        out = np.empty(n, dtype=np.int64)
        hs = np.empty(n, dtype=np.uint64)
        cdef int64_t[::1] o = out
        cdef uint64_t[::1] hv = hs
        cdef bytes k
        cdef const unsigned char *kp
        cdef const unsigned char *lp
        cdef size_t kl, avail
        cdef int64_t slot
        cdef uint64_t sv
        for i in range(n):
            k = keys[i]
            hv[i] = _xxh.XXH3_64bits(PyBytes_AS_STRING(k), <size_t>PyBytes_GET_SIZE(k))
        for i in range(n):
            # stage 1: the slot 12 keys ahead; stage 2: the entry of the key 6
            # ahead (if its home slot holds its tag); stage 3: its line, 3 ahead
            if i + 12 < n:
                rf_prefetch(&self._c_slots[_home(hv[i + 12] >> 32, self._n_slots)])
            if i + 6 < n:
                sv = self._c_slots[_home(hv[i + 6] >> 32, self._n_slots)]
                if sv and (sv >> 32) == (hv[i + 6] >> 32):
                    rf_prefetch(&self._c_locs[(sv & 0xFFFFFFFFULL) - 1])
            if i + 3 < n:
                sv = self._c_slots[_home(hv[i + 3] >> 32, self._n_slots)]
                if sv and (sv >> 32) == (hv[i + 3] >> 32):
                    if self._line_at(self._c_locs[(sv & 0xFFFFFFFFULL) - 1], &lp, &avail) == 0:
                        rf_prefetch(lp + RF_ID_OFF)
            k = keys[i]
            kp = <const unsigned char *>PyBytes_AS_STRING(k)
            kl = <size_t>PyBytes_GET_SIZE(k)
            slot = self._find_slot(hv[i], kp, kl)
            if slot == -2:
                raise RuneError(f"find_many({k!r}): a candidate line is in a detached segment")
            o[i] = -1 if slot < 0 else self._c_locs[(self._c_slots[slot] & 0xFFFFFFFFULL) - 1]
        return out

    def __contains__(self, id_key) -> bool:
        return self.find(id_key) >= 0

    def remove(self, id_key) -> int:
        """Unindex the message with this id key; its location, or -1 if unknown."""
        cdef bytes k = _key_bytes(id_key, "id_key")
        cdef const unsigned char *kp = <const unsigned char *>PyBytes_AS_STRING(k)
        cdef size_t kl = <size_t>PyBytes_GET_SIZE(k)
        cdef int64_t slot, loc
        self._guard()
        slot = self._find_slot(_xxh.XXH3_64bits(kp, kl), kp, kl)
        if slot == -2:
            raise RuneError(f"remove({k!r}): a candidate line is in a detached segment")
        if slot < 0:
            return -1
        loc = self._c_locs[(self._c_slots[slot] & 0xFFFFFFFFULL) - 1]
        try:
            self._kill(<uint64_t>slot)
        finally:
            self._sweep()
        return loc

    def remove_many(self, id_keys):
        """Unindex every id key; int64 array of their locations (-1: unknown).
        One pass per affected channel/task array, however many ids."""
        cdef list keys = [_key_bytes(x, "id_key") for x in id_keys]
        out = np.full(len(keys), -1, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t i
        cdef bytes k
        cdef const unsigned char *kp
        cdef size_t kl
        cdef int64_t slot
        self._guard()
        try:
            for i in range(len(keys)):
                k = keys[i]
                kp = <const unsigned char *>PyBytes_AS_STRING(k)
                kl = <size_t>PyBytes_GET_SIZE(k)
                slot = self._find_slot(_xxh.XXH3_64bits(kp, kl), kp, kl)
                if slot == -2:
                    raise RuneError(f"remove_many({k!r}): a candidate line is in a detached segment")
                if slot >= 0:
                    o[i] = self._c_locs[(self._c_slots[slot] & 0xFFFFFFFFULL) - 1]
                    self._kill(<uint64_t>slot)
        finally:
            self._sweep()
        return out

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def remove_lines(self, locs):
        """Unindex the messages whose lines are at `locs` (int64s, each
        checked as :meth:`line` checks it): :meth:`remove_many` of their
        ids, read from the lines here, so that a caller that cooled the
        lines need not keep their ids (a compact() after a bulk load held
        them for a file of 262,144 rows: ~34 bytes a row at its peak of
        resident memory). int64 array of where each id was indexed (-1: not
        indexed). A line that fails its check raises
        CorruptStateCheckpointError naming its file and offset, a
        tombstone line FramingError; the ids before it are unindexed."""
        cdef const int64_t[::1] ls = np.ascontiguousarray(locs, dtype=np.int64)
        cdef Py_ssize_t k = ls.shape[0], i
        out = np.full(k, -1, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef const unsigned char *p
        cdef size_t n
        cdef rf_msg m
        cdef int v
        cdef int64_t slot, loc
        self._guard()
        try:
            for i in range(min(k, _REMOVE_AHEAD)):
                self._prefetch_line(ls[i])
            for i in range(k):
                loc = ls[i]
                if i + _REMOVE_AHEAD < k:
                    # (the lines lie far apart: each asked for a few lines
                    # ahead, so that their memory latencies overlap)
                    self._prefetch_line(ls[i + _REMOVE_AHEAD])
                self._checked_line(loc, &p, &n)
                v = rf_parse_msg(p, n, &m, 0)
                if v != RF_OK:
                    raise CorruptStateCheckpointError(
                        f"remove_lines: line fails its check: {rf_reason(v).decode()}",
                        path=self._where(loc >> 40), offset=loc & OFF_MASK)
                if m.kind != b'm':
                    raise FramingError(f"remove_lines: the line at offset {loc & OFF_MASK} of "
                                       f"{self._where(loc >> 40)} is a tombstone")
                slot = self._find_slot(_xxh.XXH3_64bits(p + m.id_off, m.id_len), p + m.id_off, m.id_len)
                if slot == -2:
                    raise RuneError(f"remove_lines: a candidate line of the id at offset "
                                    f"{loc & OFF_MASK} of {self._where(loc >> 40)} is in a detached segment")
                if slot >= 0:
                    o[i] = self._c_locs[(self._c_slots[slot] & 0xFFFFFFFFULL) - 1]
                    self._kill(<uint64_t>slot)
        finally:
            self._sweep()
        return out

    def channel_locs(self, ch_key, Py_ssize_t n=-1):
        """Locations of the last n messages of the channel (all if n < 0),
        oldest first; empty for an unknown channel."""
        cdef bytes k = _key_bytes(ch_key, "ch_key")
        idx = self._chan_ids.get(k)
        if idx is None or n == 0:
            return np.empty(0, dtype=np.int64)
        cdef rf_list *L = &self._c_chan[<int64_t>idx]
        cdef uint32_t start = 0
        if 0 <= n < _len(L):
            start = _len(L) - <uint32_t>n
        return self._locs_of(L, start)

    def window_hits(self, ch_key, Py_ssize_t n, LocCache cache not None):
        """What a window read needs in one call: ``(locs, records, misses)``
        of the last n messages of the channel, oldest first, each line
        checked as :meth:`line` checks it (raising the same errors);
        ``records[i]`` is the first item of what `cache` holds for
        ``locs[i]``, None where it holds nothing (`misses` of them). Empty
        for an unknown channel or n <= 0."""
        cdef bytes k = _key_bytes(ch_key, "ch_key")
        cdef uint32_t start = 0
        cdef rf_list *L
        idx = self._chan_ids.get(k)
        if idx is None or n <= 0:
            return [], [], 0
        L = &self._c_chan[<int64_t>idx]
        if n < _len(L):
            start = _len(L) - <uint32_t>n
        return self._hits(L, start, cache, True)

    cdef object _read_records(self, const int64_t *locs, const uint32_t *lens, Py_ssize_t k,
                              LocCache cache, object decode, object cost, Py_ssize_t *decoded):
        """The records of the lines at `locs`, in order: every line checked
        first as :meth:`line` checks it (a cached record is served only over
        sound bytes), then each record the first item of what `cache` holds
        for its location or, where it holds none, of ``decode(line)``
        ((record, seq) from the line's bytes, kept in `cache` counted as
        ``cost(record)`` bytes; `decoded` counts them). None if `decode`
        declines a line (returns None): the caller's own path reads it and
        names what is wrong. The fetches of all the lines and slots are
        asked for before the first is used."""
        cdef Py_ssize_t i, nd = 0
        cdef int64_t j
        cdef const unsigned char *p
        cdef size_t ln
        cdef const unsigned char **ps = <const unsigned char **>malloc(<size_t>k * (sizeof(void *) + sizeof(size_t)) + 1)
        cdef size_t *ns = <size_t *>(ps + k)
        cdef list out
        cdef object hit
        if ps == NULL:
            raise MemoryError(f"HotIndex: cannot read {k} lines")
        try:
            for i in range(k):
                self._prefetch_line(locs[i], 0 if lens == NULL else lens[i])
                cache._prefetch(locs[i])
            for i in range(k):
                self._checked_line(locs[i], &p, &ln, 0 if lens == NULL else lens[i])
                ps[i] = p
                ns[i] = ln
            out = []
            for i in range(k):
                # (each value is referenced by `out` as soon as it is found:
                # a decode below may put, and so drop, cache entries)
                j = cache._find(locs[i])
                if j >= 0:
                    hit = <object>cache._c_slots[j].val
                else:
                    hit = decode(PyBytes_FromStringAndSize(<const char *>ps[i], <Py_ssize_t>ns[i]))
                    if hit is None:
                        return None
                    cache._set(locs[i], hit, cost((<tuple>hit)[0]))
                    nd += 1
                out.append((<tuple>hit)[0])
        finally:
            free(ps)
        decoded[0] = nd
        return out

    def window_read(self, str channel_id, Py_ssize_t n, LocCache cache not None, object decode,
                    object cost):
        """A window read of the hot tier in one call: ``(records, decoded)``,
        the records of the last n messages of the channel ``channel_id``
        (its id as a str), oldest first, each line checked as :meth:`line`
        checks it (raising the same errors, with the file and offset), each
        record from `cache` or decoded now by ``decode(line) -> (record,
        seq)`` and kept there counted as ``cost(record)`` bytes (`decoded`
        of them). ``([], 0)`` for an unknown channel or n <= 0. None if a
        line is not one `decode` reads, or if the id needs JSON escapes
        (its key is then not its UTF-8 bytes): the caller's general path
        (:meth:`window_hits`) reads the window then. A channel's list index
        never changes, so the str id finds it without building its key
        once it was found."""
        cdef bytes k
        cdef const char *kp
        cdef Py_ssize_t kl, i, got
        cdef uint32_t start = 0, m
        cdef rf_list *L
        cdef int64_t *locs
        cdef uint32_t *lens
        cdef uint32_t e
        cdef Py_ssize_t nd = 0
        idx = self._chan_names.get(channel_id)
        if idx is None:
            k = channel_id.encode("utf-8")
            kp = PyBytes_AS_STRING(k)
            kl = PyBytes_GET_SIZE(k)
            for i in range(kl):
                if <unsigned char>kp[i] < 0x20 or kp[i] == c'"' or kp[i] == c'\\':
                    return None
            idx = self._chan_ids.get(k)
            if idx is None:
                return [], 0
            self._chan_names[channel_id] = idx
        if n <= 0:
            return [], 0
        L = &self._c_chan[<int64_t>idx]
        m = _len(L)
        if <Py_ssize_t>m > n:
            start = m - <uint32_t>n
        got = m - start
        locs = <int64_t *>malloc(<size_t>got * (sizeof(int64_t) + sizeof(uint32_t)) + 1)
        if locs == NULL:
            raise MemoryError(f"HotIndex: cannot read {got} lines")
        lens = <uint32_t *>(locs + got)
        try:
            for i in range(got):
                e = _at(L, start + <uint32_t>i)
                locs[i] = self._c_locs[e]
                lens[i] = self._c_lens[e]
            out = self._read_records(locs, lens, got, cache, decode, cost, &nd)
        finally:
            free(locs)
        return None if out is None else (out, nd)

    def window_cached(self, str channel_id, Py_ssize_t n, LocCache cache not None, dict verdicts,
                      object own):
        """A repository window read when it is the common one, in one call:
        the records of the last n (1 to 64) messages of the channel
        ``channel_id`` (its id as a str, found before by
        :meth:`window_read`), oldest first, when its hot tier holds at
        least n, ``verdicts`` maps it to False (no hot message of it sorts
        before a cool one) and `cache` holds every one's record (the first
        item of its value). Each line is checked as :meth:`line` checks it
        (raising the same errors, with the file and offset), and the list
        is handed to ``own`` (the copy of tool calls) before it is
        returned. None when any of that does not hold: the caller's
        general path reads the window then, with nothing here kept or
        changed. A loop of windows over a working set pays here one
        dictionary lookup, the cache slots and the lines' checks, with the
        fetches of all of them overlapped."""
        return self._window_cached(channel_id, n, cache, verdicts, own, NULL)

    cdef object _window_cached(self, str channel_id, Py_ssize_t n, LocCache cache, dict verdicts,
                               object own, own_fn own_c):
        # (window_cached's body: repo_window calls it without a Python call,
        # and hands the copy of tool calls over as a C function, own_c)
        cdef int64_t locs[64]
        cdef uint32_t lens[64]
        cdef PyObject *vals[64]
        cdef const unsigned char *p
        cdef const unsigned char *lp
        cdef size_t ln, avail, k, want
        cdef Py_ssize_t i
        cdef int64_t j
        cdef uint32_t start, m, e
        cdef rf_list *L
        cdef PyObject *v
        cdef PyObject *w
        if n <= 0 or n > 64:
            return None
        w = PyDict_GetItem(self._chan_names, channel_id)
        if w == NULL:
            return None
        v = PyDict_GetItem(verdicts, channel_id)
        if v == NULL or v != Py_False:
            return None
        L = &self._c_chan[<int64_t><object>w]
        m = _len(L)
        if <Py_ssize_t>m < n:
            return None
        start = m - <uint32_t>n
        for i in range(n):
            e = _at(L, start + <uint32_t>i)
            locs[i] = self._c_locs[e]
            lens[i] = self._c_lens[e]
            # (_prefetch_line's loop, inlined)
            if self._line_at(locs[i], &lp, &avail) == 0:
                want = 256 if lens[i] == 0 else min(lens[i], 4096)
                k = 0
                while k < avail and k < want:
                    rf_prefetch(lp + k)
                    k += 64
            cache._prefetch(locs[i])
        for i in range(n):
            j = cache._find(locs[i])
            if j < 0:
                return None
            v = <PyObject *>cache._c_slots[j].val
            if not PyTuple_CheckExact(<object>v) or PyTuple_GET_SIZE(<object>v) < 1:
                return None
            vals[i] = v
            # the record: its header and its field pointers (two lines)
            w = <PyObject *>PyTuple_GET_ITEM(<object>v, 0)
            rf_prefetch(<const void *>w)
            rf_prefetch(<const void *>(<const char *>w + 64))
        for i in range(n):
            self._checked_line(locs[i], &p, &ln, lens[i])
        out = PyList_New(n)
        for i in range(n):
            rec = <object>PyTuple_GET_ITEM(<object>vals[i], 0)
            Py_INCREF(rec)
            PyList_SET_ITEM(out, i, rec)
        if own_c != NULL:
            own_c(out)
        else:
            own(out)
        return out

    def read_record(self, int64_t loc, LocCache cache not None, object decode, object cost):
        """``(record, decoded)`` of the line at `loc` as :meth:`window_read`
        reads each of its lines (checked, from `cache` or decoded and kept;
        `decoded` 1 or 0); None if `decode` declines the line."""
        cdef Py_ssize_t nd = 0
        out = self._read_records(&loc, NULL, 1, cache, decode, cost, &nd)
        return None if out is None else ((<list>out)[0], nd)

    def task_hits(self, task_key, LocCache cache not None):
        """``(locs, hits, misses)`` of every message of the task, oldest
        first: each line checked as :meth:`line` checks it, ``hits[i]`` what
        `cache` holds for ``locs[i]`` or None (`misses` of them)."""
        cdef bytes k = _key_bytes(task_key, "task_key")
        self._ensure_tasks()
        idx = self._task_ids.get(k)
        if idx is None:
            return [], [], 0
        return self._hits(&self._c_task[<int64_t>idx], 0, cache, False)

    def task_locs(self, task_key):
        """Locations of every message of the task, oldest first."""
        cdef bytes k = _key_bytes(task_key, "task_key")
        self._ensure_tasks()
        idx = self._task_ids.get(k)
        if idx is None:
            return np.empty(0, dtype=np.int64)
        return self._locs_of(&self._c_task[<int64_t>idx], 0)

    def task_ranks(self, run, task_keys):
        """For each location of ``run`` (int64s, sorted ascending), 1 + the
        position in ``task_keys`` of the task whose hot postings hold it,
        0 for a location no task of them holds: an int32 array. What
        cooling puts a run's rows in task order with (``Cooling._by_task``):
        one pass over the tasks' postings here, each looked up in ``run``
        by bisection (a call of :meth:`task_locs` a task, each making an
        array, was 6-11 ms of a cooling run's start at 1,000,000 messages)."""
        cdef const int64_t[::1] r = np.ascontiguousarray(run, dtype=np.int64)
        cdef Py_ssize_t n = r.shape[0], lo, hi, mid
        out = np.zeros(n, dtype=np.int32)
        cdef int32_t[::1] o = out
        cdef rf_list *L
        cdef uint32_t i
        cdef int64_t loc
        cdef int32_t rank = 0
        self._ensure_tasks()
        for k in task_keys:
            rank += 1
            idx = self._task_ids.get(_key_bytes(k, "task_key"))
            if idx is None or n == 0:
                continue
            L = &self._c_task[<int64_t>idx]
            for i in range(_len(L)):
                loc = self._c_locs[_at(L, i)]
                lo, hi = 0, n
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if r[mid] < loc:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo < n and r[lo] == loc:
                    o[lo] = rank
        return out

    def task_keys(self) -> list:
        """Keys of the tasks the index has seen, in no order (a task whose
        messages all left the hot tier may still be named: its
        ``task_locs`` is then empty). Cooling orders a file's rows by task
        with them (each hot location's task, without reading its line)."""
        self._ensure_tasks()
        return list(self._task_ids)

    def channels(self) -> list:
        """Keys of the channels that hold a message, in order of first sight."""
        cdef uint32_t i
        return [self._chan_keys[i] for i in range(self._n_chan) if _len(&self._c_chan[i])]

    def channel_len(self, ch_key) -> int:
        idx = self._chan_ids.get(_key_bytes(ch_key, "ch_key"))
        return 0 if idx is None else _len(&self._c_chan[<int64_t>idx])

    def max_channel_len(self) -> int:
        """Messages in the longest channel (0 with none)."""
        cdef uint32_t i, best = 0
        for i in range(self._n_chan):
            if _len(&self._c_chan[i]) > best:
                best = _len(&self._c_chan[i])
        return best

    def latest_task(self, ch_key):
        """Task key of the newest message of the channel that has one, or None.
        Every line it looks at is checked first (a flipped task field must not
        decide the answer): CorruptStateCheckpointError naming the file and
        offset of one that fails."""
        cdef const unsigned char *p
        cdef size_t n
        cdef rf_msg m
        cdef rf_list *L
        cdef uint32_t i
        idx = self._chan_ids.get(_key_bytes(ch_key, "ch_key"))
        if idx is None:
            return None
        L = &self._c_chan[<int64_t>idx]
        for i in range(_len(L), 0, -1):
            self._checked_line(self._c_locs[_at(L, i - 1)], &p, &n)
            if self._parse_entry(_at(L, i - 1), &p, &m) != 0:
                raise (self._unreadable(_at(L, i - 1)))
            if m.task_len:
                return PyBytes_FromStringAndSize(<const char *>p + m.task_off, m.task_len)
        return None

    def excess_len(self, Py_ssize_t hot_window) -> int:
        """How many locations :meth:`excess` would give (no array made: the
        automatic compaction asks at every ``compact_every``)."""
        cdef uint32_t i
        cdef uint64_t n = 0
        if hot_window < 0:
            raise FramingError(f"excess_len: hot_window must be >= 0, got {hot_window}")
        for i in range(self._n_chan):
            if _len(&self._c_chan[i]) > <uint64_t>hot_window:
                n += _len(&self._c_chan[i]) - <uint64_t>hot_window
        return n

    def excess(self, Py_ssize_t hot_window):
        """Locations beyond each channel's newest `hot_window` messages, grouped
        by channel (in channel order), oldest first: what cooling moves out."""
        cdef uint32_t i, j
        cdef rf_list *L
        cdef rf_i64vec out
        if hot_window < 0:
            raise FramingError(f"excess: hot_window must be >= 0, got {hot_window}")
        memset(&out, 0, sizeof(out))
        try:
            for i in range(self._n_chan):
                L = &self._c_chan[i]
                if _len(L) > <uint64_t>hot_window:
                    for j in range(_len(L) - <uint32_t>hot_window):
                        if rf_i64vec_push(&out, self._c_locs[_at(L, j)]):
                            raise MemoryError("HotIndex.excess")
            return _vec_array(&out)
        finally:
            free(out.v)

    def seg_stats(self) -> dict:
        """seg -> (live_lines, live_bytes incl. newlines) over every segment
        with a live message. Line lengths are kept per entry (measured once),
        so this is one pass over the entry array."""
        cdef uint32_t e
        cdef int64_t loc, seg, n = self._n_segs
        cdef const unsigned char *p
        cdef const unsigned char *nl
        cdef size_t avail
        if n <= 0:
            return {}
        cdef int64_t *lines = <int64_t *>calloc(<size_t>n, sizeof(int64_t))
        cdef int64_t *nbytes = <int64_t *>calloc(<size_t>n, sizeof(int64_t))
        try:
            if lines == NULL or nbytes == NULL:
                raise MemoryError("HotIndex.seg_stats")
            for e in range(self._n_entries):
                loc = self._c_locs[e]
                if loc < 0:
                    continue
                seg = loc >> 40
                if seg >= n or self._c_segs[seg].state == 0:
                    raise (self._unreadable(e))
                if self._c_lens[e] == 0:
                    if self._line_at(loc, &p, &avail) != 0:
                        raise (self._unreadable(e))
                    nl = <const unsigned char *>memchr(p, b'\n', avail)
                    if nl == NULL:
                        raise CorruptStateCheckpointError("indexed line has no newline",
                                                          path=self._where(seg), offset=loc & OFF_MASK)
                    self._c_lens[e] = <uint32_t>(nl - p) + 1
                lines[seg] += 1
                nbytes[seg] += self._c_lens[e]
            return {s: (lines[s], nbytes[s]) for s in range(n) if lines[s]}
        finally:
            free(lines)
            free(nbytes)

    def seg_locs(self, int64_t seg):
        """Sorted locations of the live messages in segment `seg`."""
        cdef uint32_t e
        cdef rf_i64vec out
        memset(&out, 0, sizeof(out))
        try:
            for e in range(self._n_entries):
                if self._c_locs[e] >= 0 and (self._c_locs[e] >> 40) == seg:
                    if rf_i64vec_push(&out, self._c_locs[e]):
                        raise MemoryError("HotIndex.seg_locs")
            arr = _vec_array(&out)
            arr.sort()
            return arr
        finally:
            free(out.v)

    def relocate(self, old_locs, new_locs) -> int:
        """Point every entry at old_locs[i] to new_locs[i] (after a segment was
        rewritten or renamed: same lines, new places); order and ids are
        unchanged. Returns how many entries moved. The new buffers must be
        attached before the next read."""
        cdef const int64_t[::1] olds = np.ascontiguousarray(old_locs, dtype=np.int64)
        cdef const int64_t[::1] news = np.ascontiguousarray(new_locs, dtype=np.int64)
        cdef Py_ssize_t n = olds.shape[0], lo, hi, mid
        cdef uint32_t e
        cdef int64_t loc, moved = 0
        self._guard()
        if news.shape[0] != n:
            raise FramingError(f"relocate: {n} old locs but {news.shape[0]} new locs")
        order = np.argsort(np.asarray(olds), kind="stable")
        cdef const int64_t[::1] so = np.asarray(olds)[order]
        cdef const int64_t[::1] sn = np.asarray(news)[order]
        for e in range(self._n_entries):
            loc = self._c_locs[e]
            if loc < 0 or n == 0:
                continue
            lo = 0
            hi = n
            while lo < hi:
                mid = (lo + hi) // 2
                if so[mid] < loc:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < n and so[lo] == loc:
                if sn[lo] < 0:
                    raise FramingError(f"relocate: negative new loc {sn[lo]}")
                self._c_locs[e] = sn[lo]
                moved += 1
        return moved

    cdef int _line_state(self, int64_t loc, const unsigned char **p, size_t *n,
                         uint32_t length=0) noexcept nogil:
        """Point `p` at the line at `loc` and set `n` to its length (without
        the newline) if its checksum holds: 0; else what is wrong (the
        ``_LINE_*`` codes, or the negated rf_check_frame verdict), which
        :meth:`_line_error` turns into the error. `length`: the line's
        length with its newline as the index measured it (0: not known).
        Its last byte a newline, the search for the first newline is
        skipped: the checksum covers every byte before it, so a newline
        flipped into the line fails the check as it would end it."""
        cdef const unsigned char *nl
        cdef size_t avail
        cdef int v
        cdef int64_t seg = loc >> 40
        if loc < 0:
            return _LINE_NEGATIVE
        if seg >= self._n_segs or self._c_segs[seg].state == 0:
            return _LINE_DETACHED
        if self._line_at(loc, p, &avail) != 0:
            return _LINE_PAST_END
        if avail > RF_MAX_LINE:
            avail = RF_MAX_LINE
        if length != 0 and length <= avail and p[0][length - 1] == b'\n':
            nl = p[0] + length - 1
        else:
            nl = <const unsigned char *>memchr(p[0], b'\n', avail)
        if nl == NULL:
            return _LINE_NO_NEWLINE
        v = rf_check_frame(p[0], <size_t>(nl - p[0]))
        if v != RF_OK:
            return -v
        n[0] = <size_t>(nl - p[0])
        return 0

    cdef object _line_error(self, int64_t loc, int state):
        """The error of a line whose :meth:`_line_state` is ``state``."""
        cdef int64_t seg = loc >> 40, off = loc & OFF_MASK
        if state == _LINE_NEGATIVE:
            return FramingError(f"line: negative loc {loc}")
        if state == _LINE_DETACHED:
            return RuneError(f"line: segment {seg} is not attached")
        if state == _LINE_PAST_END:
            return CorruptStateCheckpointError("no line at this offset (file shorter than the index)",
                                               path=self._where(seg), offset=off)
        if state == _LINE_NO_NEWLINE:
            return CorruptStateCheckpointError("line has no newline", path=self._where(seg), offset=off)
        return CorruptStateCheckpointError(f"line fails its check: {rf_reason(-state).decode()}",
                                           path=self._where(seg), offset=off)

    cdef int _checked_line(self, int64_t loc, const unsigned char **p, size_t *n,
                           uint32_t length=0) except -1:
        """:meth:`_line_state`, raising what is wrong (naming the file and
        offset)."""
        cdef int state = self._line_state(loc, p, n, length)
        if state != 0:
            raise self._line_error(loc, state)
        return 0

    def line(self, int64_t loc):
        """memoryview of the line at `loc` (without its newline), after checking
        its checksum; CorruptStateCheckpointError naming the file and offset if
        it fails. The view keeps the segment's buffer exported: copy it
        (``bytes(v)``) before detaching or closing the map."""
        cdef const unsigned char *p
        cdef size_t n
        cdef int64_t seg = loc >> 40, off = loc & OFF_MASK
        self._checked_line(loc, &p, &n)
        if off >= self._c_segs[seg].len:          # in the bytes kept by append_bytes
            return PyBytes_FromStringAndSize(<const char *>p, <Py_ssize_t>n)
        return self._views[seg][off:off + <int64_t>n]

    def check_lines(self, list locs) -> None:
        """Check the lines at `locs` (ints) as :meth:`line` does, without
        making a view of each: the check of a read that finds its records
        in a cache."""
        cdef const unsigned char *p
        cdef size_t n
        for loc in locs:
            self._prefetch_line(loc)
        for loc in locs:
            self._checked_line(loc, &p, &n)

    def gather_lines(self, locs, id_hashes=None):
        """``(data, starts)``: the lines at `locs` (int64s) in that order, each
        checked as :meth:`line` checks it and followed by its newline, as one
        bytes object, and an int64 array of where each starts in it (what a
        segment rewrite writes and the locations it moves the lines to).
        `id_hashes` (a uint64 array as long as `locs`, or None): filled with
        the hash of each line's id as the id table keys it, read from the
        checked line, for :meth:`find_located` and :meth:`remove_located`
        (a line that is not a message line raises FramingError then)."""
        cdef const int64_t[::1] ls = np.ascontiguousarray(locs, dtype=np.int64)
        cdef Py_ssize_t k = ls.shape[0], i
        cdef uint64_t[::1] hv
        cdef bint want = id_hashes is not None
        cdef const unsigned char **ps
        cdef size_t *ns
        cdef size_t total = 0, at = 0
        cdef char *dst
        cdef bytes data
        cdef rf_msg m
        if want:
            hv = id_hashes
            if hv.shape[0] != k:
                raise ValueError(f"gather_lines: {k} locations, {hv.shape[0]} id hashes")
        ps = <const unsigned char **>malloc(<size_t>k * sizeof(void *) + 1)
        ns = <size_t *>malloc(<size_t>k * sizeof(size_t) + 1)
        starts = np.empty(k, dtype=np.int64)
        cdef int64_t[::1] st = starts
        cdef Py_ssize_t bad = -1
        cdef int state = 0
        self._guard()
        try:
            if ps == NULL or ns == NULL:
                raise MemoryError(f"HotIndex.gather_lines: {k} lines")
            # (without the GIL: the check of a cooling run's ~800-byte lines,
            # ~3 ms a part of 4,096, held it while the Parquet writer's and
            # the filters' threads waited for it between their row groups)
            self._c_busy = 1
            try:
                with nogil:
                    for i in range(min(k, _GATHER_AHEAD)):
                        self._prefetch_line(ls[i], 1024)
                    for i in range(k):
                        if i + _GATHER_AHEAD < k:
                            # (a window of whole lines ahead, not every line's
                            # head first: a line is ~800 bytes, and a part's
                            # heads asked at once were out of the cache again
                            # by the time their lines were checked)
                            self._prefetch_line(ls[i + _GATHER_AHEAD], 1024)
                        state = self._line_state(ls[i], &ps[i], &ns[i])
                        if state != 0:
                            bad = i
                            break
                        total += ns[i] + 1
                        if want:
                            if rf_parse_msg(ps[i], ns[i], &m, 0) != RF_OK or m.kind != b'm':
                                bad = i
                                break
                            hv[i] = _xxh.XXH3_64bits(ps[i] + m.id_off, m.id_len)
                if bad >= 0:
                    if state != 0:
                        raise self._line_error(ls[bad], state)
                    raise FramingError(f"gather_lines: the line at offset {ls[bad] & OFF_MASK} of "
                                       f"{self._where(ls[bad] >> 40)} is not a message line")
                data = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>total)
                dst = PyBytes_AS_STRING(data)
                with nogil:
                    for i in range(k):
                        st[i] = <int64_t>at
                        memcpy(dst + at, ps[i], ns[i])
                        dst[at + ns[i]] = b'\n'
                        at += ns[i] + 1
            finally:
                self._c_busy = 0
            return data, starts
        finally:
            free(ps)
            free(ns)

    cdef int64_t _located_slot(self, int64_t loc, uint64_t h) noexcept nogil:
        """Slot of the entry at `loc` whose id hashes to `h`, -1 if none: the
        id table vouches that the line at `loc` (whose id a caller read,
        checked, and hashed) is still indexed there, without the line read
        again (an entry is the only one at its location)."""
        cdef uint64_t tag = h >> 32, n = self._n_slots
        cdef uint64_t i, s
        if n == 0:
            return -1
        i = _home(tag, n)
        while True:
            s = self._c_slots[i]
            if s == 0:
                return -1
            if (s >> 32) == tag and self._c_locs[(s & 0xFFFFFFFFULL) - 1] == loc:
                return <int64_t>i
            i += 1
            if i == n:
                i = 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def find_located(self, locs, id_hashes):
        """int64 array: ``locs[i]`` where the message of the line at
        ``locs[i]``, its id hashing to ``id_hashes[i]`` (:meth:`gather_lines`),
        is indexed there still, else -1 (unindexed, or moved)."""
        cdef const int64_t[::1] ls = np.ascontiguousarray(locs, dtype=np.int64)
        cdef const uint64_t[::1] hv = np.ascontiguousarray(id_hashes, dtype=np.uint64)
        cdef Py_ssize_t k = ls.shape[0], i
        if hv.shape[0] != k:
            raise ValueError(f"find_located: {k} locations, {hv.shape[0]} id hashes")
        out = np.full(k, -1, dtype=np.int64)
        cdef int64_t[::1] o = out
        for i in range(k):
            if i + _REMOVE_AHEAD < k and self._n_slots:
                rf_prefetch(&self._c_slots[_home(hv[i + _REMOVE_AHEAD] >> 32, self._n_slots)])
            if self._located_slot(ls[i], hv[i]) >= 0:
                o[i] = ls[i]
        return out

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def remove_located(self, locs, id_hashes):
        """Unindex the messages of the lines at `locs`, their ids hashing to
        `id_hashes` (:meth:`gather_lines` read and checked them): what
        :meth:`remove_lines` does, without reading and checking each line
        again. int64 array of where each was indexed (-1: not indexed at
        that location)."""
        cdef const int64_t[::1] ls = np.ascontiguousarray(locs, dtype=np.int64)
        cdef const uint64_t[::1] hv = np.ascontiguousarray(id_hashes, dtype=np.uint64)
        cdef Py_ssize_t k = ls.shape[0], i
        cdef int64_t slot
        if hv.shape[0] != k:
            raise ValueError(f"remove_located: {k} locations, {hv.shape[0]} id hashes")
        out = np.full(k, -1, dtype=np.int64)
        cdef int64_t[::1] o = out
        self._guard()
        try:
            for i in range(min(k, _REMOVE_AHEAD)):
                self._prefetch_line(ls[i], 128)
            for i in range(k):
                if i + _REMOVE_AHEAD < k:
                    # (the slot and the head of the line _kill parses, a few
                    # lines ahead: their memory latencies overlap)
                    self._prefetch_line(ls[i + _REMOVE_AHEAD], 128)
                    if self._n_slots:
                        rf_prefetch(&self._c_slots[_home(hv[i + _REMOVE_AHEAD] >> 32, self._n_slots)])
                slot = self._located_slot(ls[i], hv[i])
                if slot >= 0:
                    o[i] = ls[i]
                    self._kill(<uint64_t>slot)
        finally:
            self._sweep()
        return out

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def search(self, needle, bint ignore_ascii_case=False, bint nonascii_candidates=False,
               ch_key=None):
        """Locations of the messages whose content contains `needle` (the
        escaped key bytes of the text, ``codec.key(text)``), channel by channel
        in channel order, oldest first. Matches start on a character boundary
        of the escaped content. With `ignore_ascii_case`, ASCII letters match
        either case; with `nonascii_candidates`, lines holding any byte >= 0x80
        after the start of the content are returned too, for the caller to
        check Unicode casefolding."""
        cdef bytes nb = _key_bytes(needle, "needle")
        cdef Py_ssize_t m = len(nb), i
        cdef bytearray nd = bytearray(nb)
        cdef unsigned char *ndp
        cdef rf_i64vec out
        cdef uint32_t li, lo, hi, j
        cdef rf_list *L
        cdef const unsigned char *p
        cdef const unsigned char *s
        cdef const unsigned char *nl
        cdef size_t avail
        cdef rf_msg msg
        cdef int64_t bad = -1, loc
        cdef bint ci = ignore_ascii_case, na = nonascii_candidates
        self._guard()
        ndp = <unsigned char *>(<char *>nd) if m else <unsigned char *>b""
        if ci:
            for i in range(m):
                ndp[i] = rf_lower(ndp[i])
        if ch_key is None:
            return self._search_all(ndp, m, ci, na)
        idx = self._chan_ids.get(_key_bytes(ch_key, "ch_key"))
        if idx is None:
            return np.empty(0, dtype=np.int64)
        lo = <uint32_t>idx
        hi = lo + 1
        memset(&out, 0, sizeof(out))
        self._c_busy = 1
        try:
            with nogil:
                for li in range(lo, hi):
                    L = &self._c_chan[li]
                    for j in range(_len(L)):
                        loc = self._c_locs[_at(L, j)]
                        if self._line_at(loc, &p, &avail) != 0:
                            bad = loc
                            break
                        if avail > RF_MAX_LINE:
                            avail = RF_MAX_LINE
                        nl = <const unsigned char *>memchr(p, b'\n', avail)
                        if nl == NULL or rf_parse_msg(p, <size_t>(nl - p), &msg, 0) != RF_OK:
                            bad = loc
                            break
                        s = p + msg.content_off
                        if (rf_content_has(s, nl, ndp, <size_t>m, ci)
                                or (na and rf_has_nonascii(s, <size_t>(nl - s)))):
                            if rf_i64vec_push(&out, loc):
                                bad = -2
                                break
                    if bad != -1:
                        break
            if bad == -2:
                raise MemoryError("HotIndex.search")
            if bad >= 0:
                if (bad >> 40) >= self._n_segs or self._c_segs[bad >> 40].state == 0:
                    raise RuneError(f"search: segment {bad >> 40} is not attached")
                raise CorruptStateCheckpointError("search: indexed line is not a readable message line",
                                                  path=self._where(bad >> 40), offset=bad & OFF_MASK)
            return _vec_array(&out)
        finally:
            self._c_busy = 0
            free(out.v)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def scan_segment(self, int64_t seg, int64_t start, needle, int64_t stop=-1):
        """(locs, end): the message lines of segment `seg` between file offsets
        `start` and `stop` (-1: the end of its buffers) whose content holds
        `needle` (exact bytes), live or not, ascending; `end` is the offset
        after the last complete line, where a later scan of a growing segment
        resumes (the end of the range when no line holds the needle past the
        last hit: bytes up to `stop` are complete lines). For caching the
        lines of rare needles per segment: the caller checks liveness on use.
        A sealed segment scanned whole from its start reads only the blocks
        whose filter (built or kept: see search) may hold a needle of 3 to
        GR_OVER + 2 bytes."""
        cdef bytes nb = _key_bytes(needle, "needle")
        cdef const unsigned char *nd = <const unsigned char *>PyBytes_AS_STRING(nb)
        cdef size_t m = <size_t>PyBytes_GET_SIZE(nb)
        cdef rf_i64vec hits, bad
        cdef int64_t pos, end, off0, loc, done
        cdef int reg, oom = 0
        cdef const unsigned char *base
        cdef const unsigned char *p
        cdef const unsigned char *c
        cdef const unsigned char *nl
        cdef rf_seg *sg
        cdef rf_msg msg
        cdef uint32_t hs[GR_OVER]
        cdef size_t k
        self._guard()
        if seg < 0 or seg >= self._n_segs or self._c_segs[seg].state == 0:
            raise RuneError(f"scan_segment: segment {seg} is not attached")
        if start < 0:
            raise FramingError(f"scan_segment: negative start {start}")
        sg = &self._c_segs[seg]
        done = start
        memset(&hits, 0, sizeof(hits))
        memset(&bad, 0, sizeof(bad))
        self._c_busy = 1
        try:
            with nogil:
                for reg in range(2):
                    if not _region(sg, reg, &base, &end, &off0):
                        continue
                    if stop >= 0 and off0 + end > stop:
                        end = stop - off0 if stop > off0 else 0
                    if start >= off0 + end:
                        continue
                    pos = start - off0 if start > off0 else 0     # a line start (an earlier end)
                    if reg == 0 and pos == 0 and not sg.growing and sg.gr_n > 0 and 3 <= m <= GR_OVER + 2:
                        # a sealed segment whose block filters exist (built by
                        # searches, or kept): only the blocks that may hold the
                        # needle are read, as a whole-store search reads them
                        k = _needle_grams(nd, m, hs)
                        oom = _scan_blocks(sg, base, &pos, end, nd, m, 0, 0, seg, hs, k, &hits, &bad)
                        if not oom and pos < end:
                            oom = _scan_region(base, &pos, end, end, nd, m, 0, 0, seg, off0, &hits, &bad)
                        done = off0 + end       # (lines that do not parse are left out, as below)
                        continue
                    while pos < end and not oom:
                        p = base + pos
                        c = rf_find(p, <size_t>(end - pos), nd, m, 0)
                        if c == NULL:
                            # no more hits up to `stop` (the caller's logical end:
                            # complete lines) or the buffer's end (a sealed segment)
                            done = off0 + end
                            break
                        p = rf_line_start(p, c)
                        nl = <const unsigned char *>memchr(c, b'\n', <size_t>(base + end - c))
                        if nl == NULL:
                            break          # a torn or in-flight final line
                        if rf_parse_msg(p, <size_t>(nl - p), &msg, 0) == RF_OK and msg.kind == b'm':
                            c = p + msg.content_off
                            if rf_content_has(c, nl, nd, m, 0):
                                oom = rf_i64vec_push(&hits, (seg << 40) | (off0 + (p - base)))
                        pos = (nl - base) + 1
                        done = off0 + pos
            if oom:
                raise MemoryError("HotIndex.scan_segment")
            return _vec_array(&hits), done
        finally:
            self._c_busy = 0
            free(hits.v)
            free(bad.v)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef object _search_all(self, const unsigned char *nd, size_t m, bint ci, bint na):
        """search() over every channel: one sequential pass over each attached
        segment (skipping the blocks whose trigram filter rules the needle
        out), then the hits that are live entries, in channel order."""
        cdef rf_i64vec hits, bad, out
        cdef int64_t seg, pos, end, loc, off0
        cdef int reg
        cdef const unsigned char *base
        cdef rf_seg *sg
        cdef int oom = 0
        cdef uint32_t li, j
        cdef rf_list *L
        cdef uint32_t hs[GR_OVER]
        cdef size_t k = 0
        # the filters serve a needle of 3 to GR_OVER + 2 bytes, not na's extra lines
        cdef bint filt = not na and 3 <= m <= GR_OVER + 2
        if filt:
            self._n_scans += 1
            k = _needle_grams(nd, m, hs)
        memset(&hits, 0, sizeof(hits))
        memset(&bad, 0, sizeof(bad))
        memset(&out, 0, sizeof(out))
        self._c_busy = 1
        try:
            with nogil:
                for seg in range(self._n_segs):
                    sg = &self._c_segs[seg]
                    for reg in range(2):
                        if not _region(sg, reg, &base, &end, &off0):
                            continue
                        pos = 0
                        # filters kept from an earlier open serve the first search too
                        if (not oom and reg == 0 and filt and not sg.growing
                                and ((self._n_scans > 1 and _gr_build(sg) == 0) or sg.gr_n > 0)):
                            oom = _scan_blocks(sg, base, &pos, end, nd, m, ci, na, seg, hs, k, &hits, &bad)
                        if not oom and pos < end:
                            oom = _scan_region(base, &pos, end, end, nd, m, ci, na, seg, off0, &hits, &bad)
                # hits and bad lines are sorted by loc; keep the live ones, in channel order
                if not oom and (hits.n or bad.n):
                    for li in range(self._n_chan):
                        L = &self._c_chan[li]
                        for j in range(_len(L)):
                            loc = self._c_locs[_at(L, j)]
                            if bad.n and _bsearch(bad.v, bad.n, loc):
                                oom = 2
                                out.n = 0
                                rf_i64vec_push(&out, loc)
                                break
                            if hits.n and _bsearch(hits.v, hits.n, loc):
                                if rf_i64vec_push(&out, loc):
                                    oom = 1
                                    break
                        if oom:
                            break
            if oom == 1:
                raise MemoryError("HotIndex.search")
            if oom == 2:
                loc = out.v[0]
                raise CorruptStateCheckpointError("search: an indexed line fails its check",
                                                  path=self._where(loc >> 40), offset=loc & OFF_MASK)
            return _vec_array(&out)
        finally:
            self._c_busy = 0
            free(hits.v)
            free(bad.v)
            free(out.v)

    def __len__(self):
        return self._n_live

    @property
    def in_map(self) -> frozenset:
        """The arrays that still lie in the loaded snapshot's map (of
        "entries", "lengths", "slots", "tasks"): an array moves to the heap
        when it must grow past what the snapshot holds."""
        return frozenset(name for name, m in (("entries", self._locs_mapped), ("lengths", self._lens_mapped),
                                              ("slots", self._slots_mapped), ("tasks", self._tasks_mapped)) if m)

    @property
    def nbytes(self) -> int:
        """Bytes of memory held by the index structures (not the mapped files),
        the search filters built so far included."""
        self._ensure_tasks()
        cdef uint64_t total = (<uint64_t>self._cap_entries * sizeof(int64_t)
                               + <uint64_t>self._cap_free * sizeof(uint32_t)
                               + self._n_slots * sizeof(uint64_t)
                               + (<uint64_t>self._cap_chan + self._cap_task) * sizeof(rf_list)
                               + (self._nm_cap[0] + self._nm_cap[1]) * (sizeof(uint64_t) + sizeof(uint32_t)))
        cdef uint32_t i
        for i in range(self._n_chan):
            total += (<uint64_t>self._c_chan[i].cap_u + self._c_chan[i].cap_s) * sizeof(uint32_t) + self._c_chan[i].lk_cap
        for i in range(self._n_task):
            total += (<uint64_t>self._c_task[i].cap_u + self._c_task[i].cap_s) * sizeof(uint32_t) + self._c_task[i].lk_cap
        cdef int64_t sgi
        for sgi in range(self._n_segs):
            if self._c_segs[sgi].gr_owned:     # (mapped ones are file pages)
                total += <uint64_t>self._c_segs[sgi].gr_n * GR_WORDS * sizeof(uint64_t)
        return total

    def __repr__(self):
        self._ensure_tasks()
        return (f"HotIndex(messages={self._n_live}, channels={self._n_chan}, "
                f"tasks={self._n_task}, nbytes={self.nbytes})")

    # ---- snapshot --------------------------------------------------------

    def save_snapshot(self, path, covered, write=None) -> None:
        """Write the index to `path` atomically (temp file, fsync, rename, fsync
        of the folder; mode 0600), recording `covered` (seg -> offset up to which
        the segment's lines are in the index). See docs/FORMAT.md. `write`:
        called as ``write(path, data)`` with the finished bytes instead of the
        atomic write (a caller that writes them later, off its lock)."""
        cdef uint32_t e, n_new = 0
        cdef uint32_t *remap = NULL
        cdef uint32_t room = <uint32_t>(self._n_live >> 4)
        self._guard()
        self._ensure_tasks()
        if sys.byteorder != "little":
            raise RuneError("save_snapshot: only little-endian machines write snapshots")
        # room for the appends after the next open (a sixteenth more), in the
        # id table and as spare entries (see _write_snapshot): else the first
        # of them may rehash the whole table (~10 ms at 500,000 messages) on
        # the open path, as after a killed writer. A table with that room
        # already is saved as it is (golden files rewrite identically).
        self._table_reserve(self._n_live + room)
        # live entries only, numbered densely (free entries a churning hot tier
        # leaves behind are not written: the next open maps less); the id table
        # keeps its layout, its slots and the arrays are renumbered
        remap = <uint32_t *>malloc((<size_t>self._n_entries + 1) * sizeof(uint32_t))
        if remap == NULL:
            raise MemoryError("save_snapshot: entry numbering")
        try:
            for e in range(self._n_entries):
                if self._c_locs[e] >= 0:
                    remap[e] = n_new
                    n_new += 1
                else:
                    remap[e] = 0xFFFFFFFFU
            if n_new != self._n_live:
                raise RuneError(f"save_snapshot: {n_new} live entries, the index counts {self._n_live}")
            self._write_snapshot(path, covered, remap, n_new, room, write)
        finally:
            free(remap)

    cdef _write_snapshot(self, path, covered, const uint32_t *remap, uint32_t n_new, uint32_t spare,
                         write):
        # `spare` free entries follow the live ones (location -1, length 0):
        # room for the appends after the next open while the entry and length
        # arrays lie in the snapshot's map. Without it the first entry added
        # after an open (a killed writer's tail lines are, at the open itself)
        # copied both arrays out of the map: ~2.5 ms at 400,000 entries.
        cdef uint32_t i, j, e
        cdef Py_ssize_t nlist_chan = 0, nlist_task = 0, pos
        cdef rf_list *L
        cdef uint32_t *w32
        cdef int64_t *w64
        cdef uint64_t sv
        cov = sorted((int(s), int(o)) for s, o in dict(covered).items())
        for i in range(self._n_chan):
            nlist_chan += _len(&self._c_chan[i])
        for i in range(self._n_task):
            nlist_task += _len(&self._c_task[i])
        keys = b"".join(self._chan_keys) + b"".join(self._task_keys)
        cdef uint32_t n_all = n_new + spare
        sizes = [16 * len(cov), 8 * n_all, 8 * self._n_slots,
                 16 * (self._n_chan + self._n_task), len(keys), 4 * nlist_chan, 4 * nlist_task,
                 4 * n_all]
        total = HEADER_LEN + sum((s + 7) & ~7 for s in sizes)
        buf = bytearray(total)
        cdef unsigned char[::1] b = buf
        cdef unsigned char *o = &b[0]
        cdef uint32_t meta[4]
        cdef uint64_t u64
        cdef int64_t i64
        memcpy(o, b"RFHOTIX\x00", 8)
        meta[0] = SNAPSHOT_VERSION
        meta[1] = <uint32_t>HEADER_LEN
        memcpy(o + 8, meta, 8)
        u64 = total - HEADER_LEN
        memcpy(o + 24, &u64, 8)
        meta[0] = <uint32_t>len(cov)
        meta[1] = n_all
        meta[2] = self._n_chan
        meta[3] = self._n_task
        memcpy(o + 32, meta, 16)
        memcpy(o + 48, &self._n_slots, 8)
        memcpy(o + 56, &self._n_live, 8)
        pos = HEADER_LEN
        for s, off in cov:
            i64 = s
            memcpy(o + pos, &i64, 8)
            i64 = off
            memcpy(o + pos + 8, &i64, 8)
            pos += 16
        pos = (pos + 7) & ~7
        w64 = <int64_t *>(o + pos)
        for e in range(self._n_entries):
            if remap[e] != 0xFFFFFFFFU:
                w64[remap[e]] = self._c_locs[e]
        for e in range(n_new, n_all):
            w64[e] = -1
        pos += (8 * n_all + 7) & ~7
        for i in range(self._n_slots):
            sv = self._c_slots[i]
            if sv:
                sv = (sv & ~0xFFFFFFFFULL) | (<uint64_t>remap[(sv & 0xFFFFFFFFULL) - 1] + 1)
            memcpy(o + pos + 8 * <Py_ssize_t>i, &sv, 8)
        pos += 8 * self._n_slots
        for chan in (True, False):
            for i in range(self._n_chan if chan else self._n_task):
                L = &self._c_chan[i] if chan else &self._c_task[i]
                k = self._chan_keys[i] if chan else self._task_keys[i]
                meta[0] = _len(L)
                meta[1] = L.nu
                meta[2] = <uint32_t>len(k)
                meta[3] = 0
                memcpy(o + pos, meta, 16)
                pos += 16
        if keys:
            memcpy(o + pos, <const char *>keys, len(keys))
        pos += (len(keys) + 7) & ~7
        for chan in (True, False):
            start = pos
            for i in range(self._n_chan if chan else self._n_task):
                L = &self._c_chan[i] if chan else &self._c_task[i]
                w32 = <uint32_t *>(o + pos)
                for j in range(L.nu):
                    w32[j] = _live_number(remap, L.u[j])
                pos += 4 * L.nu
                w32 = <uint32_t *>(o + pos)
                for j in range(L.ns):
                    w32[j] = _live_number(remap, L.s[j])
                pos += 4 * L.ns
            pos = start + ((pos - start + 7) & ~7)
        # each entry's line length (0: not measured yet), so that the first
        # seg_stats after a load need not read every line again
        w32 = <uint32_t *>(o + pos)
        for e in range(self._n_entries):
            if remap[e] != 0xFFFFFFFFU:
                w32[remap[e]] = self._c_lens[e]
        pos += (4 * n_all + 7) & ~7     # (the spare entries' lengths stay 0)
        if pos != total:
            raise RuneError(f"save_snapshot: internal size mismatch ({pos} != {total})")
        u64 = _xxh.XXH3_64bits(o + 24, total - 24)
        memcpy(o + 16, &u64, 8)
        (_write_atomic if write is None else write)(os.fspath(path), buf)

    @staticmethod
    def load_snapshot(path, bint lazy_tasks=True):
        """(HotIndex, covered) from a snapshot written by save_snapshot; buffers
        are not attached. A missing, unreadable, damaged or unknown-version file
        raises CorruptStateCheckpointError naming it. Whether `covered` is
        stale against the files is for the caller to judge.

        The whole file is read and its digest checked; with `lazy_tasks` the
        task arrays are made (and their entries checked) at the first call
        that needs them, which raises the same error if they do not check."""
        path = os.fspath(path)
        cdef void *base = NULL
        cdef size_t size = 0
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < <size_t>HEADER_LEN:
                    raise _bad(path, "bad magic or short header", 0)
                # a private map, not a read: no copy, and the entry array and
                # id table are used where they lie (a page is copied when first
                # written; the file itself is never written through it)
                base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, f.fileno(), 0)
                if base == MAP_FAILED:
                    raise OSError("mmap failed")
        except OSError as exc:
            raise CorruptStateCheckpointError(f"index snapshot unreadable: {exc}", path=path) from exc
        idx, covered = _load(<unsigned char *>base, size, path)     # owns the map from here on
        if not lazy_tasks:
            (<HotIndex>idx)._ensure_tasks()
        return idx, covered
