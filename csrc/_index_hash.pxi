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


cdef struct rf_idrun:
    const uint64_t *h       # sorted ascending
    const uint32_t *r       # the row of each hash
    Py_ssize_t n
    int64_t base            # file number << 32
    uint64_t *f             # the run's filter (_filter_build), NULL until built
    Py_ssize_t fw           # its words


# IdRuns' filters (C constants):
# FILTER_BITS: bits a hash (one 64-bit word a hash, 4 bits set in it): 12
# bits let about 2% of the absent hashes through.
# FILTER_BUILD_BUDGET: has_many builds the filters of at most this many
# hashes a call (and of one run at least), so that no append waits for all
# of a large archive's (a run of 262,144 hashes: about 1 ms, read in order).
# FILTER_MIN_BATCH: ... and only for a batch of at least this many hashes
# (a lookup of a few searches the runs as they are).
cdef enum:
    FILTER_BITS = 12
    FILTER_BUILD_BUDGET = 1 << 20
    FILTER_MIN_BATCH = 16


cdef inline uint64_t _filter_bits(uint64_t h) noexcept nogil:
    # FILTER_K bit places from the hash's low 24 bits (its high 32 pick the word)
    return ((<uint64_t>1) << (h & 63)) | ((<uint64_t>1) << ((h >> 6) & 63)) \
        | ((<uint64_t>1) << ((h >> 12) & 63)) | ((<uint64_t>1) << ((h >> 18) & 63))


cdef inline Py_ssize_t _filter_word(uint64_t h, Py_ssize_t fw) noexcept nogil:
    # the word of hash h: its high 32 bits scaled to fw words (ascending
    # hashes fill the words in order)
    return <Py_ssize_t>(((h >> 32) * <uint64_t>fw) >> 32)


cdef int _filter_build(rf_idrun *run) noexcept nogil:
    """Build ``run``'s filter (a blocked Bloom filter of its hashes: a
    hash absent from the run usually misses it, a present one always hits
    it). -1 if the memory cannot be had (the run is searched as before)."""
    cdef Py_ssize_t fw = (run.n * FILTER_BITS + 63) // 64, i
    cdef uint64_t *f
    if fw < 1:
        fw = 1
    f = <uint64_t *>calloc(<size_t>fw, sizeof(uint64_t))
    if f == NULL:
        return -1
    for i in range(run.n):
        f[_filter_word(run.h[i], fw)] |= _filter_bits(run.h[i])
    run.f = f
    run.fw = fw
    return 0


cdef inline Py_ssize_t _guess(uint64_t key, Py_ssize_t n) noexcept nogil:
    """Where ``key`` would be among ``n`` sorted hashes spread evenly."""
    cdef Py_ssize_t g = <Py_ssize_t>((<double>key / 18446744073709551616.0) * <double>n)
    if g < 0:
        return 0
    if g >= n:
        return n - 1
    return g


cdef inline Py_ssize_t _aim(const uint64_t *a, Py_ssize_t n, uint64_t key, Py_ssize_t g) noexcept nogil:
    """A better guess than ``g`` at the place of ``key`` in the uniform
    sorted hashes ``a[:n]``: ``g`` moved by the distance in hash values from
    ``a[g]`` over the mean gap (it leaves about the square root of the
    error before it)."""
    g += <Py_ssize_t>((<double>key - <double>a[g]) * (<double>n / 18446744073709551616.0))
    return 0 if g < 0 else (n - 1 if g >= n else g)


cdef struct rf_idmemo:
    # one kept answer of IdRuns.values: the one location of the hash h
    # (v == 0: empty; what is stored is the location + 1)
    uint64_t h
    int64_t v


#: IdRuns' kept answers by default: as many as a record cache of the
#: repository holds entries (tuning.DECODE_CACHE), 128 KiB.
MEMO_ENTRIES = 8192


cdef inline Py_ssize_t _first_at_least(const uint64_t *a, Py_ssize_t n, uint64_t key) noexcept nogil:
    """The first index i of the sorted ``a[:n]`` with a[i] >= key (n if none).
    The hashes are uniform: the first probe is where ``key`` would be if
    they were evenly spread (a few hundred places off for a million
    hashes), two more aim by the distance in hash values (:func:`_aim`),
    and a search without branches closes in around that
    (:func:`_first_near`)."""
    if n <= 0:
        return 0
    return _first_near(a, n, key, _aim(a, n, key, _aim(a, n, key, _guess(key, n))))


cdef inline Py_ssize_t _first_near(const uint64_t *a, Py_ssize_t n, uint64_t key, Py_ssize_t g) noexcept nogil:
    """:func:`_first_at_least` given a guess ``g`` a few places off: a
    search without branches over the 16 places around it (the append path
    checks every new id of a batch against every file's run: the branches
    of a binary search, mispredicted half the time, cost more than its
    cache misses); if the answer is not among them (a few searches in a
    hundred for a million hashes), :func:`_first_at_least_from` ``g``."""
    cdef Py_ssize_t lo, hi, half
    cdef const uint64_t *b
    lo = g - 8 if g >= 8 else 0
    hi = lo + 16 if lo + 16 < n else n
    if (lo > 0 and a[lo - 1] >= key) or (hi < n and a[hi] < key):
        return _first_at_least_from(a, n, key, g)
    b = a + lo
    half = hi - lo
    while half > 1:
        b = b + (half >> 1) if b[(half >> 1) - 1] < key else b
        half -= half >> 1
    return (b - a) + (1 if half == 1 and b[0] < key else 0)


cdef Py_ssize_t _first_at_least_from(const uint64_t *a, Py_ssize_t n, uint64_t key,
                                     Py_ssize_t g) noexcept nogil:
    """The first index i of the sorted ``a[:n]`` with a[i] >= key, from
    the place ``g``: steps that double bracket it, then a binary search."""
    cdef Py_ssize_t lo, hi, step, probe, mid
    if a[g] < key:
        lo = g + 1
        hi = lo
        step = 1
        while hi < n and a[hi] < key:
            lo = hi + 1
            hi += step
            step <<= 1
        if hi > n:
            hi = n
    else:
        hi = g
        step = 1
        probe = hi - step
        while probe >= 0 and a[probe] >= key:
            hi = probe
            step <<= 1
            probe = hi - step
        lo = probe + 1 if probe >= 0 else 0
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if a[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cython.boundscheck(False)
@cython.wraparound(False)
def check_run(hashes, rows, int64_t n_rows) -> str:
    """Why ``hashes`` and ``rows`` (a file's id run, as its sidecar holds
    them) cannot serve :class:`IdRuns`, or "" if they can: as many of each
    as the file's ``n_rows``, hashes ascending, every row below ``n_rows``.
    (A run out of order would make lookups miss ids the file holds.)"""
    cdef const uint64_t[::1] hs = np.ascontiguousarray(hashes, dtype=np.uint64)
    cdef const uint32_t[::1] rs = np.ascontiguousarray(rows, dtype=np.uint32)
    cdef Py_ssize_t i, bad = -1, n = hs.shape[0]
    cdef int what = 0
    if rs.shape[0] != n or n != n_rows:
        return f"{n} hashes and {rs.shape[0]} rows for {n_rows} rows"
    with nogil:
        for i in range(n):
            if rs[i] >= n_rows:
                bad, what = i, 1
                break
            if i and hs[i] < hs[i - 1]:
                bad, what = i, 2
                break
    if what == 1:
        return f"entry {bad} names row {rs[bad]} of {n_rows}"
    if what == 2:
        return f"hashes not ascending at entry {bad}"
    return ""


def str_hashes(list ids):
    """uint64 array of xxh3_64 (seed 0) of the UTF-8 of each str of
    ``ids`` (the archive's id hashes, as ``_log.utf8_hashes`` gives them
    from an Arrow string array), without making the Arrow array: an ASCII
    str is hashed where it lies (the append path hashes every batch's new
    ids: 150 us a 1,000 through Arrow, cache-cold). TypeError naming the
    index for anything but a str; UnicodeEncodeError for a lone surrogate."""
    cdef Py_ssize_t n = len(ids), i, kl
    cdef object s
    cdef bytes b
    cdef const char *kp
    out = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    for i in range(n):
        s = ids[i]
        if type(s) is not str:
            raise TypeError(f"str_hashes: ids[{i}] is {type(s).__name__}, not str")
        if PyUnicode_IS_COMPACT_ASCII(s):
            kp = <const char *>PyUnicode_DATA(s)
            kl = PyUnicode_GET_LENGTH(s)
            o[i] = _xxh.XXH3_64bits(kp, <size_t>kl)
        else:
            b = (<str>s).encode("utf-8")
            o[i] = _xxh.XXH3_64bits(PyBytes_AS_STRING(b), <size_t>PyBytes_GET_SIZE(b))
    return out


cdef class IdRuns:
    """The archive's id index as it is stored: per file, its ids' xxh3_64
    sorted ascending and the row of each (the ``.idx`` sidecar's arrays,
    used in place: a mapped sidecar costs the page cache, not the heap), as
    ``(file no << 32) | row`` values like :class:`HashIndex`'s. A lookup
    searches every file's run (:func:`_first_at_least`: a few probes into a
    run, a million hashes or not); nothing is built at open or at the first
    lookup, which is what makes the first read of an archived message cost
    about what a later one does. Callers verify hits (64-bit hashes of
    different ids may be equal).

    An exact read searches every run: a few cache misses a file, which a
    loop over a working set of ids pays again and again (and more when
    other work evicts the runs' pages from the CPU's caches). So
    :meth:`values` keeps the answers that were one location in a small
    two-way table (``memo_entries`` of them, 16 bytes each, allocated at
    the first lookup), emptied whenever a run is added or dropped: an
    answer it gives is the one the search would give.

    The arrays must stay unchanged while they are added: the object keeps a
    reference to each, and reads them through raw pointers. Not
    thread-safe by itself (the archive's lock guards it)."""

    cdef rf_idrun *_runs
    cdef Py_ssize_t _k
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _total
    cdef dict _owners       # file no -> (hashes, rows): keeps the buffers alive
    cdef rf_idmemo *_memo   # _memo_n entries, two a set; NULL until the first lookup
    cdef uint64_t _memo_mask
    cdef Py_ssize_t _memo_n  # (0: no memo)

    def __cinit__(self, Py_ssize_t memo_entries=MEMO_ENTRIES):
        cdef Py_ssize_t sets = 1
        self._runs = NULL
        self._memo = NULL
        self._k = self._cap = self._total = 0
        self._owners = {}
        if memo_entries < 0:
            raise ValueError(f"IdRuns: memo_entries must be >= 0, got {memo_entries}")
        while 2 * sets < memo_entries:
            sets <<= 1
        self._memo_n = 0 if memo_entries == 0 else 2 * sets
        self._memo_mask = <uint64_t>sets - 1

    def __dealloc__(self):
        cdef Py_ssize_t j
        for j in range(self._k):
            free(self._runs[j].f)
        free(self._runs)
        free(self._memo)

    cdef void _forget(self) noexcept nogil:
        """The run set changed: no kept answer holds any more."""
        if self._memo != NULL:
            memset(self._memo, 0, <size_t>self._memo_n * sizeof(rf_idmemo))

    @property
    def memo_bytes(self) -> int:
        """Bytes of the table of kept answers (allocated at the first lookup)."""
        return self._memo_n * sizeof(rf_idmemo)

    def add(self, int64_t no, hashes, rows) -> None:
        """Add file ``no``'s run: ``hashes`` (uint64, ascending: see
        :func:`check_run` for a run read from disk) and ``rows`` (uint32,
        the row of each hash), replacing any run of ``no``. ValueError if
        they differ in length."""
        ha = np.ascontiguousarray(hashes, dtype=np.uint64)
        ra = np.ascontiguousarray(rows, dtype=np.uint32)
        cdef const uint64_t[::1] hs = ha
        cdef const uint32_t[::1] rs = ra
        cdef Py_ssize_t n = hs.shape[0]
        cdef rf_idrun *grown
        if rs.shape[0] != n:
            raise ValueError(f"IdRuns.add: file {no}: {n} hashes but {rs.shape[0]} rows")
        if not 0 <= no < (1 << 31):
            raise ValueError(f"IdRuns.add: file number {no} out of range")
        self.discard(no)
        self._forget()
        if self._k == self._cap:
            grown = <rf_idrun *>realloc(self._runs, (self._cap * 2 + 4) * sizeof(rf_idrun))
            if grown == NULL:
                raise MemoryError("IdRuns.add")
            self._runs = grown
            self._cap = self._cap * 2 + 4
        self._owners[no] = (ha, ra)     # (they keep the memory the pointers see)
        self._runs[self._k].h = &hs[0] if n else NULL
        self._runs[self._k].r = &rs[0] if n else NULL
        self._runs[self._k].n = n
        self._runs[self._k].base = no << 32
        self._runs[self._k].f = NULL       # (built by the first batch lookup: has_many)
        self._runs[self._k].fw = 0
        self._k += 1
        self._total += n

    def discard(self, int64_t no) -> bool:
        """Drop file ``no``'s run (False if it has none)."""
        cdef Py_ssize_t j
        for j in range(self._k):
            if self._runs[j].base == (no << 32):
                self._total -= self._runs[j].n
                free(self._runs[j].f)
                self._runs[j] = self._runs[self._k - 1]
                self._k -= 1
                del self._owners[no]
                self._forget()
                return True
        return False

    def clear(self) -> None:
        cdef Py_ssize_t j
        for j in range(self._k):
            free(self._runs[j].f)
        self._k = self._total = 0
        self._owners.clear()
        self._forget()

    def __len__(self):
        return self._total

    @property
    def filter_bytes(self) -> int:
        """Bytes of the runs' filters built so far (see :meth:`has_many`)."""
        cdef Py_ssize_t j, b = 0
        for j in range(self._k):
            b += self._runs[j].fw * <Py_ssize_t>sizeof(uint64_t)
        return b

    @property
    def filtered(self) -> int:
        """How many runs have their filter built."""
        cdef Py_ssize_t j, c = 0
        for j in range(self._k):
            c += self._runs[j].f != NULL
        return c

    def __contains__(self, no) -> bool:
        return no in self._owners

    @property
    def files(self) -> int:
        return self._k

    @property
    def nbytes(self) -> int:
        """Bytes of the runs' arrays (mapped or not)."""
        return self._total * (sizeof(uint64_t) + sizeof(uint32_t))

    def run(self, int64_t no):
        """(hashes, rows) of file ``no`` as added (KeyError if none)."""
        return self._owners[no]

    def values(self, uint64_t h) -> list:
        """``(no << 32) | row`` of every entry of every run whose hash is
        ``h``, by file as added, then by place in the run."""
        cdef list out = []
        cdef Py_ssize_t j, i
        cdef rf_idrun *run
        cdef rf_idmemo *m = NULL
        cdef rf_idmemo t
        cdef int64_t only = -1
        if self._memo_n:
            if self._memo == NULL:
                self._memo = <rf_idmemo *>calloc(<size_t>self._memo_n, sizeof(rf_idmemo))
                if self._memo == NULL:
                    raise MemoryError(f"IdRuns: cannot allocate {self._memo_n} kept answers")
            m = &self._memo[2 * (h & self._memo_mask)]
            if m[0].v != 0 and m[0].h == h:
                return [m[0].v - 1]
            if m[1].v != 0 and m[1].h == h:
                t = m[1]            # (the set's latest answer first: the older one goes next)
                m[1] = m[0]
                m[0] = t
                return [t.v - 1]
        for j in range(self._k):
            run = &self._runs[j]
            i = _first_at_least(run.h, run.n, h)
            while i < run.n and run.h[i] == h:
                only = run.base | run.r[i]
                out.append(only)
                i += 1
        if m != NULL and len(out) == 1:
            m[1] = m[0]
            m[0].h = h
            m[0].v = only + 1
        return out

    def kept(self, str msg_id, LocCache cache not None, LocCache lines=None):
        """The record of the archived row of ``msg_id`` in one call, when
        an exact read of it was answered before: a kept answer of
        :meth:`values` names its location (the hash of the id's UTF-8
        bytes, as the sidecars hash it) and `cache` holds a value there
        whose first item is a record of that very ``msg_id`` -- or bytes
        (a cache of the rows' lines), returned as they are for the caller
        to decode and check; where `cache` holds nothing there, what
        `lines` holds (the row's line: bytes). None otherwise (the caller
        then asks :meth:`values` and reads the row). An exact read asked
        again thus searches no run and builds no list."""
        cdef bytes b
        cdef const char *kp
        cdef Py_ssize_t kl
        cdef uint64_t h
        cdef int64_t loc, j
        cdef rf_idmemo *m
        if self._memo == NULL:
            return None
        if PyUnicode_IS_COMPACT_ASCII(msg_id):
            kp = <const char *>PyUnicode_DATA(msg_id)
            kl = PyUnicode_GET_LENGTH(msg_id)
        else:
            b = msg_id.encode("utf-8")
            kp = PyBytes_AS_STRING(b)
            kl = PyBytes_GET_SIZE(b)
        h = _xxh.XXH3_64bits(kp, <size_t>kl)
        m = &self._memo[2 * (h & self._memo_mask)]
        if m[0].v != 0 and m[0].h == h:
            loc = m[0].v - 1
        elif m[1].v != 0 and m[1].h == h:
            loc = m[1].v - 1
        else:
            return None
        j = cache._find(loc)
        if j < 0:
            if lines is None:
                return None
            j = lines._find(loc)
            if j < 0:
                return None
            cache = lines
        hit = <object>cache._c_slots[j].val
        if PyBytes_CheckExact(hit):
            return hit
        if not PyTuple_CheckExact(hit) or PyTuple_GET_SIZE(hit) < 1:
            return None
        rec = <object>PyTuple_GET_ITEM(hit, 0)
        return rec if rec.msg_id == msg_id else None

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def has_many(self, hashes):
        """bool array: whether any run holds each of ``hashes``. A batch
        (``FILTER_MIN_BATCH`` hashes or more) first builds the filters of
        runs that have none (at most ``FILTER_BUILD_BUDGET`` hashes a call,
        one run at least), then asks each filtered run's filter and
        searches that run for the hashes it lets through only (about 2% of
        the absent ones): the append path asks this of every batch's new
        ids, and a search in each of a large archive's runs cost each id a
        cache miss a run (0.4 ms a batch of 1,000 over 14 runs at
        1,000,000 messages). A run without a filter is searched whole,
        pipelined: the first guess of hash k + 24 is prefetched, hash
        k + 16 aims again, hash k + 8 aims a last time and has its places
        prefetched, and hash k is searched, so each search waits for no
        cache miss of its own."""
        cdef const uint64_t[::1] hs = np.ascontiguousarray(hashes, dtype=np.uint64)
        out = np.zeros(hs.shape[0], dtype=np.bool_)
        cdef uint8_t[::1] o = out.view(np.uint8)
        cdef Py_ssize_t k, j, i, m = hs.shape[0], n, c, budget = FILTER_BUILD_BUDGET
        cdef bint built = False
        cdef rf_idrun *run
        cdef const uint64_t *a
        cdef Py_ssize_t *g
        cdef Py_ssize_t *cand
        cdef uint64_t h
        if m == 0 or self._k == 0:
            return out
        g = <Py_ssize_t *>malloc(<size_t>m * 2 * sizeof(Py_ssize_t))
        if g == NULL:
            raise MemoryError(f"IdRuns.has_many: {m} hashes")
        cand = g + m
        with nogil:
            for j in range(self._k):
                run = &self._runs[j]
                a = run.h
                n = run.n
                if n == 0:
                    continue
                if run.f == NULL and m >= FILTER_MIN_BATCH and (not built or n <= budget):
                    if _filter_build(run) == 0:
                        built = True
                        budget -= n
                if run.f != NULL:
                    # the filter first: only the hashes it lets through are searched
                    # (word k + 16 prefetched while hash k is tested: between
                    # two appends the filters leave the CPU caches)
                    c = 0
                    for k in range(m + 16):
                        if k < m:
                            rf_prefetch(run.f + _filter_word(hs[k], run.fw))
                        i = k - 16
                        if i >= 0 and not o[i]:
                            h = hs[i]
                            if (run.f[_filter_word(h, run.fw)] & _filter_bits(h)) == _filter_bits(h):
                                cand[c] = i
                                c += 1
                    for k in range(c):
                        i = _first_at_least(a, n, hs[cand[k]])
                        if i < n and a[i] == hs[cand[k]]:
                            o[cand[k]] = 1
                    continue
                for k in range(m + 24):
                    if k < m:
                        g[k] = _guess(hs[k], n)
                        rf_prefetch(a + g[k])
                    i = k - 8
                    if 0 <= i < m:
                        g[i] = _aim(a, n, hs[i], g[i])
                        rf_prefetch(a + g[i])
                    i = k - 16
                    if 0 <= i < m:
                        g[i] = _aim(a, n, hs[i], g[i])
                        rf_prefetch(a + (g[i] - 9 if g[i] >= 9 else 0))
                        rf_prefetch(a + (g[i] + 8 if g[i] + 8 < n else n - 1))
                    i = k - 24
                    if 0 <= i < m and not o[i]:
                        i = _first_near(a, n, hs[k - 24], g[k - 24])
                        if i < n and a[i] == hs[k - 24]:
                            o[k - 24] = 1
        free(g)
        return out
