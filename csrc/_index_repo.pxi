# _index_repo.pxi: the repository's calls compiled for their common case
# (ConversationStateRepository binds them as its methods): window and
# get_message answered from the state its instance dict holds, under its
# lock, in one call from the caller's code; anything else goes to the
# repository's Python path. (Included by _index.pyx after _index_hot.pxi,
# whose Python.h and RLock declarations it uses.)

cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1


# ConversationStateRepository.window, compiled (the class binds it as its
# method): the common window -- hot, cached, not interleaved with the cool
# tier -- costs one call from the caller's code, not a Python frame with its
# attribute loads and lock method calls (measured in the bench's interleaved
# loop: the facade was 0.74 of 2.3 us). Anything else goes to the
# repository's ``_window_general`` (the checks of the arguments, the lock,
# every tier).
cdef object _w_own = None
cdef own_fn _w_own_c = NULL
cdef type _w_rlock_type = None      # _thread.RLock when its layout is rf_rlock's (_index_hot.pxi)
cdef str _W_LOCK = "_lock"
cdef str _W_CLOSED = "_closed"
cdef str _W_INDEX = "_index"
cdef str _W_DECODED = "_decoded"
cdef str _W_VERDICTS = "_interleaved"

cdef inline object _w_get(object d, str key):
    """d[key] (a new reference) or None."""
    cdef PyObject *p = PyDict_GetItem(d, key)
    return None if p == NULL else <object>p


cdef inline PyObject *_w_borrow(object d, str key):
    return PyDict_GetItem(d, key)


def _rlock_probe():
    """Whether an RLock's fields lie where rf_rlock says (owner, count
    after two acquires and a release): the window then takes and gives back
    an uncontended repository lock without a method call."""
    import _thread
    lock = _thread.RLock()
    if type(lock).__basicsize__ != sizeof(rf_rlock):
        return False
    cdef rf_rlock *r = <rf_rlock *><void *>lock
    me = PyThread_get_thread_ident()
    if r.rlock_count != 0 or r.rlock_owner != 0 or r.rlock_lock == NULL:
        return False
    lock.acquire()
    lock.acquire()
    ok = r.rlock_count == 2 and r.rlock_owner == me
    lock.release()
    ok = ok and r.rlock_count == 1 and r.rlock_owner == me
    lock.release()
    return ok and r.rlock_count == 0 and not lock._is_owned()


cdef inline bint _rlock_try(PyObject *lock) noexcept:
    """Take the RLock without blocking (as RLock.acquire(False) would); False
    if another thread holds it."""
    cdef rf_rlock *r = <rf_rlock *>lock
    cdef unsigned long me = PyThread_get_thread_ident()
    if r.rlock_count > 0 and r.rlock_owner == me:
        if r.rlock_count == <unsigned long>-1:
            return False
        r.rlock_count += 1
        return True
    if PyThread_acquire_lock_timed(<PyThread_type_lock>r.rlock_lock, 0, 0) != PY_LOCK_ACQUIRED:
        return False
    r.rlock_owner = me
    r.rlock_count = 1
    return True


cdef inline void _rlock_release(PyObject *lock) noexcept:
    """Give back what _rlock_try took (this thread holds it)."""
    cdef rf_rlock *r = <rf_rlock *>lock
    r.rlock_count -= 1
    if r.rlock_count == 0:
        r.rlock_owner = 0
        PyThread_release_lock(<PyThread_type_lock>r.rlock_lock)


def repo_window_setup(own, own_c=None) -> None:
    """The copy of tool calls each window's records get (codec.own_calls),
    and the same as a C function (a capsule of
    ``_encode.OWN_CALLS_C``), used when given."""
    global _w_own, _w_own_c, _w_rlock_type
    import _thread
    _w_own = own
    _w_own_c = NULL if own_c is None else <own_fn>PyCapsule_GetPointer(own_c, b"rune_fast._encode.own_calls")
    _w_rlock_type = _thread.RLock if _rlock_probe() else None


cdef object _w_cached(object self, str channel_id, Py_ssize_t n):
    """The common window from the instance's state, or None (see
    repo_window): the lock taken without blocking where it is free (else
    as the lock's own acquire() takes it), the state read under it (a
    reload or a close replaces it under the lock; five dict lookups, ~60 ns,
    no reference kept between calls)."""
    cdef object d = PyObject_GenericGetDict(self, NULL)
    cdef PyObject *lock = _w_borrow(d, _W_LOCK)
    cdef PyObject *idx
    cdef PyObject *cache
    cdef PyObject *verdicts
    cdef PyObject *closed
    cdef bint fast
    if lock == NULL:
        return None
    lock_o = <object>lock
    fast = type(lock_o) is _w_rlock_type and _rlock_try(lock)
    if not fast:
        lock_o.acquire()
    try:
        idx = _w_borrow(d, _W_INDEX)
        cache = _w_borrow(d, _W_DECODED)
        verdicts = _w_borrow(d, _W_VERDICTS)
        closed = _w_borrow(d, _W_CLOSED)
        if not (closed == Py_False and idx != NULL and type(<object>idx) is HotIndex
                and cache != NULL and type(<object>cache) is LocCache
                and verdicts != NULL and type(<object>verdicts) is dict):
            # closed, or a state this path does not read: the general path
            # (which takes the lock) answers
            return None
        return (<HotIndex><object>idx)._window_cached(channel_id, n, <LocCache><object>cache,
                                                      <dict><object>verdicts, _w_own, _w_own_c)
    finally:
        if fast:
            _rlock_release(lock)
        else:
            lock_o.release()


def repo_window(self, channel_id, n=8):
    """The last ``n`` messages of the channel, oldest first ([] for n <= 0
    or an unknown channel)."""
    if type(channel_id) is str and type(n) is int and 0 < n <= 64 and _w_own is not None:
        # the state as the instance's dict holds it now, each read under
        # the lock (a reload or a close replaces what it names). A channel
        # found in the index was stored, so its id needs no check (one with
        # a lone surrogate is in no index)
        got = _w_cached(self, <str>channel_id, <Py_ssize_t>n)
        if got is not None:
            return got
    return self._window_general(channel_id, n)


# ConversationStateRepository.get_message, compiled the same way for the
# read a store at volume answers most: an archived row whose verified
# record an exact read kept (the id index's kept answer names its cache
# slot, IdRuns.kept). The checks of the Python path are made in its order
# -- an id that is not compact ASCII, a closed store, a deleted id, a hot
# one, a state of other types, either lock held by another thread (the
# archive's is held by a background run while it checks its rows) or
# nothing kept: the repository's ``_get_message_general`` answers.
cdef object _g_read = None          # MessageRead
cdef object _g_found = None         # ReadStatus.FOUND_VERIFIED
cdef str _G_TOMBS = "_tombstones"
cdef str _G_COOL = "_cool"
cdef str _G_COOL_DECODED = "_cool_decoded"
cdef str _G_IDS = "_ids_d"          # (the archive's IdRuns, once no sidecar is left unread)
cdef str _G_UNLOADED = "_unloaded"
cdef str _G_STATUS = "status"
cdef str _G_RECORD = "record"
cdef str _G_TIER = "tier"
cdef str _G_TIER_COOL = "cool"


def repo_get_setup(read_type, found_status) -> None:
    """The result type of get_message (MessageRead) and its found status."""
    global _g_read, _g_found
    _g_read = read_type
    _g_found = found_status


cdef object _g_kept(object self, str msg_id):
    """The MessageRead of ``msg_id``'s kept archived record, or None (see
    repo_get_message)."""
    cdef object d = PyObject_GenericGetDict(self, NULL)
    cdef PyObject *lock = _w_borrow(d, _W_LOCK)
    cdef PyObject *p
    cdef PyObject *clock
    cdef object cool, cd, ids, dec, rec, one, r
    if lock == NULL or type(<object>lock) is not _w_rlock_type or not _rlock_try(lock):
        return None
    try:
        p = _w_borrow(d, _W_CLOSED)
        if p != Py_False:
            return None
        p = _w_borrow(d, _G_TOMBS)
        if p == NULL or type(<object>p) is not dict or msg_id in <dict><object>p:
            return None
        p = _w_borrow(d, _W_INDEX)
        if p == NULL or type(<object>p) is not HotIndex or (<HotIndex><object>p).find_id(msg_id) != -1:
            return None
        p = _w_borrow(d, _G_COOL_DECODED)
        if p == NULL or type(<object>p) is not LocCache:
            return None
        dec = <object>p
        p = _w_borrow(d, _G_COOL)
        if p == NULL:
            return None
        cd = getattr(<object>p, "__dict__", None)
        if type(cd) is not dict:
            return None
        clock = _w_borrow(cd, _W_LOCK)
        p = _w_borrow(cd, _G_IDS)
        if clock == NULL or type(<object>clock) is not _w_rlock_type or p == NULL or type(<object>p) is not IdRuns:
            return None
        ids = <object>p
        if not _rlock_try(clock):
            return None
        try:
            p = _w_borrow(cd, _G_UNLOADED)
            if p == NULL or type(<object>p) is not list or len(<list><object>p):
                return None     # (sidecars not read yet: the general path reads them)
            rec = (<IdRuns>ids).kept(msg_id, <LocCache>dec, None)
        finally:
            _rlock_release(clock)
        if rec is None or PyBytes_CheckExact(rec):
            return None
        if rec.tool_calls:
            # (a cached record's tool calls are read-only already: as _own)
            one = [rec]
            if _w_own_c != NULL:
                _w_own_c(one)
            else:
                _w_own(one)
            rec = one[0]
        r = (<type>_g_read).__new__(<type>_g_read)
        PyObject_GenericSetAttr(r, _G_STATUS, _g_found)
        PyObject_GenericSetAttr(r, _G_RECORD, rec)
        PyObject_GenericSetAttr(r, _G_TIER, _G_TIER_COOL)
        return r
    finally:
        _rlock_release(lock)


def repo_get_message(self, msg_id):
    """Exact read across tiers, verified against the stored checksum or digest."""
    if type(msg_id) is str and PyUnicode_IS_COMPACT_ASCII(msg_id) and _g_read is not None \
            and _w_own is not None:
        got = _g_kept(self, <str>msg_id)
        if got is not None:
            return got
    return self._get_message_general(msg_id)
