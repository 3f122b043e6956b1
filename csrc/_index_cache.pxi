# _index_cache.pxi: LocCache, the repository's bounded cache of records
# decoded from checked lines, looked up in C by the batched reads.
# (Included by _index.pyx: one extension module, rune_fast._index; its
# cimports, constants and shared helpers are in scope here.)


# what record_bytes counts a record's content as (rune_fast._conv.reads):
# sys.getsizeof's C function, without a Python call a record
cdef extern from "Python.h":
    size_t _PySys_GetSizeOf(object o) except? <size_t>-1


cdef class LocCache:
    """A bounded map from a line's location (an int >= 0) to what was decoded
    from it, that forgets its oldest insertions first as a dict kept in
    insertion order would: an update keeps an entry's place, a pop and a
    new insertion put it last, and past its bounds an insertion drops the
    oldest entries.

    With ``aged=True`` (the repository's record caches) an insertion that
    needs room drops one entry of the older half of the insertions instead,
    at random (a fixed-seed xorshift: the same calls drop the same
    entries), the oldest when four draws land only on places already
    emptied. A loop over a set a little larger than the cache then keeps
    most of it; oldest-first dropped every entry just before it was asked
    again (the bench's 2,000 gets at 30,000 messages against ~1,100 hot
    records: no hit). ``make_room``, a lower ``max_bytes`` and ``clear``
    still drop the oldest first.

    Two bounds: ``capacity`` entries, and ``max_bytes`` (None: none) summed
    over the sizes the values were put with (:meth:`put`; ``cache[loc] = v``
    puts 0 bytes). A value larger than ``max_bytes`` on its own is not kept.
    The caller knows what a value costs (a decoded record: about its line's
    length plus the objects' overhead); the cache only adds it up. The
    table and the ring of insertions grow with what is held, so a cache with
    room for many entries costs memory for the entries it holds, not for
    its capacity.

    The reads that check a batch of lines (:meth:`HotIndex.window_hits`,
    :meth:`HotIndex.task_hits`) look it up in C with the memory fetches of
    the whole batch overlapped: a lookup is one slot here, where a dict's
    is a chain of dependent fetches (index, entry, key object), each a
    cache miss once the store is large."""

    def __cinit__(self, Py_ssize_t capacity, max_bytes=None, bint aged=False):
        cdef uint64_t size = 16, i
        self._aged = aged
        self._rng = 0x9E3779B97F4A7C15ULL
        if capacity < 1:
            raise ValueError(f"LocCache: capacity must be >= 1, got {capacity}")
        if max_bytes is None:
            self._max_bytes = -1
        else:
            self._max_bytes = max_bytes
            if self._max_bytes < 0:
                raise ValueError(f"LocCache: max_bytes must be >= 0 or None, got {max_bytes}")
        self._ring_n = 32
        self._c_slots = <rf_cslot *>malloc(size * sizeof(rf_cslot))
        self._c_serial = <uint64_t *>malloc(size * sizeof(uint64_t))
        self._c_size = <int64_t *>malloc(size * sizeof(int64_t))
        self._c_ring = <int64_t *>malloc(self._ring_n * sizeof(int64_t))
        if self._c_slots == NULL or self._c_serial == NULL or self._c_size == NULL \
                or self._c_ring == NULL:
            free(self._c_slots)
            free(self._c_serial)
            free(self._c_size)
            free(self._c_ring)
            self._c_slots = NULL          # (__dealloc__ then releases nothing)
            self._c_serial = NULL
            self._c_size = NULL
            self._c_ring = NULL
            raise MemoryError(f"LocCache: cannot allocate {size} slots")
        for i in range(size):
            self._c_slots[i].loc = -1
            self._c_slots[i].val = NULL
        self._mask = size - 1
        self._cap = capacity

    def __dealloc__(self):
        cdef uint64_t i
        if self._c_slots != NULL:
            for i in range(self._mask + 1):
                if self._c_slots[i].loc >= 0:
                    Py_XDECREF(<PyObject *>self._c_slots[i].val)
        free(self._c_slots)
        free(self._c_serial)
        free(self._c_size)
        free(self._c_ring)

    # ---- internals -------------------------------------------------------

    cdef int _grow_table(self) except -1:
        """Double the table (every held entry moves to its slot in the new one)."""
        cdef uint64_t old_n = self._mask + 1, size = 2 * old_n, i, j, m = size - 1
        cdef rf_cslot *slots = <rf_cslot *>malloc(size * sizeof(rf_cslot))
        cdef uint64_t *serial = <uint64_t *>malloc(size * sizeof(uint64_t))
        cdef int64_t *sizes = <int64_t *>malloc(size * sizeof(int64_t))
        if slots == NULL or serial == NULL or sizes == NULL:
            free(slots)
            free(serial)
            free(sizes)
            raise MemoryError(f"LocCache: cannot allocate {size} slots")
        for i in range(size):
            slots[i].loc = -1
            slots[i].val = NULL
        for i in range(old_n):
            if self._c_slots[i].loc >= 0:
                j = _mix(<uint64_t>self._c_slots[i].loc) & m
                while slots[j].loc != -1:
                    j = (j + 1) & m
                slots[j] = self._c_slots[i]
                serial[j] = self._c_serial[i]
                sizes[j] = self._c_size[i]
        free(self._c_slots)
        free(self._c_serial)
        free(self._c_size)
        self._c_slots, self._c_serial, self._c_size, self._mask = slots, serial, sizes, m
        return 0

    cdef int _grow_ring(self) except -1:
        """Double the ring of insertions (each keeps its number)."""
        cdef uint64_t R = 2 * self._ring_n, s
        cdef int64_t *ring = <int64_t *>malloc(R * sizeof(int64_t))
        if ring == NULL:
            raise MemoryError(f"LocCache: cannot allocate a ring of {R}")
        for s in range(self._head, self._tail):
            ring[s % R] = self._c_ring[s % self._ring_n]
        free(self._c_ring)
        self._c_ring, self._ring_n = ring, R
        return 0

    cdef int64_t _find(self, int64_t loc) noexcept nogil:
        """Slot of `loc`, -1 if absent (load <= 1/2: a probe ends at an empty slot)."""
        cdef uint64_t i = _mix(<uint64_t>loc) & self._mask
        while self._c_slots[i].loc != -1:
            if self._c_slots[i].loc == loc:
                return <int64_t>i
            i = (i + 1) & self._mask
        return -1

    cdef void _prefetch(self, int64_t loc) noexcept nogil:
        rf_prefetch(&self._c_slots[_mix(<uint64_t>loc) & self._mask])

    cdef object _take(self, uint64_t i):
        """Remove slot i (the entries after it in its probe run shift back
        into the hole) and return its value."""
        cdef PyObject *v = <PyObject *>self._c_slots[i].val
        cdef uint64_t j = i, k, m = self._mask
        self._bytes -= self._c_size[i]
        while True:
            j = (j + 1) & m
            if self._c_slots[j].loc == -1:
                break
            k = _mix(<uint64_t>self._c_slots[j].loc) & m
            # the entry at j may fill the hole at i unless its home k lies
            # cyclically in (i, j]
            if (i <= j and (k <= i or k > j)) or (i > j and k <= i and k > j):
                self._c_slots[i] = self._c_slots[j]
                self._c_serial[i] = self._c_serial[j]
                self._c_size[i] = self._c_size[j]
                i = j
        self._c_slots[i].loc = -1
        self._c_slots[i].val = NULL
        self._n -= 1
        out = <object>v
        Py_DECREF(out)         # the table's reference (out holds its own)
        return out

    cdef int _compact_ring(self) noexcept nogil:
        """Renumber the held insertions from _head on, dropping the ring's
        places of entries popped or replaced since (at least half of a full
        ring: it has room for twice the capacity)."""
        cdef uint64_t s, w = self._head, R = self._ring_n
        cdef int64_t loc, i
        for s in range(self._head, self._tail):
            loc = self._c_ring[s % R]
            i = self._find(loc)
            if i >= 0 and self._c_serial[i] == s:
                self._c_ring[w % R] = loc
                self._c_serial[i] = w
                w += 1
        self._tail = w
        return 0

    cdef int _drop_oldest(self) except -1:
        cdef uint64_t s
        cdef int64_t i
        while self._head < self._tail:
            s = self._head
            self._head += 1
            i = self._find(self._c_ring[s % self._ring_n])
            if i >= 0 and self._c_serial[i] == s:
                self._take(<uint64_t>i)
                return 1
        return 0

    cdef int _drop_for_room(self) except -1:
        """Drop one entry for an insertion that needs room: with ``aged``,
        one of the older half of the insertions at random (see the class),
        else (or when the draws find only emptied places, or fewer than
        three places are held) the oldest. 1 if one was dropped."""
        cdef uint64_t span = (self._tail - self._head) // 2, s, x
        cdef int64_t i
        cdef int k
        if self._aged and self._tail - self._head >= 3:     # (then span >= 1)
            for k in range(4):
                x = self._rng
                x ^= x << 13
                x ^= x >> 7
                x ^= x << 17
                self._rng = x
                s = self._head + x % span
                i = self._find(self._c_ring[s % self._ring_n])
                if i >= 0 and self._c_serial[i] == s:
                    self._take(<uint64_t>i)
                    return 1
        return self._drop_oldest()

    cdef list _in_order(self, int what):
        """Keys (0), values (1) or (key, value) pairs (2), oldest first."""
        cdef uint64_t s
        cdef int64_t i, loc
        out = []
        for s in range(self._head, self._tail):
            loc = self._c_ring[s % self._ring_n]
            i = self._find(loc)
            if i >= 0 and self._c_serial[i] == s:
                v = <object>self._c_slots[i].val
                out.append(loc if what == 0 else v if what == 1 else (loc, v))
        return out

    cdef Py_ssize_t _values(self, const int64_t *locs, Py_ssize_t k, void **vals, bint first,
                            list out) except -1:
        """Append to `out` what the cache holds for each of `locs` (the first
        item of a value if `first`), None where it holds nothing; return how
        many Nones (`vals`: room for k pointers). Every value, then every
        value's first item (a tuple's: the record), is asked for before the
        first is used. The caller asked for the slots (:meth:`_prefetch`)
        and made `out` before: from the lookups on nothing that can start a
        garbage collection runs until each value is referenced."""
        cdef Py_ssize_t i, misses = 0
        cdef int64_t j
        cdef PyObject *v
        for i in range(k):
            j = self._find(locs[i]) if locs[i] >= 0 else -1
            vals[i] = NULL if j < 0 else self._c_slots[j].val
            if vals[i] != NULL:
                rf_prefetch(vals[i])
        for i in range(k):
            v = <PyObject *>vals[i]
            if v != NULL and PyTuple_CheckExact(<object>v) and PyTuple_GET_SIZE(<object>v) > 0:
                v = PyTuple_GET_ITEM(<object>v, 0)
                rf_prefetch(v)
                rf_prefetch(<char *>v + 64)
        for i in range(k):
            if vals[i] == NULL:
                out.append(None)
                misses += 1
            elif first:
                out.append((<object>vals[i])[0])
            else:
                out.append(<object>vals[i])
        return misses

    # ---- the dict-like interface -----------------------------------------

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def max_bytes(self):
        """The bound in bytes (None: none). Settable (the repository's
        default budget grows with the store): a lower bound drops the
        oldest entries at once."""
        return None if self._max_bytes < 0 else self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value):
        cdef int64_t v = -1 if value is None else value
        if value is not None and v < 0:
            raise ValueError(f"LocCache: max_bytes must be >= 0 or None, got {value}")
        self._max_bytes = v
        if v >= 0:
            while self._bytes > v and self._drop_oldest():
                pass

    @property
    def nbytes(self) -> int:
        """The sum of the sizes the held values were put with."""
        return self._bytes

    def __len__(self) -> int:
        return self._n

    def __contains__(self, int64_t loc) -> bool:
        return loc >= 0 and self._find(loc) >= 0

    def get(self, int64_t loc, default=None):
        cdef int64_t i = self._find(loc) if loc >= 0 else -1
        return default if i < 0 else <object>self._c_slots[i].val

    def __getitem__(self, int64_t loc):
        cdef int64_t i = self._find(loc) if loc >= 0 else -1
        if i < 0:
            raise KeyError(loc)
        return <object>self._c_slots[i].val

    def __setitem__(self, int64_t loc, object value):
        self._set(loc, value, 0)

    def put(self, int64_t loc, object value, int64_t nbytes) -> bool:
        """``cache[loc] = value``, counted as ``nbytes`` against ``max_bytes``:
        then the oldest entries go until the rest fits. False (and nothing
        held at ``loc`` any more) if ``value`` alone is larger than the bound."""
        return self._set(loc, value, nbytes) == 1

    def put_appended(self, list recs, list order, list lengths, int64_t loc, int64_t seq0,
                     Py_ssize_t skip, int64_t overhead, int64_t per_call, object own) -> None:
        """Keep the records an append just wrote (the loop of
        ``WritePath._write_messages``, compiled: about 1 us a message in
        Python). Line ``j`` (``recs[order[j]]``) lies at ``loc`` plus the
        ``lengths`` before it and has append sequence ``seq0 + j``; lines
        from ``skip`` on are put as ``(own(rec) if rec.tool_calls else rec,
        seq0 + j)``, counted as ``overhead + sys.getsizeof(rec.content) +
        per_call * len(rec.tool_calls)`` bytes (``record_bytes``)."""
        cdef Py_ssize_t m = len(order), j
        cdef object rec, calls
        cdef int64_t nb
        if len(lengths) != m:
            raise ValueError(f"LocCache.put_appended: {m} lines, {len(lengths)} lengths")
        for j in range(m):
            if j >= skip:
                rec = recs[<Py_ssize_t>order[j]]
                calls = rec.tool_calls
                nb = overhead + <int64_t>_PySys_GetSizeOf(rec.content) + per_call * len(calls)
                if calls:
                    rec = own(rec)
                self._set(loc, (rec, seq0 + j), nb)
            loc += <int64_t>lengths[j]

    cdef int _set(self, int64_t loc, object value, int64_t nbytes) except -1:
        """1 if `value` is held at `loc` now, 0 if it is larger than the bound."""
        cdef int64_t i
        cdef uint64_t j
        cdef PyObject *old
        if loc < 0:
            raise ValueError(f"LocCache: a location is >= 0, got {loc}")
        if nbytes < 0:
            raise ValueError(f"LocCache: a size is >= 0, got {nbytes}")
        i = self._find(loc)
        if self._max_bytes >= 0 and nbytes > self._max_bytes:
            if i >= 0:
                self._take(<uint64_t>i)       # (what it held is stale now)
            return 0
        if i >= 0:
            old = <PyObject *>self._c_slots[i].val
            Py_INCREF(value)
            self._c_slots[i].val = <void *>value
            self._bytes += nbytes - self._c_size[i]
            self._c_size[i] = nbytes
            Py_DECREF(<object>old)
        else:
            if self._n >= self._cap:
                self._drop_for_room()
            if self._tail - self._head == self._ring_n:
                self._compact_ring()
                if 2 * (self._tail - self._head) > self._ring_n:
                    self._grow_ring()
            if 2 * <uint64_t>(self._n + 1) > self._mask + 1:
                self._grow_table()
            j = _mix(<uint64_t>loc) & self._mask
            while self._c_slots[j].loc != -1:
                j = (j + 1) & self._mask
            Py_INCREF(value)
            self._c_slots[j].loc = loc
            self._c_slots[j].val = <void *>value
            self._c_serial[j] = self._tail
            self._c_size[j] = nbytes
            self._c_ring[self._tail % self._ring_n] = loc
            self._tail += 1
            self._n += 1
            self._bytes += nbytes
        if self._max_bytes >= 0:
            while self._bytes > self._max_bytes and self._drop_for_room():
                pass
        return 1 if self._find(loc) >= 0 else 0

    def pop(self, int64_t loc, default=None):
        cdef int64_t i = self._find(loc) if loc >= 0 else -1
        return default if i < 0 else self._take(<uint64_t>i)

    def move_many(self, old_locs, new_locs) -> None:
        """What the cache holds at ``old_locs[i]`` held at ``new_locs[i]``
        instead (int64s; the lines a segment rewrite moved), each as a pop
        and an insertion: a moved entry counts as the newest."""
        cdef const int64_t[::1] olds = np.ascontiguousarray(old_locs, dtype=np.int64)
        cdef const int64_t[::1] news = np.ascontiguousarray(new_locs, dtype=np.int64)
        cdef Py_ssize_t k
        cdef int64_t i, size
        if news.shape[0] != olds.shape[0]:
            raise ValueError(f"LocCache.move_many: {olds.shape[0]} old locations but "
                             f"{news.shape[0]} new ones")
        for k in range(olds.shape[0]):
            i = self._find(olds[k]) if olds[k] >= 0 else -1
            if i >= 0:
                size = self._c_size[i]
                self._set(news[k], self._take(<uint64_t>i), size)

    def get_many(self, list locs):
        """``(values, misses)``: what the cache holds for each of `locs` (ints)
        in their order, None where it holds nothing (`misses` of them). The
        slots of all, then all the values and the first item of each value
        (a tuple's: the record), are asked for before the first is used."""
        cdef Py_ssize_t k = len(locs), i, misses
        cdef int64_t *at = <int64_t *>malloc(<size_t>k * (sizeof(int64_t) + sizeof(void *)) + 1)
        if at == NULL:
            raise MemoryError(f"LocCache: cannot look up {k} locations")
        out = []
        try:
            for i in range(k):
                at[i] = locs[i]
                if at[i] >= 0:
                    self._prefetch(at[i])
            misses = self._values(at, k, <void **>(at + k), False, out)
        finally:
            free(at)
        return out, misses

    def make_room(self, Py_ssize_t room) -> None:
        """Room for `room` insertions: drop the oldest quarter of the
        capacity, or more if `room` needs it (at most every entry)."""
        cdef Py_ssize_t drop = max(self._cap // 4, self._n + room - self._cap)
        while drop > 0 and self._drop_oldest():
            drop -= 1

    def clear(self) -> None:
        while self._drop_oldest():
            pass
        self._head = self._tail = 0

    def keys(self) -> list:
        return self._in_order(0)

    def values(self) -> list:
        return self._in_order(1)

    def items(self) -> list:
        return self._in_order(2)

    def __iter__(self):
        return iter(self._in_order(0))
