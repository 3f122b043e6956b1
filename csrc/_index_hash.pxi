# _index_hash.pxi: HashIndex, a generic uint64 -> int64 multimap
# (the cool tier keeps the xxh3 of every id in one; callers verify hits).
# (Included by _index.pyx: one extension module, rune_fast._index; its
# cimports, constants and shared helpers are in scope here.)


cdef class HashIndex:
    """Open-addressing multimap from a uint64 hash to int64 values (duplicates
    allowed), e.g. xxh3 of an id -> row of an archive. Callers verify hits.

    Linear probing over any number of slots (a pair's home slot is the
    mixed hash modulo the slot count), at most three quarters full: a
    table grows by half (not by doubling: 17 bytes a slot, so a
    power-of-two table cost 23-45 bytes a pair, 37 measured on the cool
    tier of 1,000,000 messages), and :meth:`reserve` or
    :meth:`from_arrays` size it for a known count (23 bytes a pair)."""

    def __cinit__(self):
        self._alloc(16)

    def __dealloc__(self):
        free(self._c_keys)
        free(self._c_vals)
        free(self._c_used)

    cdef int _alloc(self, size_t cap) except -1:
        cdef uint64_t *keys = <uint64_t *>calloc(cap, sizeof(uint64_t))
        cdef int64_t *vals = <int64_t *>calloc(cap, sizeof(int64_t))
        cdef uint8_t *used = <uint8_t *>calloc(cap, 1)
        cdef uint64_t *ok = self._c_keys
        cdef int64_t *ov = self._c_vals
        cdef uint8_t *ou = self._c_used
        cdef size_t ocap = self._cap, i, j
        if keys == NULL or vals == NULL or used == NULL:
            free(keys)
            free(vals)
            free(used)
            raise MemoryError(f"HashIndex: cannot allocate {cap} slots")
        with nogil:
            for i in range(ocap):
                if ou[i]:
                    j = _mix(ok[i]) % cap
                    while used[j]:
                        j += 1
                        if j == cap:
                            j = 0
                    keys[j] = ok[i]
                    vals[j] = ov[i]
                    used[j] = 1
        free(ok)
        free(ov)
        free(ou)
        self._c_keys = keys
        self._c_vals = vals
        self._c_used = used
        self._cap = cap
        return 0

    cdef int _room(self, size_t n) except -1:
        """Make room for ``n`` more pairs (growing by half at least)."""
        cdef size_t need = self._n + n
        if need * 4 > self._cap * 3:
            self._alloc(max(need * 4 // 3 + 1, self._cap + self._cap // 2))
        return 0

    cdef int _insert(self, uint64_t h, int64_t v) except -1:
        self._room(1)
        self._place(h, v)
        return 0

    cdef void _place(self, uint64_t h, int64_t v) noexcept nogil:
        # (the caller made room: the table stays under three quarters full)
        cdef size_t cap = self._cap
        cdef size_t i = _mix(h) % cap
        while self._c_used[i]:
            i += 1
            if i == cap:
                i = 0
        self._c_keys[i] = h
        self._c_vals[i] = v
        self._c_used[i] = 1
        self._n += 1

    def insert(self, uint64_t h, int64_t v) -> None:
        """Add the pair (h, v) (a second pair with the same h is kept too)."""
        self._insert(h, v)

    def insert_many(self, hashes, values) -> None:
        """Add every pair (hashes[i], values[i])."""
        cdef const uint64_t[::1] hs = np.ascontiguousarray(hashes, dtype=np.uint64)
        cdef const int64_t[::1] vs = np.ascontiguousarray(values, dtype=np.int64)
        cdef Py_ssize_t i
        if hs.shape[0] != vs.shape[0]:
            raise FramingError(f"insert_many: {hs.shape[0]} hashes but {vs.shape[0]} values")
        self._room(<size_t>hs.shape[0])
        # without the GIL: the cool archive builds its id index (half a
        # million ids at 1,000,000 messages, ~0.1 s) in a background cooling
        # run, under its own lock, while appenders go on
        with nogil:
            for i in range(hs.shape[0]):
                self._place(hs[i], vs[i])

    def reserve(self, size_t n) -> None:
        """Size the table for ``n`` pairs in all (what it holds and what
        will be added), when it would otherwise grow: fewer slots than
        growing by half leaves."""
        if n > self._n and n * 4 > self._cap * 3:
            self._alloc(n * 4 // 3 + 1)

    def lookup(self, uint64_t h):
        """int64 array of every value stored under h (empty if none)."""
        cdef size_t cap = self._cap
        cdef size_t i = _mix(h) % cap
        cdef rf_i64vec out
        memset(&out, 0, sizeof(out))
        try:
            while self._c_used[i]:
                if self._c_keys[i] == h:
                    if rf_i64vec_push(&out, self._c_vals[i]):
                        raise MemoryError("HashIndex.lookup")
                i += 1
                if i == cap:
                    i = 0
            return _vec_array(&out)
        finally:
            free(out.v)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def has_many(self, hashes):
        """bool array: whether any value is stored under each of ``hashes``."""
        cdef const uint64_t[::1] hs = np.ascontiguousarray(hashes, dtype=np.uint64)
        out = np.zeros(hs.shape[0], dtype=np.bool_)
        cdef uint8_t[::1] o = out.view(np.uint8)
        cdef size_t cap = self._cap, i
        cdef Py_ssize_t k
        if self._n == 0:
            return out
        with nogil:
            for k in range(hs.shape[0]):
                i = _mix(hs[k]) % cap
                while self._c_used[i]:
                    if self._c_keys[i] == hs[k]:
                        o[k] = 1
                        break
                    i += 1
                    if i == cap:
                        i = 0
        return out

    def values(self, uint64_t h) -> list:
        """Every value stored under h, as a list (what :meth:`lookup` gives,
        without the array: the cheap form for one probe that usually misses)."""
        cdef size_t cap = self._cap
        cdef size_t i = _mix(h) % cap
        cdef list out = []
        while self._c_used[i]:
            if self._c_keys[i] == h:
                out.append(self._c_vals[i])
            i += 1
            if i == cap:
                i = 0
        return out

    def remove(self, uint64_t h, int64_t v) -> bool:
        """Remove one pair (h, v); False if it is not stored."""
        cdef size_t cap = self._cap
        cdef size_t i = _mix(h) % cap, j, k
        while self._c_used[i]:
            if self._c_keys[i] == h and self._c_vals[i] == v:
                break
            i += 1
            if i == cap:
                i = 0
        else:
            return False
        # backward-shift deletion: no tombstones, probes stay short
        j = i
        while True:
            j += 1
            if j == cap:
                j = 0
            if not self._c_used[j]:
                break
            k = _mix(self._c_keys[j]) % cap
            if (i < k <= j) if i <= j else (i < k or k <= j):
                continue
            self._c_keys[i] = self._c_keys[j]
            self._c_vals[i] = self._c_vals[j]
            i = j
        self._c_used[i] = 0
        self._n -= 1
        return True

    def clear(self) -> None:
        memset(self._c_used, 0, self._cap)
        self._n = 0

    def __len__(self):
        return self._n

    @property
    def nbytes(self) -> int:
        return self._cap * (sizeof(uint64_t) + sizeof(int64_t) + 1)

    def to_arrays(self):
        """(hashes uint64 array, values int64 array) of every pair."""
        hs = np.empty(self._n, dtype=np.uint64)
        vs = np.empty(self._n, dtype=np.int64)
        cdef uint64_t[::1] ho = hs
        cdef int64_t[::1] vo = vs
        cdef size_t i, k = 0
        for i in range(self._cap):
            if self._c_used[i]:
                ho[k] = self._c_keys[i]
                vo[k] = self._c_vals[i]
                k += 1
        return hs, vs

    @staticmethod
    def from_arrays(hashes, values) -> HashIndex:
        cdef HashIndex idx = HashIndex()
        idx.reserve(len(hashes))
        idx.insert_many(hashes, values)
        return idx
