# cython: boundscheck=False, wraparound=False
"""The record JSON of message lines, compiled: written on the append path,
read back by cooling and by hot reads.

:func:`encode_messages` gives, for each record, the record JSON of its tail
line (``orjson.dumps(record.to_dict())``), its ``payload_hash`` (sha256 of the
canonical JSON: sorted keys, no spaces) and its id key (the JSON-escaped
``msg_id``, as the index keys it), byte for byte what
:func:`rune_fast.codec.message_body_and_hash` and :func:`rune_fast.codec.key`
give. Each record's raw JSON values are written once (strings escaped), then
both layouts from them. A record it cannot spell exactly (a time outside the
range where ``repr`` and orjson print floats alike, a token estimate past
int64, a string that is not valid UTF-8) and a record past the size limit go
through the Python path, which names the problem.

:func:`frame_messages` and :func:`message_envelopes` frame a batch's tail
lines and event-store envelopes (docs/FORMAT.md) into one buffer each.

:func:`cool_columns` reads verified lines spelled as the encoder spells them
straight into the Arrow buffers of a cool file (each value unescaped, the
digest from the line's own values in sorted key order); :func:`record_from_line`
builds a line's record. Any other line is left to the Python path.
tests/test_encode.py checks all of it against the Python path on generated
records.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free
from cpython.ref cimport Py_INCREF
from cpython.pycapsule cimport PyCapsule_New
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_AsUTF8String
from libc.stdint cimport INT64_MIN, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort, realloc
from libc.string cimport memchr, memcmp, memcpy, memset, strlen

from rf_core cimport RF_MAX_LINE, RF_PREFIX_LEN, rf_write_prefix

cdef extern from "rf_core.h" nogil:
    void rf_write_hex16(uint64_t v, unsigned char *out)

import hashlib

import numpy as np

from rune_fast.errors import FramingError

cdef extern from "Python.h":
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)
    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    object PyFloat_FromDouble(double v)
    object PyLong_FromLongLong(long long v)
    char *PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int *ptype) except NULL
    int Py_DTSF_ADD_DOT_0
    bint PyUnicode_IS_ASCII(object o)
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *size) except NULL
    void PyObject_GC_Track(void *op)
    void PyObject_GC_UnTrack(void *op)
    int PyObject_GC_IsTracked(object op)
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1
    ctypedef struct PyObject
    void Py_XINCREF(PyObject *o)
    object PyDict_Copy(object d)
    object PyList_GetSlice(object l, Py_ssize_t low, Py_ssize_t high)
    str PyUnicode_New(Py_ssize_t size, unsigned int maxchar)
    void *PyUnicode_DATA(object o)

cdef extern from *:
    """
    /* a blank instance of the type t, as object.__new__(t) makes it */
    static PyObject *rf_blank(PyObject *t) {
        PyTypeObject *tp = (PyTypeObject *)t;
        return tp->tp_alloc(tp, 0);
    }
    """
    object rf_blank(object t)

# The Python callables the compiled path hands records to.
_sha256 = hashlib.sha256

#: ``,"k":"m","r":`` -- what stands between a message line's prefix and its record JSON.
cdef frozenset _ROLE_SET = frozenset(("user", "assistant", "system", "tool"))
cdef bytes _MSG_PREFIX = b',"k":"m","r":'
cdef bytes _ENV_HEAD = b',"type":"conversation.message","id":"'
cdef bytes _ENV_HASH = b'","payload_hash":"'
cdef bytes _ENV_TS = b'","ts":'

cdef extern from "rf_float.h" nogil:
    int rf_float_repr(double v, char *out)

cdef extern from "rf_json.h" nogil:
    size_t rf_json_escape(const unsigned char *s, size_t n, unsigned char *out)
    size_t rf_json_escape_ucs(int kind, const void *data, size_t n, unsigned char *out)
    size_t rf_json_plain_run(const unsigned char *s, size_t n)


cdef struct Buf:
    char *p
    Py_ssize_t n
    Py_ssize_t cap


cdef inline int _grow(Buf *b, Py_ssize_t extra) noexcept nogil:
    """Room for ``extra`` more bytes on b: 0, or -1 out of memory."""
    cdef Py_ssize_t cap
    cdef char *p
    if b.n + extra <= b.cap:
        return 0
    cap = max(b.cap * 2, b.n + extra, 4096)
    p = <char *>realloc(b.p, <size_t>cap)
    if p == NULL:
        return -1
    b.p = p
    b.cap = cap
    return 0


cdef int _reserve(Buf *b, Py_ssize_t extra) except -1 nogil:
    if _grow(b, extra) < 0:
        with gil:
            raise MemoryError("encode_messages: scratch buffer")
    return 0


cdef inline void _put(Buf *b, const char *s, Py_ssize_t n) noexcept nogil:
    # room was reserved by the caller
    memcpy(b.p + b.n, s, <size_t>n)
    b.n += n


cdef int _put_escaped(Buf *b, const unsigned char *s, Py_ssize_t n) except -1:
    """JSON-escape the UTF-8 bytes s[0:n) onto b, as orjson and json do."""
    _reserve(b, 6 * n + 16)
    b.n += <Py_ssize_t>rf_json_escape(s, <size_t>n, <unsigned char *>b.p + b.n)
    return 0


cdef int _escape_str(Buf *b, object s) except -1:
    """Escape str ``s`` onto b; -2 if it is not a str or not valid UTF-8.
    A str that is not ASCII is escaped from its code points as they lie
    (rf_json_escape_ucs): no UTF-8 bytes object made (and none cached on
    the str: memory), one pass instead of an encode, a copy and a scan."""
    cdef Py_ssize_t n
    cdef const char *p
    cdef size_t w
    if type(s) is not str:
        return -2
    if PyUnicode_IS_ASCII(s):
        p = PyUnicode_AsUTF8AndSize(s, &n)     # the str's own bytes: no copy
        _put_escaped(b, <const unsigned char *>p, n)
        return 0
    n = PyUnicode_GET_LENGTH(s)
    _reserve(b, 6 * n + 16)
    w = rf_json_escape_ucs(PyUnicode_KIND(s), PyUnicode_DATA(s), <size_t>n,
                           <unsigned char *>b.p + b.n)
    if w == <size_t>-1:
        return -2                              # a lone surrogate
    b.n += <Py_ssize_t>w
    return 0


# The record JSON of a message line and its canonical JSON (sorted keys), as
# layouts: the encoder writes both from one table of raw values, cooling and
# reads parse the first and rebuild the second from the line's own values.
# Raw JSON values of a record, by field (start and length in the line).
cdef enum:
    R_MSG_ID, R_CHANNEL, R_TASK, R_HLC, R_CONTENT, R_TS, R_ROLE, R_TOKEN, R_TOOL_CALLS,
    R_TOOL_CALL_ID, R_ORIGIN, R_VERSION, N_RAW

# The record JSON of a tail line, key by key, with the kind of its value.
cdef enum:
    S, F, I, L      # string, float, integer, the empty tool-call list
cdef tuple _RECORD_KEYS = (
    (b'{"msg_id":', S), (b',"channel_id":', S), (b',"task_id":', S),
    (b',"hlc":', S), (b',"content":', S), (b',"ts":', F), (b',"role":', S),
    (b',"token_estimate":', I), (b',"tool_calls":', L), (b',"tool_call_id":', S),
    (b',"origin":', S), (b',"schema_version":', I))
# The canonical JSON's keys (sorted) and the raw value each takes.
cdef tuple _CANON_KEYS = (
    (b'{"channel_id":', R_CHANNEL), (b',"content":', R_CONTENT), (b',"hlc":', R_HLC),
    (b',"msg_id":', R_MSG_ID), (b',"origin":', R_ORIGIN), (b',"role":', R_ROLE),
    (b',"schema_version":', R_VERSION), (b',"task_id":', R_TASK),
    (b',"token_estimate":', R_TOKEN), (b',"tool_call_id":', R_TOOL_CALL_ID),
    (b',"tool_calls":', R_TOOL_CALLS), (b',"ts":', R_TS))
# The record JSON's layout with each key's raw value.
cdef tuple _BODY_KEYS = tuple([(_RECORD_KEYS[k][0], k) for k in range(N_RAW)])
# The string fields by record attribute, and where their raw values go.
cdef tuple _STRING_FIELDS = (("msg_id", R_MSG_ID), ("channel_id", R_CHANNEL), ("task_id", R_TASK),
                             ("hlc", R_HLC), ("content", R_CONTENT), ("role", R_ROLE),
                             ("tool_call_id", R_TOOL_CALL_ID), ("origin", R_ORIGIN))
# ... and each one's place in _INIT_FIELDS (the constructor's order)
cdef Py_ssize_t[8] _STRING_INIT = [0, 4, 5, 10, 3, 2, 8, 9]
# ... and their raw values' places (the second items of _STRING_FIELDS)
cdef int[8] _STRING_RAW = [R_MSG_ID, R_CHANNEL, R_TASK, R_HLC, R_CONTENT, R_ROLE, R_TOOL_CALL_ID, R_ORIGIN]


cdef inline object _field(object rec, Py_ssize_t k, bint direct):
    """Field ``_INIT_FIELDS[k]`` of a record: with ``direct`` (its type is
    the one message_init_setup laid out, every slot found) the slot's
    pointer read in place, as the slot's descriptor reads it; an unset slot
    through getattr (which raises AttributeError, as before)."""
    cdef PyObject *p
    if direct:
        p = (<PyObject **>(<char *><void *>rec + _mi_at[k]))[0]
        if p != NULL:
            return <object>p
    return getattr(rec, _INIT_FIELDS[k])


# The two layouts as C arrays (the bytes stay alive in the tuples above):
# _assemble writes 2 x 12 keys a record, and a tuple's items cost a type
# check and a reference each
cdef struct _Key:
    const char *lit
    Py_ssize_t n
    int f

cdef _Key _BODY_C[N_RAW]
cdef _Key _CANON_C[N_RAW]


cdef void _layout_c(tuple layout, _Key *out) noexcept:
    cdef Py_ssize_t m
    cdef bytes lit
    for m in range(N_RAW):
        lit = layout[m][0]
        out[m].lit = PyBytes_AS_STRING(lit)
        out[m].n = PyBytes_GET_SIZE(lit)
        out[m].f = layout[m][1]


_layout_c(_BODY_KEYS, _BODY_C)
_layout_c(_CANON_KEYS, _CANON_C)


cdef inline int _assemble(Buf *o, const _Key *layout, const char *base, const Py_ssize_t *rs,
                          const Py_ssize_t *rl, const char *calls, Py_ssize_t calls_n) noexcept nogil:
    """Write ``layout`` (N_RAW keys) onto o (room reserved): each key, then
    its raw value ``base[rs[f]:rs[f] + rl[f]]`` -- or, for the tool calls,
    ``calls[0:calls_n]`` when ``calls_n`` >= 0 -- then the closing brace."""
    cdef Py_ssize_t m
    cdef int f
    for m in range(N_RAW):
        f = layout[m].f
        _put(o, layout[m].lit, layout[m].n)
        if f == R_TOOL_CALLS and calls_n >= 0:
            _put(o, calls, calls_n)
        else:
            _put(o, base + rs[f], rl[f])
    _put(o, b"}", 1)
    return 0


# The tool calls of the common shape, spelled in C (what codec._calls_json
# gives from orjson, without a Python call, a list copy and two encodes a
# record: measured 2.97 us a record that has tool calls, a sixth of the bench's
# records). Anything this does not spell exactly goes to calls_json.
cdef int _CALLS_DEPTH = 256         # as json_safe: deeper goes to calls_json


cdef int _put_lit(Buf *b, const char *s, Py_ssize_t n) except -1:
    _reserve(b, n)
    _put(b, s, n)
    return 0


cdef int _calls_value(Buf *b, object v, bint sort, int depth) except -1:
    """Write the JSON value ``v`` onto b as orjson.dumps does (keys sorted
    at every level if ``sort``, as with OPT_SORT_KEYS): 0; 1 where this
    does not spell it (a float, a subclass but the read-only ones, a key that is not an ASCII str,
    a lone surrogate, an int past int64, nesting past 256 levels): the
    caller discards what it wrote and takes calls_json."""
    cdef object t = type(v)
    cdef long long iv
    cdef int overflow, nd
    cdef char digits[24]
    cdef Py_ssize_t i, n
    cdef list ks
    cdef object k
    if t is str:
        _put_lit(b, b'"', 1)
        if _escape_str(b, v) != 0:
            return 1
        _put_lit(b, b'"', 1)
        return 0
    if t is int:
        iv = PyLong_AsLongLongAndOverflow(v, &overflow)
        if overflow != 0 or iv == INT64_MIN:
            return 1
        if iv < 0:
            _put_lit(b, b"-", 1)
            iv = -iv
        nd = _digits(iv, digits)
        _put_lit(b, digits, nd)
        return 0
    if t is bool:
        if v:
            _put_lit(b, b"true", 4)
        else:
            _put_lit(b, b"false", 5)
        return 0
    if v is None:
        _put_lit(b, b"null", 4)
        return 0
    if depth >= _CALLS_DEPTH:
        return 1
    if t is list or t is ReadOnlyList:
        n = len(<list>v)
        _put_lit(b, b"[", 1)
        for i in range(n):
            if i:
                _put_lit(b, b",", 1)
            if _calls_value(b, (<list>v)[i], sort, depth + 1):
                return 1
        _put_lit(b, b"]", 1)
        return 0
    if t is dict or t is ReadOnlyDict:
        if sort and len(<dict>v) > 1:
            ks = list(<dict>v)
            for k in ks:
                if type(k) is not str or not PyUnicode_IS_ASCII(k):
                    return 1
            ks.sort()           # (ASCII: code point order, as orjson's)
        else:
            ks = None
        _put_lit(b, b"{", 1)
        i = 0
        for k in (ks if ks is not None else <dict>v):
            if type(k) is not str or not PyUnicode_IS_ASCII(k):
                return 1
            if i:
                _put_lit(b, b",", 1)
            i += 1
            _put_lit(b, b'"', 1)
            _escape_str(b, k)
            _put_lit(b, b'":', 2)
            if _calls_value(b, (<dict>v)[k], sort, depth + 1):
                return 1
        _put_lit(b, b"}", 1)
        return 0
    return 1


cdef int _calls_out(Buf *b, tuple calls, bint sort) except -1:
    """The JSON of a record's tool calls onto b (see _calls_value) when
    each is a plain (or read-only) dict with str ``id`` and ``name`` and an ``arguments``
    key (what records._stored_calls_ok asks): 0; else 1."""
    cdef Py_ssize_t i
    cdef object call
    _put_lit(b, b"[", 1)
    for i in range(PyTuple_GET_SIZE(calls)):
        call = <object>PyTuple_GET_ITEM(calls, i)
        if (type(call) is not dict and type(call) is not ReadOnlyDict) or "arguments" not in <dict>call \
                or type((<dict>call).get("id")) is not str or type((<dict>call).get("name")) is not str:
            return 1
        if i:
            _put_lit(b, b",", 1)
        if _calls_value(b, call, sort, 1):
            return 1
    _put_lit(b, b"]", 1)
    return 0


# encode_messages works in three passes over a batch:
#   1. with the GIL, in order: each record's values read and checked, its
#      strs held (a reference each), its tool calls spelled (Python
#      objects); a record this path does not spell goes to ``slow`` here;
#   2. in C: each record's strs escaped and both JSONs assembled into a
#      part's buffer (_spell), by the caller and -- a batch of at least
#      _parallel_min records -- the worker, a C thread without the GIL, at
#      once (a str is immutable and held: only its code points are read;
#      the caller keeps the GIL throughout, as a record at a time does);
#   3. with the GIL, in order: the bytes objects made; a record pass 2 left
#      goes to ``slow`` (a lone surrogate, past the size limit: it raises
#      naming the record) or is spelled again (a time only dtoa writes).
# An exception in pass 1 (a record's index, slow's, calls_json's) is
# raised after pass 3 has dealt with the records before it, so the
# lowest failing index raises, as a record-by-record encoder raises.

cdef enum:
    # a record's state: to spell in C (and spelled), given by slow() in
    # pass 1, left by pass 2 to slow(), its time left to dtoa
    _C, _DONE, _SLOW, _DTOA

cdef struct _Rec:
    PyObject *s[8]          # the str fields, in _STRING_RAW's order (a reference held on each)
    PyObject *calls         # its tool calls' JSON then their canonical JSON (bytes, held); NULL: []
    Py_ssize_t calls_n      # (the first one's length)
    double ts
    long long tok
    Py_ssize_t at           # pass 2's output: the record JSON at out[at:][:body_n], the
    Py_ssize_t body_n       # canonical JSON after it, in its part's out
    Py_ssize_t canon_n
    Py_ssize_t key_n        # (the key: the escaped msg_id, in the record JSON)
    int state
    int part

cdef struct _Part:
    _Rec *recs
    Py_ssize_t *next        # the first record not claimed (the parts' own, rf_claim)
    Py_ssize_t hi           # pass 1 stopped here
    int idx
    const char *verb        # the schema version's digits
    Py_ssize_t verb_n
    Py_ssize_t max_bytes    # max_record_bytes
    Buf esc                 # a record's raw values
    Buf out
    bint failed             # out of memory

#: A batch of this many records is spelled by two threads at once.
cdef Py_ssize_t _parallel_min = 256
#: Records a thread claims at a time (~20 us of work): the last claim of
#: either thread ends at most this much after the other's.
cdef Py_ssize_t _claim = 16

# the part buffers the last batch left for the next (the GIL guards them):
# grown anew each batch they came from fresh pages (see HashJob.__dealloc__)
cdef Buf _kept[4]


def _set_parallel(Py_ssize_t min_records, Py_ssize_t claim=16) -> tuple:
    """(tests) Spell batches of ``min_records`` or more in two threads,
    ``claim`` records at a time; returns the values it replaces."""
    global _parallel_min, _claim
    if claim < 1:
        raise ValueError("claim must be at least 1")
    old = (_parallel_min, _claim)
    _parallel_min, _claim = min_records, claim
    return old


cdef extern from "Python.h" nogil:
    # a held str read without the GIL
    Py_ssize_t _str_len "PyUnicode_GET_LENGTH"(PyObject *o)
    int _str_kind "PyUnicode_KIND"(PyObject *o)
    const void *_str_data "PyUnicode_DATA"(PyObject *o)
    bint _str_ascii "PyUnicode_IS_ASCII"(PyObject *o)
    const char *_bytes_data "PyBytes_AS_STRING"(PyObject *o)
    Py_ssize_t _bytes_len "PyBytes_GET_SIZE"(PyObject *o)

cdef extern from *:
    """
    /* the first of the next k records, claimed */
    static inline Py_ssize_t rf_claim(Py_ssize_t *next, Py_ssize_t k) {
        return __atomic_fetch_add(next, k, __ATOMIC_RELAXED);
    }
    """
    Py_ssize_t rf_claim(Py_ssize_t *next, Py_ssize_t k) noexcept nogil

cdef extern from "<unistd.h>" nogil:
    int getpid()


cdef int _escape_c(Buf *b, PyObject *s) noexcept nogil:
    """The held str ``s`` quoted and escaped onto b, as _escape_str writes
    it: 0; -1 out of memory; -2 a lone surrogate."""
    cdef Py_ssize_t n = _str_len(s)
    cdef size_t w
    if _grow(b, 6 * n + 18) < 0:
        return -1
    _put(b, b'"', 1)
    if _str_ascii(s):
        w = rf_json_escape(<const unsigned char *>_str_data(s), <size_t>n, <unsigned char *>b.p + b.n)
    else:
        w = rf_json_escape_ucs(_str_kind(s), _str_data(s), <size_t>n, <unsigned char *>b.p + b.n)
        if w == <size_t>-1:
            return -2
    b.n += <Py_ssize_t>w
    _put(b, b'"', 1)
    return 0


cdef int _spell(_Part *pt, _Rec *r, const char *tsrep, Py_ssize_t tsrep_n) noexcept nogil:
    """Record r's record JSON and canonical JSON onto pt.out (r.at ...):
    0; or why not: _SLOW (a lone surrogate, past the size limit), _DTOA (a
    time rf_float_repr leaves to dtoa; ``tsrep``, if not NULL, is its
    repr); -1 out of memory."""
    cdef Py_ssize_t rs[N_RAW]
    cdef Py_ssize_t rl[N_RAW]
    cdef char num[48]
    cdef char tok[24]
    cdef const char *cb = b"[]"
    cdef const char *cc = b"[]"
    cdef Py_ssize_t cbn = 2, ccn = 2, tokn
    cdef Buf *esc = &pt.esc
    cdef Buf *out = &pt.out
    cdef int k, f, e
    esc.n = 0
    for k in range(8):
        f = _STRING_RAW[k]
        rs[f] = esc.n
        e = _escape_c(esc, r.s[k])
        if e == -2:
            return _SLOW
        if e:
            return -1
        rl[f] = esc.n - rs[f]
    if tsrep == NULL:
        # repr(ts) from rf_float_repr where it decides it (a time of the
        # epoch: about 0.36 us less than dtoa)
        e = rf_float_repr(r.ts, num)
        if e < 0:
            return _DTOA
        tsrep = num
        tsrep_n = e
    tokn = _digits(r.tok, tok)
    if _grow(esc, tsrep_n + tokn + pt.verb_n) < 0:
        return -1
    rs[R_TS] = esc.n
    rl[R_TS] = tsrep_n
    _put(esc, tsrep, tsrep_n)
    rs[R_TOKEN] = esc.n
    rl[R_TOKEN] = tokn
    _put(esc, tok, tokn)
    rs[R_VERSION] = esc.n
    rl[R_VERSION] = pt.verb_n
    _put(esc, pt.verb, pt.verb_n)
    if r.calls != NULL:
        cb = _bytes_data(r.calls)
        cbn = r.calls_n
        cc = cb + cbn
        ccn = _bytes_len(r.calls) - cbn
    # both JSONs: the raw values, the keys (under 256 bytes a layout), the calls
    if _grow(out, 2 * esc.n + 512 + cbn + ccn) < 0:
        return -1
    r.at = out.n
    _assemble(out, _BODY_C, esc.p, rs, rl, cb, cbn)
    r.body_n = out.n - r.at
    if r.body_n > pt.max_bytes:
        out.n = r.at
        return _SLOW
    _assemble(out, _CANON_C, esc.p, rs, rl, cc, ccn)
    r.canon_n = out.n - r.at - r.body_n
    r.key_n = rl[R_MSG_ID] - 2
    r.part = pt.idx
    return 0


cdef void _spell_part(_Part *pt) noexcept nogil:
    """Pass 2: spell the records this part claims, _claim at a time."""
    cdef Py_ssize_t i, lo
    cdef int e
    while not pt.failed:
        lo = rf_claim(pt.next, _claim)
        if lo >= pt.hi:
            return
        for i in range(lo, min(lo + _claim, pt.hi)):
            if pt.recs[i].state == _C:
                e = _spell(pt, &pt.recs[i], NULL, 0)
                if e < 0:
                    pt.failed = True
                    return
                pt.recs[i].state = e


# The worker: one C thread a process, started by the first large batch,
# that takes the part a batch offers and claims records with the caller.
# A part it has not taken when the caller's claims run out is taken back
# (a busy machine: the caller never waits for a thread still to be
# scheduled); one it took, the caller waits for. One batch at a time: a
# second caller meanwhile spells its batch alone.
cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t *th, const void *attr, void *(*run)(void *) noexcept nogil, void *arg)
    int pthread_join(pthread_t th, void **ret)
    int pthread_detach(pthread_t th)
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *m, const void *attr)
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)
    int pthread_cond_init(pthread_cond_t *c, const void *attr)
    int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
    int pthread_cond_signal(pthread_cond_t *c)
    int pthread_cond_broadcast(pthread_cond_t *c)

cdef pthread_mutex_t _w_mu
cdef pthread_cond_t _w_wake             # a part offered
cdef pthread_cond_t _w_idle             # the worker done with its part
cdef _Part *_w_offer = NULL             # the part offered, not yet taken
cdef _Part *_w_running = NULL           # the part the worker spells
cdef int _w_pid = 0                     # the process whose worker it is (a fork's child starts its own)


cdef void *_worker(void *arg) noexcept nogil:
    global _w_offer, _w_running
    cdef _Part *pt
    pthread_mutex_lock(&_w_mu)
    while True:
        while _w_offer == NULL:
            pthread_cond_wait(&_w_wake, &_w_mu)
        pt = _w_running = _w_offer
        _w_offer = NULL
        pthread_mutex_unlock(&_w_mu)
        _spell_part(pt)
        pthread_mutex_lock(&_w_mu)
        _w_running = NULL
        pthread_cond_broadcast(&_w_idle)


cdef bint _offer(_Part *pt) noexcept:
    """Offer pt to the worker (started if need be: with the GIL, one
    caller starts it): False if there is none or it is busy."""
    global _w_pid, _w_offer, _w_running
    cdef pthread_t th
    cdef bint ok
    if _w_pid != getpid():
        pthread_mutex_init(&_w_mu, NULL)
        pthread_cond_init(&_w_wake, NULL)
        pthread_cond_init(&_w_idle, NULL)
        _w_offer = _w_running = NULL
        if pthread_create(&th, NULL, _worker, NULL) != 0:
            return False
        pthread_detach(th)
        _w_pid = getpid()
    pthread_mutex_lock(&_w_mu)
    ok = _w_offer == NULL and _w_running == NULL
    if ok:
        _w_offer = pt
        pthread_cond_signal(&_w_wake)
    pthread_mutex_unlock(&_w_mu)
    return ok


cdef void _take_back(_Part *pt) noexcept nogil:
    """pt back from the worker: taken back if it has not started on it,
    else once it is done."""
    global _w_offer
    pthread_mutex_lock(&_w_mu)
    if _w_offer == pt:
        _w_offer = NULL
    while _w_running == pt:
        pthread_cond_wait(&_w_idle, &_w_mu)
    pthread_mutex_unlock(&_w_mu)


cdef int _gather(tuple msgs, type record_type, object slow, object calls_json, _Rec *recs,
                 Buf *calls, list bodies, list hashes, list keys, Py_ssize_t *at) except -1:
    """Pass 1 (see above); ``at[0]``: the index of the record in hand."""
    cdef Py_ssize_t i, k
    cdef bint bad, direct = record_type is _mi_type
    cdef int overflow
    cdef long long tok
    cdef double ts
    cdef object rec, calls_v, v
    cdef bytes cb, cc
    cdef _Rec *r
    # the fields read straight from the instance's slots (see _field)
    for k in range(len(_INIT_FIELDS)):
        direct = direct and _mi_at[k] >= 0
    for i in range(len(msgs)):
        at[0] = i
        rec = msgs[i]
        r = &recs[i]
        r.state = _DONE
        if type(rec) is not record_type:
            if not isinstance(rec, record_type):
                raise TypeError(f"msgs[{i}]: expected {record_type.__name__}, got {type(rec).__name__}")
            bodies[i], hashes[i], keys[i] = slow(rec)       # a subclass: the Python path
            continue
        # -- the values this path spells exactly; anything else goes slow
        v = _field(rec, 1, direct)
        tok = 0
        ts = 0.0
        bad = type(v) is not float
        if not bad:
            ts = v
            bad = not (ts == 0.0 or 1e-4 <= abs(ts) < 1e16)
        if not bad:
            v = _field(rec, 6, direct)
            bad = type(v) is not int
            if not bad:
                tok = PyLong_AsLongLongAndOverflow(v, &overflow)
                bad = overflow != 0 or tok < 0
        calls_v = _field(rec, 7, direct)
        if not bad and type(calls_v) is not tuple:
            bad = True
        if not bad:
            # what the constructor's check makes true and a line must hold
            # (a field set past it takes the slow path, which checks it)
            v = _field(rec, 2, direct)
            bad = type(v) is not str or v not in _ROLE_SET
            if not bad:
                v = _field(rec, 0, direct)
                bad = type(v) is not str or not v
            if not bad:
                v = _field(rec, 4, direct)
                bad = type(v) is not str or not v
        # -- the strs, held for pass 2
        k = 0
        while not bad and k < 8:
            v = _field(rec, _STRING_INIT[k], direct)
            if type(v) is not str:
                bad = True
                break
            Py_INCREF(v)
            r.s[k] = <PyObject *>v
            k += 1
        if bad:
            bodies[i], hashes[i], keys[i] = slow(rec)
            continue
        r.ts = ts
        r.tok = tok
        # -- the tool calls: [] or, in their common shape, spelled here (both
        # forms); else calls_json's -- unless a str of the record is not
        # UTF-8, which slow() refuses first (as a record-by-record encoder)
        if len(calls_v):
            calls.n = 0
            if _calls_out(calls, <tuple>calls_v, False):
                bad = True
            else:
                r.calls_n = calls.n
                bad = _calls_out(calls, <tuple>calls_v, True) != 0
            if bad:
                for k in range(8):
                    if not _utf8_str(<object>r.s[k]):
                        break
                else:
                    bad = False
                if bad:
                    bodies[i], hashes[i], keys[i] = slow(rec)
                    continue
                cb, cc = calls_json(rec)
                calls.n = 0
                _put_lit(calls, PyBytes_AS_STRING(cb), PyBytes_GET_SIZE(cb))
                _put_lit(calls, PyBytes_AS_STRING(cc), PyBytes_GET_SIZE(cc))
                r.calls_n = PyBytes_GET_SIZE(cb)
            v = PyBytes_FromStringAndSize(calls.p, calls.n)
            Py_INCREF(v)
            r.calls = <PyObject *>v
        r.state = _C
    at[0] = len(msgs)
    return 0


def encode_messages(list msgs, type record_type, object slow, object calls_json, bint defer_hash=False,
                    object hash_job=None):
    """(bodies, hashes, keys) of the records in ``msgs``: lists of bytes, str
    and bytes, one entry per record. ``defer_hash``: a record this path
    spells gets its canonical JSON (bytes) in ``hashes`` instead of its
    sha256, which :func:`hash_canonical` computes later (the append path
    hashes while the tail's sync runs).

    ``record_type`` is ConversationMessageRecord (a subclass's instances take
    the Python path); anything else in ``msgs`` raises TypeError naming its
    index. ``slow(record) -> (body, hash, key)``
    encodes a record this path does not spell; ``calls_json(record) ->
    (body_json, canonical_json)`` gives the two JSON forms of a non-empty
    ``tool_calls`` that _calls_out does not spell (its common shape is
    written here). Each record's raw JSON values are written once (strings
    escaped, the time as repr() writes it), then both layouts from them; a
    batch of at least ``_parallel_min`` records by two threads (see the
    passes above).

    ``hash_job`` (None, or a bool: whether threaded): ``hashes`` comes back
    as a :class:`HashJob` instead, which has the canonical JSON of every
    record in a buffer of its own (no bytes object a record) and hashes
    them, in a C thread started before this returns if threaded; its
    ``result()`` is the list of hashes."""
    cdef tuple batch = tuple(msgs)      # (the list may change while the GIL is let go)
    cdef Py_ssize_t n = len(batch), i, k
    cdef object version = record_type.SCHEMA_VERSION
    if type(version) is not int:
        raise TypeError(f"encode_messages: {record_type.__name__}.SCHEMA_VERSION must be int")
    cdef bytes verb = str(version).encode("ascii")
    cdef HashJob job = None if hash_job is None else HashJob()
    if job is not None:
        job._take_spare()
    cdef list bodies = [None] * n
    cdef list hashes = [None] * n
    cdef list keys = [None] * n
    cdef Py_ssize_t key_at = _BODY_C[0].n + 1       # {"msg_id":"
    cdef _Rec *recs = <_Rec *>calloc(<size_t>max(n, 1), sizeof(_Rec))
    cdef _Rec *r
    cdef _Part parts[2]
    cdef Py_ssize_t stop = 0, claimed = 0
    cdef Buf calls
    cdef Buf *out
    cdef object err = None
    cdef bint offered
    cdef char *rep
    cdef int e
    if recs == NULL:
        raise MemoryError(f"encode_messages: {n} records")
    memset(parts, 0, sizeof(parts))
    memset(&calls, 0, sizeof(calls))
    try:
        for k in range(2):
            parts[k].recs = recs
            parts[k].next = &claimed
            parts[k].idx = <int>k
            parts[k].verb = PyBytes_AS_STRING(verb)
            parts[k].verb_n = PyBytes_GET_SIZE(verb)
            parts[k].max_bytes = max_record_bytes
            _take(&parts[k].esc, &_kept[2 * k])
            _take(&parts[k].out, &_kept[2 * k + 1])
        # -- pass 1
        try:
            _gather(batch, record_type, slow, calls_json, recs, &calls, bodies, hashes, keys, &stop)
        except BaseException as exc:
            err = exc               # (raised once the records before it, [0, stop), are done)
        # -- pass 2: the caller and, for a large batch, the worker (the GIL
        # kept, as a record at a time keeps it: no other thread runs
        # meanwhile, nor takes it for a switch interval after)
        parts[0].hi = parts[1].hi = stop
        offered = stop >= _parallel_min and _offer(&parts[1])
        _spell_part(&parts[0])
        if offered:
            _take_back(&parts[1])
        if parts[0].failed or parts[1].failed:
            raise MemoryError("encode_messages: scratch buffer")
        # -- pass 3
        for i in range(stop):
            r = &recs[i]
            if r.state == _DTOA:
                rep = PyOS_double_to_string(r.ts, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
                try:
                    e = _spell(&parts[0], r, rep, <Py_ssize_t>strlen(rep))
                finally:
                    PyMem_Free(rep)
                if e < 0:
                    raise MemoryError("encode_messages: scratch buffer")
                r.state = e
            if r.state == _SLOW:
                bodies[i], hashes[i], keys[i] = slow(batch[i])
            elif r.state == _C:
                out = &parts[r.part].out
                bodies[i] = PyBytes_FromStringAndSize(out.p + r.at, r.body_n)
                if job is not None:
                    job._add(i, out.p + r.at + r.body_n, r.canon_n)
                elif defer_hash:
                    hashes[i] = PyBytes_FromStringAndSize(out.p + r.at + r.body_n, r.canon_n)
                else:
                    hashes[i] = _sha256(PyBytes_FromStringAndSize(out.p + r.at + r.body_n,
                                                                  r.canon_n)).hexdigest()
                keys[i] = PyBytes_FromStringAndSize(out.p + r.at + key_at, r.key_n)
    finally:
        for i in range(n):
            for k in range(8):
                Py_XDECREF(recs[i].s[k])
            Py_XDECREF(recs[i].calls)
        free(recs)
        free(calls.p)
        for k in range(2):
            _keep(&parts[k].esc, &_kept[2 * k])
            _keep(&parts[k].out, &_kept[2 * k + 1])
    if err is not None:
        raise err
    if job is not None:
        job._start(hashes, bool(hash_job))
        return bodies, job, keys
    return bodies, hashes, keys


cdef inline void _take(Buf *b, Buf *kept) noexcept:
    b[0] = kept[0]
    kept.p = NULL
    kept.n = kept.cap = 0


cdef inline void _keep(Buf *b, Buf *kept) noexcept:
    """Leave b for the next batch (up to FRAME_KEEP_BYTES), else free it."""
    if kept.p == NULL and b.cap <= FRAME_KEEP_BYTES:
        kept[0] = b[0]
        kept.n = 0
    else:
        free(b.p)
    b.p = NULL


def hash_canonical(list hashes) -> list:
    """Replace, in place, each canonical JSON (bytes) that
    ``encode_messages(..., defer_hash=True)`` left in ``hashes`` by its
    ``payload_hash`` (sha256, hex); the str entries are hashes already.
    Returns the list."""
    return HashJob(hashes, False).result()


# sha256 in C: OpenSSL's one-shot SHA256() from the libcrypto that Python's
# own hashlib loaded (found at import; no link to it at build time), so a
# batch's payload hashes are computed without the GIL and without an object
# a hash. None found (another build of Python): hashlib, with the GIL.
cdef extern from "<dlfcn.h>" nogil:
    void *dlopen(const char *filename, int flags)
    void *dlsym(void *handle, const char *symbol)
    int RTLD_NOW
    int RTLD_NOLOAD

ctypedef unsigned char *(*_sha256_fn)(const unsigned char *d, size_t n, unsigned char *md) noexcept nogil
ctypedef int (*_sha_init_fn)(void *c) noexcept nogil
ctypedef int (*_sha_update_fn)(void *c, const void *d, size_t n) noexcept nogil
ctypedef int (*_sha_final_fn)(unsigned char *md, void *c) noexcept nogil
cdef _sha256_fn _c_sha256 = NULL
cdef _sha256_fn _c_sha256_oneshot = NULL
cdef _sha_init_fn _c_sha_init = NULL
cdef _sha_update_fn _c_sha_update = NULL
cdef _sha_final_fn _c_sha_final = NULL


cdef unsigned char *_sha256_steps(const unsigned char *d, size_t n, unsigned char *md) noexcept nogil:
    """sha256 by OpenSSL's SHA256_Init/Update/Final: its one-shot SHA256()
    looks the algorithm up through the EVP layer at every call (OpenSSL 3),
    ~0.7 us a call: 1.14 ms of the hashes of an append_many of 1,000
    messages of ~700 bytes against ~0.5 ms this way."""
    cdef uint64_t ctx[32]       # (256 bytes: SHA256_CTX is 112)
    _c_sha_init(ctx)
    _c_sha_update(ctx, d, n)
    _c_sha_final(md, ctx)
    return md


cdef bint _sha256_agrees(_sha256_fn f):
    """Whether ``f`` gives hashlib's answer (one block, and many)."""
    cdef unsigned char md[32]
    cdef bytes probe
    for probe in (b"abc", bytes(range(256)) * 5 + b"x"):
        f(<const unsigned char *>PyBytes_AS_STRING(probe), <size_t>len(probe), md)
        if PyBytes_FromStringAndSize(<char *>md, 32) != _sha256(probe).digest():
            return False
    return True


cdef void _find_sha256():
    global _c_sha256, _c_sha256_oneshot, _c_sha_init, _c_sha_update, _c_sha_final
    cdef void *h
    cdef _sha256_fn f
    try:
        import _hashlib     # (loads libcrypto: dlopen below only finds a loaded one)
    except ImportError:
        return
    for name in (b"libcrypto.so.3", b"libcrypto.so.1.1", b"libcrypto.so", b"libcrypto.dylib"):
        h = dlopen(name, RTLD_NOW | RTLD_NOLOAD)
        if h == NULL:
            continue
        # (each trusted only once it gives hashlib's answer; the steps
        # where found, else the one-shot)
        _c_sha_init = <_sha_init_fn>dlsym(h, "SHA256_Init")
        _c_sha_update = <_sha_update_fn>dlsym(h, "SHA256_Update")
        _c_sha_final = <_sha_final_fn>dlsym(h, "SHA256_Final")
        f = <_sha256_fn>dlsym(h, "SHA256")
        if f != NULL and _sha256_agrees(f):
            _c_sha256 = _c_sha256_oneshot = f
        if _c_sha_init != NULL and _c_sha_update != NULL and _c_sha_final != NULL \
                and _sha256_agrees(_sha256_steps):
            _c_sha256 = _sha256_steps
        return


_find_sha256()
cdef _sha256_fn _c_sha256_found = _c_sha256
#: whether payload hashes are computed in C without the GIL (else by hashlib)
compiled_sha256 = _c_sha256 != NULL


def _use_compiled_sha256(bint on, bint steps=True) -> bool:
    """(tests) Use the compiled sha256 if found (``on``) or hashlib; with
    ``steps`` false, OpenSSL's one-shot SHA256() (if found) instead of its
    SHA256_Init/Update/Final. Returns whether a compiled one is in use now."""
    global _c_sha256
    _c_sha256 = NULL if not on else _c_sha256_found if steps else _c_sha256_oneshot
    return _c_sha256 != NULL


cdef struct _HashWork:
    Py_ssize_t n
    const unsigned char *base  # the canonical JSONs, one after another
    Py_ssize_t *off            # entry k is base[off[k]:off[k + 1]]
    unsigned char *md          # 32 bytes a hash


cdef void *_hash_run(void *arg) noexcept nogil:
    cdef _HashWork *w = <_HashWork *>arg
    cdef Py_ssize_t i
    for i in range(w.n):
        _c_sha256(w.base + w.off[i], <size_t>(w.off[i + 1] - w.off[i]), w.md + 32 * i)
    return NULL


# A FrameBuffer keeps at most this much room between batches (a larger
# batch's lines go into a bytes object of their own, freed after it); so
# does the spare buffer of the HashJobs (see HashJob.__dealloc__).
cdef Py_ssize_t FRAME_KEEP_BYTES = 16 << 20

# the buffer a finished HashJob left for the next (the GIL guards it)
cdef char *_spare_p = NULL
cdef Py_ssize_t _spare_cap = 0


cdef class HashJob:
    """The payload hashes of a batch: the sha256 of canonical JSONs, put
    in place in a list of hashes. Made from a list (``HashJob(hashes)``:
    each bytes entry is a canonical JSON that ``encode_messages(...,
    defer_hash=True)`` left there) or by :func:`encode_messages` itself
    (``hash_job``: it writes the canonical JSONs into the job's buffer, no
    object a record). ``threaded``: computed in a C thread of its own,
    started at once, while the caller goes on (append_many: its check of
    the ids, the tail write, the indexing); else when :meth:`result` is
    called, in C without the GIL (or by hashlib where no libcrypto was
    found). :meth:`result` puts each hash (hex str) in its entry's place
    and returns the list. The job owns the bytes it hashes; the thread is
    joined, whatever happens, before the job goes away."""
    cdef list _hashes
    cdef Buf _buf
    cdef Py_ssize_t *_at       # entry k's index in _hashes
    cdef Py_ssize_t *_inv      # the entry of each index of _hashes, -1 if none (see _digests)
    cdef Py_ssize_t _cap
    cdef _HashWork _w
    cdef pthread_t _th
    cdef bint _running, _done, _given

    def __cinit__(self, list hashes=None, bint threaded=True):
        cdef Py_ssize_t i
        cdef object v
        self._running = self._done = self._given = False
        if hashes is None:
            return
        for i in range(len(hashes)):
            v = hashes[i]
            if type(v) is bytes:
                self._add(i, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))
        self._start(hashes, threaded)

    cdef int _add(self, Py_ssize_t i, const char *p, Py_ssize_t n) except -1:
        """Entry ``i`` of the list is to be the hash of p[0:n)."""
        cdef Py_ssize_t cap
        cdef void *q
        if self._w.n + 1 >= self._cap:
            cap = max(2 * self._cap, 64)
            q = realloc(self._at, cap * sizeof(Py_ssize_t))
            if q == NULL:
                raise MemoryError("HashJob: entries")
            self._at = <Py_ssize_t *>q
            q = realloc(self._w.off, (cap + 1) * sizeof(Py_ssize_t))
            if q == NULL:
                raise MemoryError("HashJob: entries")
            self._w.off = <Py_ssize_t *>q
            self._cap = cap
        _reserve(&self._buf, n)
        self._w.off[self._w.n] = self._buf.n
        _put(&self._buf, p, n)
        self._at[self._w.n] = i
        self._w.n += 1
        return 0

    cdef int _start(self, list hashes, bint threaded) except -1:
        """The entries are in: hash them into ``hashes`` (see the class)."""
        self._hashes = hashes
        if self._w.n == 0:
            return 0
        self._w.off[self._w.n] = self._buf.n
        self._w.base = <const unsigned char *>self._buf.p
        self._w.md = <unsigned char *>malloc(self._w.n * 32)
        if self._w.md == NULL:
            raise MemoryError(f"HashJob: {self._w.n} hashes")
        if threaded and _c_sha256 != NULL:
            self._running = pthread_create(&self._th, NULL, _hash_run, &self._w) == 0
            # (no thread to be had: result() hashes in the caller's thread)
        return 0

    cdef void _join(self) noexcept:
        if self._running:
            with nogil:
                pthread_join(self._th, NULL)
            self._running = False
            self._done = True

    cdef bint _digests(self) except -1:
        """Every entry's sha256 computed in C (the thread joined, or the
        hashes computed here without the GIL) and the inverse of ``_at``
        made, for :func:`message_envelopes` to write each hash's hex straight
        from its digest (no str a message); False where the job cannot (no
        compiled sha256, or :meth:`result` already gave the list): the
        caller takes :meth:`result`'s list then."""
        cdef Py_ssize_t k, n
        if self._given or self._hashes is None:
            return False
        if self._inv != NULL:
            return True
        self._join()
        if not self._done and self._w.n:
            if _c_sha256 == NULL:
                return False
            with nogil:
                _hash_run(&self._w)
            self._done = True
        n = len(self._hashes)
        self._inv = <Py_ssize_t *>malloc(<size_t>(n + 1) * sizeof(Py_ssize_t))
        if self._inv == NULL:
            raise MemoryError(f"HashJob: {n} entries")
        for k in range(n):
            self._inv[k] = -1
        for k in range(self._w.n):
            self._inv[self._at[k]] = k
        return True

    def result(self) -> list:
        """The list, each entry's hash (hex str) in its place; a second
        call returns it as it is."""
        cdef Py_ssize_t k, j
        cdef str h
        cdef char *o
        cdef const unsigned char *md
        if self._given or self._hashes is None:
            return self._hashes
        self._join()
        if not self._done and self._w.n:
            if _c_sha256 != NULL:
                with nogil:
                    _hash_run(&self._w)
                self._done = True
            else:
                for k in range(self._w.n):
                    self._hashes[self._at[k]] = _sha256(PyBytes_FromStringAndSize(
                        self._buf.p + self._w.off[k], self._w.off[k + 1] - self._w.off[k])).hexdigest()
                self._given = True
                return self._hashes
        for k in range(self._w.n):
            h = PyUnicode_New(64, 127)
            o = <char *>PyUnicode_DATA(h)
            md = self._w.md + 32 * k
            for j in range(32):
                o[2 * j] = _HEX[md[j] >> 4]
                o[2 * j + 1] = _HEX[md[j] & 15]
            self._hashes[self._at[k]] = h
        self._given = True
        return self._hashes

    cdef void _take_spare(self) noexcept:
        """Start with the buffer the last job left (see __dealloc__)."""
        global _spare_p, _spare_cap
        if _spare_p != NULL and self._buf.p == NULL:
            self._buf.p = _spare_p
            self._buf.cap = _spare_cap
            _spare_p = NULL
            _spare_cap = 0

    def __dealloc__(self):
        global _spare_p, _spare_cap
        self._join()
        free(self._at)
        free(self._inv)
        free(self._w.off)
        free(self._w.md)
        # the canonical JSONs' buffer is kept for the next job (up to
        # FRAME_KEEP_BYTES, one buffer): grown anew each batch it came from
        # fresh pages, ~180 page faults and ~0.4 ms of a batch of 1,000
        if _spare_p == NULL and 0 < self._buf.cap <= FRAME_KEEP_BYTES:
            _spare_p = self._buf.p
            _spare_cap = self._buf.cap
        else:
            free(self._buf.p)


cdef const char *_HEX = b"0123456789abcdef"


def _float_repr(double v):
    """(tests) ``repr(v)`` as rf_float_repr writes it, or None where it
    leaves ``v`` to dtoa."""
    cdef char out[48]
    cdef int n = rf_float_repr(v, out)
    return None if n < 0 else out[:n].decode("ascii")


#: Set by rune_fast.codec to its MAX_RECORD_BYTES (one constant, one place).
max_record_bytes = 8 * 1024 * 1024


cdef inline Py_ssize_t _cat(unsigned char *dst, Py_ssize_t at, const char *src, Py_ssize_t n) noexcept:
    memcpy(dst + at, src, <size_t>n)
    return at + n


cdef inline Py_ssize_t _frame_rest(unsigned char *line, Py_ssize_t rl) noexcept:
    """Frame the rest of rl bytes written at line + RF_PREFIX_LEN: the prefix
    before it, the newline after; returns the line's length."""
    rf_write_prefix(line + RF_PREFIX_LEN, <size_t>rl, line)
    line[RF_PREFIX_LEN + rl] = b'\n'
    return RF_PREFIX_LEN + rl + 1


cdef int _digits(int64_t v, char *out) noexcept nogil:
    """The decimal digits of ``v`` >= 0 at ``out`` (room for 20, no
    terminator); returns how many (what ``%lld`` writes, without printf's
    format parsing: twice a message line)."""
    cdef char tmp[24]
    cdef int n = 0, i
    cdef uint64_t u = <uint64_t>v
    while True:
        tmp[n] = <char>(48 + <int>(u % 10))
        n += 1
        u = u // 10
        if u == 0:
            break
    for i in range(n):
        out[i] = tmp[n - 1 - i]
    return n




cdef class FrameBuffer:
    """Room for a batch's framed tail lines that the next batch reuses
    (:func:`frame_messages`'s ``into``; the append path keeps one a
    repository, used under its lock). A new bytes object of 800 KB a batch
    of 1,000 messages came from fresh pages each time: about 195 page
    faults, ~0.45 ms of the batch before its write (measured at 100,000
    messages). Exposes the lines (read-only, ``len()`` bytes) through the
    buffer protocol, as bytes would, for the tail's pwrite; it is not
    refilled while such a view is held (``frame_messages`` then makes
    bytes)."""
    cdef char *p
    cdef Py_ssize_t cap
    cdef Py_ssize_t n
    cdef int views

    def __len__(self):
        return self.n

    def __getbuffer__(self, Py_buffer *buf, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("FrameBuffer: read-only")
        buf.buf = self.p
        buf.obj = self
        buf.len = self.n
        buf.readonly = 1
        buf.itemsize = 1
        buf.format = NULL
        buf.ndim = 1
        buf.shape = NULL
        buf.strides = NULL
        buf.suboffsets = NULL
        buf.internal = NULL
        self.views += 1

    def __releasebuffer__(self, Py_buffer *buf):
        self.views -= 1

    def __bytes__(self):
        return PyBytes_FromStringAndSize(self.p, self.n)

    cdef char *_room(self, Py_ssize_t total) except? NULL:
        """self.p with room for ``total`` bytes (kept from the last batch
        when it is enough); NULL where this batch goes elsewhere (a view
        is held, or it is past FRAME_KEEP_BYTES)."""
        cdef void *q
        if self.views or total > FRAME_KEEP_BYTES:
            return NULL
        if total > self.cap:
            q = realloc(self.p, <size_t>max(total, 4096))
            if q == NULL:
                raise MemoryError(f"FrameBuffer: {total} bytes")
            self.p = <char *>q
            self.cap = max(total, 4096)
        self.n = 0
        return self.p if self.p != NULL else NULL

    def __dealloc__(self):
        free(self.p)


def frame_messages(list bodies, list order, int64_t seq0, FrameBuffer into=None):
    """``(data, lengths)``: the framed tail lines of ``bodies[order[j]]`` with
    append sequence ``seq0 + j`` (``data`` their concatenation, ``lengths``
    each line's length with its newline). Each line is
    ``{"x":"<xxh3>",``"k":"m","r":<body>,"s":<seq>}`` + newline. ``into``:
    the lines go into that FrameBuffer, which is ``data`` then (its bytes
    valid until the next call with it), unless it cannot take them now
    (see FrameBuffer): ``data`` is bytes then."""
    cdef Py_ssize_t m = len(order), j, total = 0, bl, rl, pos = 0
    cdef bytes body
    cdef object out
    cdef char digits[24]
    cdef int nd
    cdef char *o = NULL
    cdef unsigned char *rest
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(_MSG_PREFIX)
    cdef list lengths = [0] * m
    if seq0 < 0:
        raise FramingError(f"frame_messages: negative sequence {seq0}")
    for j in range(m):
        body = bodies[order[j]]
        bl = PyBytes_GET_SIZE(body)
        nd = _digits(seq0 + j, digits)
        rl = plen + bl + 5 + nd + 1
        if <size_t>(RF_PREFIX_LEN + rl + 1) > RF_MAX_LINE:
            raise FramingError(f"frame_messages: the line of bodies[{order[j]}] would be "
                               f"{RF_PREFIX_LEN + rl + 1} bytes, over MAX_LINE ({RF_MAX_LINE})")
        lengths[j] = RF_PREFIX_LEN + rl + 1
        total += RF_PREFIX_LEN + rl + 1
    if into is not None:
        o = into._room(total)
    if o != NULL:
        out = into
    else:
        out = PyBytes_FromStringAndSize(NULL, total)
        o = PyBytes_AS_STRING(out)
    for j in range(m):
        body = bodies[order[j]]
        bl = PyBytes_GET_SIZE(body)
        nd = _digits(seq0 + j, digits)
        rest = <unsigned char *>o + pos + RF_PREFIX_LEN
        rl = _cat(rest, 0, PyBytes_AS_STRING(_MSG_PREFIX), plen)
        rl = _cat(rest, rl, PyBytes_AS_STRING(body), bl)
        rl = _cat(rest, rl, b',"s":', 5)
        rl = _cat(rest, rl, digits, nd)
        rl = _cat(rest, rl, b"}", 1)
        pos += _frame_rest(<unsigned char *>o + pos, rl)
    if out is into:
        into.n = total
    return out, lengths


def message_envelopes(list keys, object hashes, list order, bytes ts_json):
    """The framed event-store envelopes of the messages ``order`` indexes:
    ``{"type":"conversation.message","id":<key>,"payload_hash":<hash>,"ts":<ts_json>}``
    each (``frame_object`` of that dict), concatenated. ``hashes``: the list
    of hashes (hex str), or the :class:`HashJob` of ``encode_messages(...,
    hash_job=...)``, whose digests are written as hex in place (joined or
    computed first; no str or bytes object a message)."""
    cdef Py_ssize_t m = len(order), j, i, k, total = 0, pos = 0, rl, d
    cdef bytes key, h, out
    cdef list hb = [None] * m
    cdef list hl_ = None
    cdef HashJob job = None
    cdef Py_ssize_t hl = PyBytes_GET_SIZE(_ENV_HEAD), tl = PyBytes_GET_SIZE(ts_json)
    cdef Py_ssize_t ml = PyBytes_GET_SIZE(_ENV_HASH), sl = PyBytes_GET_SIZE(_ENV_TS)
    cdef char *o
    cdef unsigned char *rest
    cdef const unsigned char *md
    if type(hashes) is HashJob:
        job = <HashJob>hashes
        if not job._digests():
            hashes = job.result()
            job = None
    if job is None:
        hl_ = <list?>hashes
    else:
        hl_ = job._hashes
    for j in range(m):
        i = order[j]
        key = keys[i]
        if job is not None and job._inv[i] >= 0:
            d = 64
        else:
            h = (<str>hl_[i]).encode("ascii")
            hb[j] = h
            d = PyBytes_GET_SIZE(h)
        total += RF_PREFIX_LEN + hl + PyBytes_GET_SIZE(key) + ml + d + sl + tl + 2
    out = PyBytes_FromStringAndSize(NULL, total)
    o = PyBytes_AS_STRING(out)
    for j in range(m):
        i = order[j]
        key = keys[i]
        rest = <unsigned char *>o + pos + RF_PREFIX_LEN
        rl = _cat(rest, 0, PyBytes_AS_STRING(_ENV_HEAD), hl)
        rl = _cat(rest, rl, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
        rl = _cat(rest, rl, PyBytes_AS_STRING(_ENV_HASH), ml)
        if hb[j] is None:
            md = job._w.md + 32 * job._inv[i]
            for k in range(32):
                rest[rl + 2 * k] = _HEX[md[k] >> 4]
                rest[rl + 2 * k + 1] = _HEX[md[k] & 15]
            rl += 64
        else:
            h = hb[j]
            rl = _cat(rest, rl, PyBytes_AS_STRING(h), PyBytes_GET_SIZE(h))
        rl = _cat(rest, rl, PyBytes_AS_STRING(_ENV_TS), sl)
        rl = _cat(rest, rl, PyBytes_AS_STRING(ts_json), tl)
        rl = _cat(rest, rl, b"}", 1)
        pos += _frame_rest(<unsigned char *>o + pos, rl)
    if pos != total:
        raise FramingError(f"message_envelopes: wrote {pos} of {total} bytes")
    return out


# --------------------------------------------------------------------------
# Cooling: hot lines to the columns of a cool file

cdef extern from "Python.h":
    double PyOS_string_to_double(const char *s, char **endptr, object overflow_exception) except? -1.0

cimport _xxh

# The string columns cool_columns fills, in COOL_SCHEMA order (rune_fast.cool).
cdef enum:
    C_MSG_ID, C_CHANNEL, C_TASK, C_HLC, C_CONTENT, C_ROLE, C_TOOL_CALLS, C_TOOL_CALL_ID,
    C_ORIGIN, C_EXTRA, C_DIGEST, N_SCOL

cdef tuple _SCOL_NAMES = ("msg_id", "channel_id", "task_id", "hlc", "content", "role",
                          "tool_calls", "tool_call_id", "origin", "extra", "digest")

# which string column each raw string field fills
cdef int _RAW_TO_COL[N_RAW]
_RAW_TO_COL[:] = [C_MSG_ID, C_CHANNEL, C_TASK, C_HLC, C_CONTENT, -1, C_ROLE, -1, -1,
                  C_TOOL_CALL_ID, C_ORIGIN, -1]


cdef inline bint _hexlow(unsigned char c) noexcept nogil:
    return (c'0' <= c <= c'9') or (c'a' <= c <= c'f')


cdef inline int _hexval(unsigned char c) noexcept nogil:
    return c - c'0' if c <= c'9' else c - c'a' + 10


cdef Py_ssize_t _canon_string_end(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """p[i] opens a JSON string; the index after its closing quote, or -1 if
    it is not spelled as the encoder spells it (a raw control byte, an escape
    it does not write, the end of the line first)."""
    cdef unsigned char c
    cdef int v
    if i >= n or p[i] != c'"':
        return -1
    i += 1
    while i < n:
        i += <Py_ssize_t>rf_json_plain_run(p + i, <size_t>(n - i))
        if i >= n:
            break
        c = p[i]
        if c == c'"':
            return i + 1
        if c < 0x20:
            return -1
        if c == c'\\':
            if i + 1 >= n:
                return -1
            c = p[i + 1]
            if c == c'"' or c == c'\\' or c == c'b' or c == c'f' or c == c'n' or c == c'r' or c == c't':
                i += 2
                continue
            if c != c'u' or i + 5 >= n or p[i + 2] != c'0' or p[i + 3] != c'0' \
                    or not _hexlow(p[i + 4]) or not _hexlow(p[i + 5]):
                return -1
            v = _hexval(p[i + 4]) * 16 + _hexval(p[i + 5])
            if v >= 0x20 or v == 8 or v == 9 or v == 10 or v == 12 or v == 13:
                return -1
            i += 6
            continue
        i += 1
    return -1


cdef Py_ssize_t _json_value_end(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """p[i] opens a JSON array or object; the index after its close, or -1
    (brackets are counted outside strings; the caller parses the value).
    Also -1 for a run of 19 digits anywhere in it: a number that may not fit
    64 bits, which orjson would read as a float."""
    cdef Py_ssize_t depth = 0, digits = 0
    cdef unsigned char c
    while i < n:
        c = p[i]
        if c'0' <= c <= c'9':
            digits += 1
            if digits >= 19:
                return -1
            i += 1
            continue
        digits = 0
        if c == c'"':
            i += 1
            while i < n and p[i] != c'"':
                if c'0' <= p[i] <= c'9':
                    digits += 1
                    if digits >= 19:
                        return -1
                else:
                    digits = 0
                i += 2 if p[i] == c'\\' else 1
            digits = 0
            if i >= n:
                return -1
        elif c == c'[' or c == c'{':
            depth += 1
        elif c == c']' or c == c'}':
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0:
            return -1
        i += 1
    return -1


cdef void _unescape(Buf *b, const unsigned char *s, Py_ssize_t n) noexcept nogil:
    """Append the value of the canonical string body s[0:n) (room reserved)."""
    cdef Py_ssize_t i = 0
    cdef unsigned char c
    cdef char *o = b.p + b.n
    cdef const unsigned char *q
    while i < n:
        q = <const unsigned char *>memchr(s + i, c'\\', <size_t>(n - i))
        if q == NULL:
            memcpy(o, s + i, <size_t>(n - i))
            o += n - i
            break
        memcpy(o, s + i, <size_t>(q - (s + i)))
        o += q - (s + i)
        i = q - s
        c = s[i + 1]
        if c == c'u':
            o[0] = <char>(_hexval(s[i + 4]) * 16 + _hexval(s[i + 5]))
            i += 6
        else:
            if c == c'b':
                o[0] = c'\b'
            elif c == c'f':
                o[0] = c'\f'
            elif c == c'n':
                o[0] = c'\n'
            elif c == c'r':
                o[0] = c'\r'
            elif c == c't':
                o[0] = c'\t'
            else:
                o[0] = <char>c
            i += 2
        o += 1
    b.n = o - b.p


cdef Py_ssize_t _int_end(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, int max_digits,
                         int64_t *out) noexcept nogil:
    """A non-negative integer as json writes it (no sign, no leading zero)
    at p[i]; the index after it, or -1."""
    cdef Py_ssize_t j = i
    cdef int64_t v = 0
    while j < n and c'0' <= p[j] <= c'9':
        v = v * 10 + (p[j] - c'0')
        j += 1
    if j == i or j - i > max_digits or (p[i] == c'0' and j - i > 1):
        return -1
    out[0] = v
    return j


# 10**k, k <= 22: each exact in a double
cdef double _POW10[23]
_POW10[:] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
             1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22]


cdef bint _float_fast(const unsigned char *p, Py_ssize_t i, Py_ssize_t j, Py_ssize_t dot,
                      double *out) noexcept nogil:
    """The value of the float text p[i:j) (``-?digits.digits``, its dot at
    ``dot``) without strtod, where exact double arithmetic gives it; False:
    the caller asks strtod. The text is M / 10**k with M < 2**53 and
    k <= 22, both exact doubles, so their quotient, correctly rounded, is
    what strtod reads (Clinger's fast path; a time of the epoch with
    microseconds is one)."""
    cdef Py_ssize_t q, k = j - dot - 1
    cdef uint64_t m = 0
    cdef int sig = 0
    cdef bint neg = p[i] == c'-'
    if k > 22:
        return False
    for q in range(i + 1 if neg else i, j):
        if q == dot:
            continue
        if sig or p[q] != c'0':
            sig += 1
            if sig > 16:
                return False
        m = m * 10 + (p[q] - c'0')
    if m >= (<uint64_t>1 << 53):
        return False
    out[0] = <double>m / _POW10[k]
    if neg:
        out[0] = -out[0]
    return True


cdef Py_ssize_t _float_end(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, double *out,
                           bint exact) except -2 nogil:
    """A float spelled as repr() spells it inside the range where orjson and
    json agree (no exponent); the index after it, or -1."""
    cdef Py_ssize_t j = i
    cdef char tmp[40]
    cdef char *end = NULL
    cdef char *rep = NULL
    cdef double x
    cdef bint same
    cdef Py_ssize_t dot = -1
    cdef char fast[48]
    cdef int k
    # -?digits.digits: what repr writes for a float in that range
    if j < n and p[j] == c'-':
        j += 1
    while j < n and (c'0' <= p[j] <= c'9' or (p[j] == c'.' and dot < 0)):
        if p[j] == c'.':
            dot = j
        j += 1
    if dot < 0 or dot == i or (p[i] == c'-' and dot == i + 1) or dot == j - 1 or j - i >= 40:
        return -1
    memcpy(tmp, p + i, <size_t>(j - i))
    tmp[j - i] = 0
    if not _float_fast(p, i, j, dot, &x):
        with gil:
            x = PyOS_string_to_double(tmp, &end, None)
        if end != tmp + (j - i):
            return -1
    if not (x == 0.0 or 1e-4 <= abs(x) < 1e16):
        return -1
    if not exact:
        out[0] = x
        return j
    # (repr(x) from rf_float_repr where it decides it, else from dtoa)
    k = rf_float_repr(x, fast)
    if k >= 0:
        if k != j - i or memcmp(fast, tmp, <size_t>k) != 0:
            return -1
        out[0] = x
        return j
    with gil:
        rep = PyOS_double_to_string(x, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
        try:
            same = strlen(rep) == <size_t>(j - i) and memcmp(rep, tmp, <size_t>(j - i)) == 0
        finally:
            PyMem_Free(rep)
    if not same:
        return -1
    out[0] = x
    return j


cdef inline bint _lit_at(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, const char *lit,
                         Py_ssize_t m) noexcept nogil:
    return i + m <= n and memcmp(p + i, lit, <size_t>m) == 0


# the key literals of a message line (_RECORD_KEYS) and their kinds, as C
# arrays: a line is parsed without the GIL (cool_columns)
cdef const char *_MSG_PREFIX_C = PyBytes_AS_STRING(_MSG_PREFIX)
cdef Py_ssize_t _MSG_PREFIX_N = PyBytes_GET_SIZE(_MSG_PREFIX)
cdef int _KIND_C[N_RAW]
for _k in range(N_RAW):
    assert _BODY_C[_k].f == _k and _BODY_C[_k].lit == <const char *>PyBytes_AS_STRING(_RECORD_KEYS[_k][0])
    _KIND_C[_k] = _RECORD_KEYS[_k][1]
del _k


cdef struct _Cols:
    Buf data[N_SCOL]
    Buf offs[N_SCOL]
    Buf ts, tok, ver, ords, canon
    Buf calls       # the canonical tool-call JSON of a block's lines (_sorted_value)
    Buf members     # _sorted_value's stack of object members


cdef class _ColumnBufs:
    cdef _Cols c

    def __dealloc__(self):
        cdef int k
        for k in range(N_SCOL):
            free(self.c.data[k].p)
            free(self.c.offs[k].p)
        free(self.c.ts.p)
        free(self.c.tok.p)
        free(self.c.ver.p)
        free(self.c.ords.p)
        free(self.c.canon.p)
        free(self.c.calls.p)
        free(self.c.members.p)


cdef int _push_offset(Buf *offs, Py_ssize_t v) except -1 nogil:
    cdef int32_t x
    if v > 0x7FFFFFFF:
        with gil:
            raise OverflowError("cool_columns: a column passed 2 GiB")
    x = <int32_t>v
    _reserve(offs, 4)
    _put(offs, <const char *>&x, 4)
    return 0


cdef struct _Line:
    Py_ssize_t rs[N_RAW]        # start of each field's raw JSON value in the line
    Py_ssize_t rl[N_RAW]        # its length (strings with their quotes)
    double ts
    int64_t tok, ver, seq
    bint calls                  # a non-empty tool-call list (raw value at rs/rl[R_TOOL_CALLS])


cdef bint _parse_line(const unsigned char *p, Py_ssize_t n, _Line *r, bint exact_ts) except -1 nogil:
    """Whether the verified line p[0:n) is a message line spelled as the
    encoder spells it: the record's twelve keys in to_dict() order, strings
    escaped as json escapes them, non-negative integers, a float without an
    exponent (with ``exact_ts``: exactly as repr() writes it), the tool-call
    list either empty or a JSON value without a run of 19 digits, then the
    append sequence. Fills ``r``."""
    cdef Py_ssize_t prefix = RF_PREFIX_LEN + _MSG_PREFIX_N, i, e
    cdef int k, kind
    if n <= prefix or memcmp(p + RF_PREFIX_LEN, _MSG_PREFIX_C, <size_t>_MSG_PREFIX_N) != 0:
        return False
    i = prefix
    r.calls = False
    for k in range(N_RAW):
        kind = _KIND_C[k]
        if not _lit_at(p, i, n, _BODY_C[k].lit, _BODY_C[k].n):
            return False
        i += _BODY_C[k].n
        r.rs[k] = i
        if kind == S:
            e = _canon_string_end(p, i, n)
        elif kind == F:
            e = _float_end(p, i, n, &r.ts, exact_ts)
        elif kind == L:
            if _lit_at(p, i, n, b'[]', 2):
                e = i + 2
            else:
                e = _json_value_end(p, i, n)
                r.calls = True
        elif k == R_TOKEN:
            e = _int_end(p, i, n, 18, &r.tok)
        else:
            e = _int_end(p, i, n, 9, &r.ver)
        if e < 0:
            return False
        r.rl[k] = e - i
        i = e
    if not _lit_at(p, i, n, b'},"s":', 6):
        return False
    e = _int_end(p, i + 6, n, 18, &r.seq)
    return e >= 0 and e + 1 == n and p[e] == c'}' and r.ver <= 0x7FFFFFFF


# ---- tool calls: their canonical JSON (sorted keys) without orjson
#
# cooling needs, of a line's raw tool-call list, the column text and the
# canonical JSON that orjson writes of what it reads from it
# (tables._calls_texts: ``orjson.dumps(v)`` and ``orjson.dumps(v,
# option=OPT_SORT_KEYS)``). For a list spelled as orjson spells what it reads
# -- no space, strings escaped as json escapes them, integers, true, false,
# null, no key twice -- the first is the raw text itself and the second the
# same tokens with each object's members in key order: written here from
# the line, without a str, dict or list made (a round trip through orjson
# was ~3 us a line with tool calls). Anything else (a float, -0, an escaped
# key, ...) is left to _calls_texts.

cdef struct _Member:
    Py_ssize_t k                # the member's key token (its opening quote)
    Py_ssize_t kn               # the key's body length (between its quotes)
    Py_ssize_t v                # its value's first byte
    const unsigned char *base   # (the line, for the comparison)

# nesting _sorted_value takes (deeper: _calls_texts judges it)
cdef enum:
    _SORT_DEPTH = 64


cdef int _member_cmp(const void *a, const void *b) noexcept nogil:
    """Key order: code point order is the UTF-8 bytes' order (as orjson and
    Python compare keys); a key before every longer key it starts."""
    cdef const _Member *x = <const _Member *>a
    cdef const _Member *y = <const _Member *>b
    cdef Py_ssize_t n = x.kn if x.kn < y.kn else y.kn
    cdef int c = memcmp(x.base + x.k + 1, y.base + y.k + 1, <size_t>n) if n else 0
    if c:
        return c
    return (x.kn > y.kn) - (x.kn < y.kn)


cdef bint _utf8_ok(const unsigned char *s, Py_ssize_t n) noexcept nogil:
    """Whether s[0:n) is UTF-8 as orjson reads it: no overlong form, no
    surrogate, nothing past U+10FFFF."""
    cdef Py_ssize_t i = 0, j, k
    cdef unsigned char c, lo, hi
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        lo, hi = 0x80, 0xBF
        if 0xC2 <= c <= 0xDF:
            k = 1
        elif 0xE0 <= c <= 0xEF:
            k = 2
            if c == 0xE0:
                lo = 0xA0
            elif c == 0xED:
                hi = 0x9F
        elif 0xF0 <= c <= 0xF4:
            k = 3
            if c == 0xF0:
                lo = 0x90
            elif c == 0xF4:
                hi = 0x8F
        else:
            return False
        if i + k >= n or not (lo <= s[i + 1] <= hi):
            return False
        j = 2
        while j <= k:
            if not (0x80 <= s[i + j] <= 0xBF):
                return False
            j += 1
        i += k + 1
    return True


cdef inline Py_ssize_t _utf8_string_end(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """_canon_string_end, and -1 also for a string that is not UTF-8."""
    cdef Py_ssize_t e = _canon_string_end(p, i, n), j
    if e < 0:
        return -1
    for j in range(i + 1, e - 1):
        if p[j] >= 0x80:
            return e if _utf8_ok(p + j, e - 1 - j) else -1
    return e


cdef inline int _emit(Buf *out, const char *s, Py_ssize_t n) except -1 nogil:
    if out != NULL:
        _reserve(out, n)
        _put(out, s, n)
    return 0


cdef Py_ssize_t _sorted_value(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, Buf *out,
                              Buf *mem, int depth) except -2 nogil:
    """p[i:n) starts with a JSON value: write to ``out`` (NULL: none) what
    orjson writes, keys sorted, of what it reads from it, and return the
    index after the value; -1 if the value is not spelled as orjson
    spells what it reads (see above; then nothing is vouched for and
    ``out`` holds a partial write). ``mem``: the members of the objects
    being read, a stack (the objects nest)."""
    cdef Py_ssize_t j, e, v, cnt, base, m
    cdef unsigned char c
    cdef _Member *ms
    if i >= n:
        return -1
    c = p[i]
    if c == c'"':
        e = _utf8_string_end(p, i, n)
        if e >= 0:
            _emit(out, <const char *>p + i, e - i)
        return e
    if c == c'-' or c'0' <= c <= c'9':
        j = i + 1 if c == c'-' else i
        if j >= n or not (c'0' <= p[j] <= c'9'):
            return -1
        e = j + 1
        if p[j] == c'0':
            if c == c'-':
                return -1           # -0: orjson reads the int 0
        else:
            while e < n and c'0' <= p[e] <= c'9':
                e += 1
        if e < n and (p[e] == c'.' or p[e] == c'e' or p[e] == c'E' or c'0' <= p[e] <= c'9'):
            return -1               # a float (orjson spells floats its own way), a leading zero
        if e - j > 18:
            return -1               # (past what int64 surely holds)
        _emit(out, <const char *>p + i, e - i)
        return e
    if c == c't' and _lit_at(p, i, n, b"true", 4):
        _emit(out, <const char *>p + i, 4)
        return i + 4
    if c == c'f' and _lit_at(p, i, n, b"false", 5):
        _emit(out, <const char *>p + i, 5)
        return i + 5
    if c == c'n' and _lit_at(p, i, n, b"null", 4):
        _emit(out, <const char *>p + i, 4)
        return i + 4
    if depth >= _SORT_DEPTH or (c != c'[' and c != c'{'):
        return -1
    if i + 1 < n and (p[i + 1] == c']' if c == c'[' else p[i + 1] == c'}'):
        _emit(out, <const char *>p + i, 2)
        return i + 2
    if c == c'[':
        _emit(out, <const char *>p + i, 1)
        j = i + 1
        while True:
            e = _sorted_value(p, j, n, out, mem, depth + 1)
            if e < 0 or e >= n:
                return -1 if e >= n else e
            if p[e] == c']':
                _emit(out, <const char *>p + e, 1)
                return e + 1
            if p[e] != c',':
                return -1
            _emit(out, <const char *>p + e, 1)
            j = e + 1
    # an object: its members read (and checked) first, then written in key order
    base = mem.n // <Py_ssize_t>sizeof(_Member)
    cnt = 0
    j = i + 1
    e = -1
    while True:
        v = _utf8_string_end(p, j, n)
        if v < 0 or v >= n or p[v] != c':' or memchr(p + j + 1, c'\\', <size_t>(v - j - 2)) != NULL:
            e = -1                  # (an escaped key: its order is not its bytes')
            break
        v += 1
        _reserve(mem, <Py_ssize_t>sizeof(_Member))
        ms = <_Member *>mem.p + base + cnt
        ms.k = j
        ms.kn = v - j - 3
        ms.v = v
        ms.base = p
        mem.n += <Py_ssize_t>sizeof(_Member)
        cnt += 1
        e = _sorted_value(p, v, n, NULL, mem, depth + 1)
        if e < 0 or e >= n:
            e = -1
            break
        if p[e] == c'}':
            e += 1
            break
        if p[e] != c',':
            e = -1
            break
        j = e + 1
    if e >= 0:
        ms = <_Member *>mem.p + base
        if cnt > 1:
            qsort(ms, <size_t>cnt, sizeof(_Member), _member_cmp)
            for m in range(1, cnt):
                if _member_cmp(&ms[m - 1], &ms[m]) == 0:
                    e = -1          # a key twice: orjson keeps the last value
                    break
    if e >= 0 and out != NULL:
        _emit(out, b"{", 1)
        for m in range(cnt):
            ms = <_Member *>mem.p + base + m     # (mem may move as the values nest)
            if m:
                _emit(out, b",", 1)
            _emit(out, <const char *>p + ms.k, ms.v - ms.k)
            if _sorted_value(p, ms.v, n, out, mem, depth + 1) < 0:
                e = -1
                break
        else:
            _emit(out, b"}", 1)
    mem.n = base * <Py_ssize_t>sizeof(_Member)
    return e


def canonical_calls(raw):
    """``(column text, canonical JSON)`` of a raw tool-call list as
    :func:`cool_columns` makes them without the caller (``raw`` itself, and
    its tokens with each object's keys in order), or None where it leaves
    them to the caller's ``calls_texts``. For tests: equal to
    ``rune_fast.cool.tables._calls_texts`` wherever it is not None."""
    cdef Buf out
    cdef Buf mem
    cdef const unsigned char *p = raw
    cdef Py_ssize_t n = len(raw), e
    memset(&out, 0, sizeof(Buf))
    memset(&mem, 0, sizeof(Buf))
    try:
        if n == 0 or p[0] != c'[':
            return None
        e = _sorted_value(p, 0, n, &out, &mem, 0)
        if e != n:
            return None
        return bytes(raw), PyBytes_FromStringAndSize(out.p, out.n)
    finally:
        free(out.p)
        free(mem.p)


# lines cool_columns parses (and writes out) at a time without the GIL
cdef enum:
    _COOL_BLOCK = 256

cdef struct _Cooled:
    _Line ln
    int state                   # 0: not taken, 1: taken, 2: taken, tool calls given, 3: see _cool_parse
    const char *calls_col       # (state 2, 3) the tool-call column text and canonical JSON
    Py_ssize_t calls_col_n
    const char *calls_canon
    Py_ssize_t calls_canon_n
    Py_ssize_t calls_at         # (state 3) where the canonical JSON starts in _Cols.calls


cdef Py_ssize_t _cool_parse(_Cols *cb, const unsigned char *base, Py_ssize_t size, const int64_t *st,
                            Py_ssize_t nl, Py_ssize_t a, Py_ssize_t b, _Cooled *blk) except -2 nogil:
    """Parse lines ``[a, b)`` into ``blk`` (state 1: spelled as the encoder
    spells them; 2: also holding tool calls, their texts still to be
    given; 3: tool calls whose canonical JSON ``_sorted_value`` wrote to
    ``cb.calls``, emptied first); the first line not followed by a newline
    where the next starts (its index), or -1."""
    cdef Py_ssize_t li, end, n, at, e
    cdef const unsigned char *p
    cdef _Cooled *c
    cb.calls.n = 0
    for li in range(a, b):
        end = st[li + 1] - 1 if li + 1 < nl else size - 1
        if st[li] < 0 or end < st[li] or end >= size or base[end] != 10:
            return li
        c = &blk[li - a]
        n = end - st[li]
        c.state = 0
        c.calls_canon_n = 0
        p = base + st[li]
        if _parse_line(p, n, &c.ln, True):
            c.state = 2 if c.ln.calls else 1
            if c.state == 2 and p[c.ln.rs[R_TOOL_CALLS]] == c'[':
                at = cb.calls.n
                e = _sorted_value(p, c.ln.rs[R_TOOL_CALLS], c.ln.rs[R_TOOL_CALLS] + c.ln.rl[R_TOOL_CALLS],
                                  &cb.calls, &cb.members, 0)
                if e == c.ln.rs[R_TOOL_CALLS] + c.ln.rl[R_TOOL_CALLS]:
                    c.state = 3
                    c.calls_col = <const char *>p + c.ln.rs[R_TOOL_CALLS]
                    c.calls_col_n = c.ln.rl[R_TOOL_CALLS]
                    c.calls_canon_n = cb.calls.n - at
                    c.calls_at = at         # (cb.calls may move until the block is parsed)
                else:
                    cb.calls.n = at
    return -1


cdef int _cool_emit(_Cols *cb, const unsigned char *base, Py_ssize_t size, const int64_t *st,
                    Py_ssize_t nl, Py_ssize_t a, Py_ssize_t b, const _Cooled *blk) except -1 nogil:
    """Write the columns of the lines of ``[a, b)`` taken (state 1, 2 or 3)."""
    cdef Py_ssize_t li, k, n
    cdef const _Cooled *c
    cdef const unsigned char *p
    cdef int col
    cdef _xxh.XXH128_hash_t h
    cdef char hexd[33]
    cdef int32_t ver32
    for li in range(a, b):
        c = &blk[li - a]
        if c.state == 0:
            continue
        p = base + st[li]
        n = (st[li + 1] - 1 if li + 1 < nl else size - 1) - st[li]
        # the string columns: each value unescaped
        for k in range(N_RAW):
            col = _RAW_TO_COL[k]
            if col < 0:
                continue
            _reserve(&cb.data[col], c.ln.rl[k])
            _unescape(&cb.data[col], p + c.ln.rs[k] + 1, c.ln.rl[k] - 2)
            _push_offset(&cb.offs[col], cb.data[col].n)
        if c.state == 1:
            _reserve(&cb.data[C_TOOL_CALLS], 2)
            _put(&cb.data[C_TOOL_CALLS], b"[]", 2)
        else:
            _reserve(&cb.data[C_TOOL_CALLS], c.calls_col_n)
            _put(&cb.data[C_TOOL_CALLS], c.calls_col, c.calls_col_n)
        _push_offset(&cb.offs[C_TOOL_CALLS], cb.data[C_TOOL_CALLS].n)
        _reserve(&cb.data[C_EXTRA], 2)
        _put(&cb.data[C_EXTRA], b"{}", 2)
        _push_offset(&cb.offs[C_EXTRA], cb.data[C_EXTRA].n)
        # the digest: xxh3_128 of the canonical JSON, from the raw values
        cb.canon.n = 0
        _reserve(&cb.canon, n + 256 + c.calls_canon_n)
        if c.state == 1:
            _assemble(&cb.canon, _CANON_C, <const char *>p, c.ln.rs, c.ln.rl, NULL, -1)
        else:
            _assemble(&cb.canon, _CANON_C, <const char *>p, c.ln.rs, c.ln.rl, c.calls_canon, c.calls_canon_n)
        h = _xxh.XXH3_128bits(cb.canon.p, <size_t>cb.canon.n)
        rf_write_hex16(h.high64, <unsigned char *>hexd)
        rf_write_hex16(h.low64, <unsigned char *>hexd + 16)
        _reserve(&cb.data[C_DIGEST], 32)
        _put(&cb.data[C_DIGEST], hexd, 32)
        _push_offset(&cb.offs[C_DIGEST], cb.data[C_DIGEST].n)
        # the numbers
        _reserve(&cb.ts, 8)
        _put(&cb.ts, <const char *>&c.ln.ts, 8)
        _reserve(&cb.tok, 8)
        _put(&cb.tok, <const char *>&c.ln.tok, 8)
        ver32 = <int32_t>c.ln.ver
        _reserve(&cb.ver, 4)
        _put(&cb.ver, <const char *>&ver32, 4)
        _reserve(&cb.ords, 8)
        _put(&cb.ords, <const char *>&c.ln.seq, 8)
    return 0


cdef bint _cool_own_calls(_Cols *cb, _Cooled *blk, Py_ssize_t n) noexcept nogil:
    """Point each line of the block whose tool calls were made here (state
    3) at their canonical JSON; whether a line's are left to the caller
    (state 2)."""
    cdef Py_ssize_t i
    cdef bint python_calls = False
    for i in range(n):
        if blk[i].state == 3:
            blk[i].calls_canon = cb.calls.p + blk[i].calls_at
        elif blk[i].state == 2:
            python_calls = True
    return python_calls


cdef void _cool_taken(_Cooled *blk, Py_ssize_t a, Py_ssize_t b, unsigned char *took) noexcept nogil:
    """Mark the lines of the block [a, b) that were read (not left to the dict path)."""
    cdef Py_ssize_t li
    for li in range(a, b):
        took[li] = blk[li - a].state != 0


def cool_columns(data, starts, object calls_texts):
    """The cool-file columns of verified message lines -- ``data`` holds
    them one after the other, each followed by its newline, line i starting
    at ``starts[i]`` (what ``HotIndex.gather_lines`` gives) -- for the lines
    spelled exactly as the encoder spells them (a time in the range where
    repr and orjson agree):
    ``(taken, columns)``, ``taken`` the indexes of the lines it read (in
    order) and ``columns`` a dict of raw Arrow buffers, by column name: string
    columns as ``(int32 offsets, data)``, ``ts``/``token_estimate``/``ord``
    as float64/int64 bytes, ``schema_version`` as int32 bytes. ``digest`` is
    xxh3_128 of each record's canonical JSON, assembled from the line's own
    escaped values in sorted key order (so equal to rune_fast.cool's
    record_digest of the decoded dict). Every other line is left to the
    caller's Python path; the values' UTF-8 is for the caller to validate.
    A line with tool calls hands their raw JSON to ``calls_texts(raw) ->
    (column text, canonical JSON)`` (None: the line takes the Python path),
    unless it is spelled as orjson spells what it reads from it: then both
    are made here (:func:`canonical_calls`).
    The lines are parsed and their columns written a block of
    ``_COOL_BLOCK`` lines at a time (in the caches), without the GIL from
    the first block to the last but for the blocks whose tool-call texts
    the caller makes: a thread that writes the row groups made of them
    (compact()'s ``_GroupWriter``) or an appender beside a background
    cooling run gets the GIL meanwhile."""
    cdef _ColumnBufs cb = _ColumnBufs()
    cdef const int64_t[::1] st = np.ascontiguousarray(starts, dtype=np.int64)
    cdef Py_ssize_t nl = st.shape[0], li, k, a, b, bad
    cdef const int64_t *stp = &st[0] if nl else NULL
    cdef const unsigned char *base
    cdef Py_ssize_t size
    cdef Py_buffer view
    cdef object texts
    cdef bytes calls_col, calls_canon
    cdef _Cooled *blk = NULL
    cdef _Cooled *c
    cdef list keep
    cdef bint python_calls = False
    cdef unsigned char *took = NULL
    cdef object taken
    for k in range(N_SCOL):
        _push_offset(&cb.c.offs[k], 0)
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        blk = <_Cooled *>malloc(sizeof(_Cooled) * _COOL_BLOCK)
        took = <unsigned char *>calloc(<size_t>nl + 1, 1)
        if blk == NULL or took == NULL:
            raise MemoryError("cool_columns: line table")
        base = <const unsigned char *>view.buf
        size = view.len
        a = b = 0
        bad = -1
        while a < nl:
            # (one stretch without the GIL until a block holds tool calls
            # for the caller: a thread that waits for the GIL back after
            # each block waits for another's switch interval, up to 5 ms)
            with nogil:
                while a < nl:
                    b = min(nl, a + _COOL_BLOCK)
                    bad = _cool_parse(&cb.c, base, size, stp, nl, a, b, blk)
                    if bad >= 0:
                        break
                    python_calls = _cool_own_calls(&cb.c, blk, b - a)
                    if python_calls:
                        break
                    _cool_taken(blk, a, b, took)
                    _cool_emit(&cb.c, base, size, stp, nl, a, b, blk)
                    a = b
            if bad >= 0:
                raise ValueError(f"cool_columns: line {bad} (at {st[bad]}) is not followed by a "
                                 f"newline where the next starts")
            if a >= nl:
                break
            keep = []           # (the tool-call texts of the block, alive until written)
            for li in range(a, b):
                c = &blk[li - a]
                if c.state == 2:
                    # tool calls: their two JSON forms from the caller (None: the dict path)
                    texts = calls_texts(PyBytes_FromStringAndSize(
                        <const char *>base + st[li] + c.ln.rs[R_TOOL_CALLS], c.ln.rl[R_TOOL_CALLS]))
                    if texts is None:
                        c.state = 0
                        continue
                    calls_col, calls_canon = texts
                    keep.append(calls_col)
                    keep.append(calls_canon)
                    c.calls_col = PyBytes_AS_STRING(calls_col)
                    c.calls_col_n = PyBytes_GET_SIZE(calls_col)
                    c.calls_canon = PyBytes_AS_STRING(calls_canon)
                    c.calls_canon_n = PyBytes_GET_SIZE(calls_canon)
            _cool_taken(blk, a, b, took)
            with nogil:
                _cool_emit(&cb.c, base, size, stp, nl, a, b, blk)
            del keep
            a = b
        taken = np.flatnonzero(np.frombuffer(PyBytes_FromStringAndSize(<char *>took, nl),
                                             dtype=np.uint8)).tolist()
    finally:
        free(blk)
        free(took)
        PyBuffer_Release(&view)
    cols = {}
    for k in range(N_SCOL):
        cols[_SCOL_NAMES[k]] = (PyBytes_FromStringAndSize(cb.c.offs[k].p, cb.c.offs[k].n),
                                PyBytes_FromStringAndSize(cb.c.data[k].p, cb.c.data[k].n))
    cols["ts"] = PyBytes_FromStringAndSize(cb.c.ts.p, cb.c.ts.n)
    cols["token_estimate"] = PyBytes_FromStringAndSize(cb.c.tok.p, cb.c.tok.n)
    cols["schema_version"] = PyBytes_FromStringAndSize(cb.c.ver.p, cb.c.ver.n)
    cols["ord"] = PyBytes_FromStringAndSize(cb.c.ords.p, cb.c.ords.n)
    return taken, cols


# --------------------------------------------------------------------------
# Reads: a hot line to its record

cdef tuple _ROLES = ("user", "assistant", "system", "tool")
# the record's slots, set as the record's own from_dict would (the class is frozen)
cdef tuple _SLOT_OF = (("msg_id", R_MSG_ID), ("channel_id", R_CHANNEL), ("task_id", R_TASK),
                       ("hlc", R_HLC), ("content", R_CONTENT), ("tool_call_id", R_TOOL_CALL_ID),
                       ("origin", R_ORIGIN))
# each of _SLOT_OF's fields by its place in _INIT_FIELDS (message_init's slots)
cdef Py_ssize_t _SLOT_INIT[7]
_SLOT_INIT[:] = [0, 4, 5, 10, 3, 8, 9]


cdef object _string_at(const unsigned char *p, Py_ssize_t start, Py_ssize_t length, Buf *scratch):
    """The str value of the canonical JSON string p[start:start+length) (with
    its quotes); None if its bytes are not valid UTF-8."""
    cdef const unsigned char *s = p + start + 1
    cdef Py_ssize_t n = length - 2
    try:
        if memchr(s, c'\\', <size_t>n) == NULL:
            return PyUnicode_DecodeUTF8(<const char *>s, n, NULL)
        scratch.n = 0
        _reserve(scratch, n)
        _unescape(scratch, s, n)
        return PyUnicode_DecodeUTF8(scratch.p, scratch.n, NULL)
    except UnicodeDecodeError:
        return None


cdef class _Decoder:
    """The scratch buffer of one record_from_line call (unescaped strings)."""
    cdef Buf scratch

    def __dealloc__(self):
        free(self.scratch.p)


def record_from_line(line, type record_type, object calls_from_json):
    """``(record, seq)`` of a verified message line spelled as the encoder
    spells it (see :func:`cool_columns`), built with the checks of
    ``records.message_from_stored``; None for any other line, which the
    caller decodes through the Python path (that names what is wrong).
    ``calls_from_json(raw) -> tuple | None`` reads a non-empty tool-call
    list."""
    cdef Py_buffer view
    cdef _Line ln
    cdef const unsigned char *p
    cdef Py_ssize_t n, k
    cdef object rec, v, calls, role = None
    cdef list values
    cdef _Decoder dec = None
    memset(&ln, 0, sizeof(ln))
    PyObject_GetBuffer(line, &view, PyBUF_SIMPLE)
    try:
        p = <const unsigned char *>view.buf
        n = view.len
        if not _parse_line(p, n, &ln, False) or ln.ver != record_type.SCHEMA_VERSION:
            return None
        # the role: one of the four, as the interned constant
        for v in _ROLES:
            if ln.rl[R_ROLE] - 2 == len(<str>v) and memcmp(p + ln.rs[R_ROLE] + 1,
                                                           PyUnicode_AsUTF8AndSize(v, NULL),
                                                           <size_t>len(<str>v)) == 0:
                role = v
                break
        if role is None or ln.rl[R_MSG_ID] == 2 or ln.rl[R_CHANNEL] == 2:
            return None
        calls = ()
        if ln.calls:
            calls = calls_from_json(PyBytes_FromStringAndSize(<const char *>p + ln.rs[R_TOOL_CALLS],
                                                              ln.rl[R_TOOL_CALLS]))
            if calls is None:
                return None
        values = []
        for name, k in _SLOT_OF:
            if dec is None and memchr(p + ln.rs[k], c'\\', <size_t>ln.rl[k]) != NULL:
                dec = _Decoder()
            v = _string_at(p, ln.rs[k], ln.rl[k], NULL if dec is None else &dec.scratch)
            if v is None:
                return None
            values.append(v)
        rec = record_type.__new__(record_type)
        if record_type is _mi_type:
            # (each field stored in its slot, as message_init does: eleven
            # descriptor lookups and calls were ~0.4 us of a ~3 us decode)
            for k in range(len(_SLOT_OF)):
                _mi_set(rec, _SLOT_INIT[k], values[k])
            _mi_set(rec, 1, PyFloat_FromDouble(ln.ts))
            _mi_set(rec, 2, role)
            _mi_set(rec, 6, PyLong_FromLongLong(ln.tok))
            _mi_set(rec, 7, calls)
            _mi_gc(rec, not calls)
            return rec, PyLong_FromLongLong(ln.seq)
        for k in range(len(_SLOT_OF)):
            PyObject_GenericSetAttr(rec, _SLOT_OF[k][0], values[k])
        PyObject_GenericSetAttr(rec, "ts", PyFloat_FromDouble(ln.ts))
        PyObject_GenericSetAttr(rec, "role", role)
        PyObject_GenericSetAttr(rec, "token_estimate", PyLong_FromLongLong(ln.tok))
        PyObject_GenericSetAttr(rec, "tool_calls", calls)
        return rec, PyLong_FromLongLong(ln.seq)
    finally:
        PyBuffer_Release(&view)


# ---------------------------------------------------------------- json_safe

cdef extern from "math.h" nogil:
    double fabs(double x)

cdef int _JSON_SAFE_DEPTH = 256


cdef bint _json_safe(object v, int depth) except -1:
    cdef type t = type(v)
    cdef double d
    if t is str or t is int or t is bool or v is None:
        return True
    if t is float:
        d = v
        return d == 0.0 or (1e-4 <= fabs(d) < 1e16)
    if depth >= _JSON_SAFE_DEPTH:
        return False        # json, which the caller falls back to, judges it
    if t is list or t is ReadOnlyList:
        for x in <list>v:
            if not _json_safe(x, depth + 1):
                return False
        return True
    if t is dict or t is ReadOnlyDict:
        for k, x in (<dict>v).items():
            if type(k) is not str or not _json_safe(x, depth + 1):
                return False
        return True
    return False


def json_safe(v) -> bool:
    """True if orjson spells ``v`` exactly as json.dumps does: plain str,
    int, bool, None, lists and str-keyed dicts of them (read-only ones too) (nested at most 256
    deep), and floats that both write without an exponent (shortest
    round-trip digits)."""
    return _json_safe(v, 0)


# ---------------------------------------------------------------- own_calls

include "_readonly.pxi"


cdef tuple _RECORD_SLOTS = ("msg_id", "ts", "role", "content", "channel_id", "task_id",
                            "token_estimate", "tool_call_id", "origin", "hlc")
#: Bytes of an object's header: where the first slot of a slotted instance lies.
cdef Py_ssize_t _HEAD = object.__basicsize__

# What own_calls copies (set once by own_calls_setup): the record type, the
# copy of another type's record, and -- when an instance of the type is its
# header and its field pointers only -- how many pointers and which one is
# tool_calls (else -1: the copy goes field by field).
cdef type _own_type = None
cdef object _own_fallback = None
cdef object _own_value = None
cdef Py_ssize_t _own_slots = -1
cdef Py_ssize_t _own_calls_at = -1


def own_calls_setup(type record_type, object fallback, object value):
    """Set what :func:`own_calls` copies: instances of ``record_type``, each
    field as it is but the tool calls; another type's record by
    ``fallback(record)``; a tool-call value that is no plain JSON value by
    ``value(v)`` (see _ro_json)."""
    global _own_type, _own_fallback, _own_value, _own_slots, _own_calls_at
    cdef tuple slots = getattr(record_type, "__slots__", ())
    cdef Py_ssize_t n = len(_RECORD_SLOTS) + 1, k
    cdef PyObject **at
    _own_type, _own_fallback, _own_value, _own_slots, _own_calls_at = record_type, fallback, value, -1, -1
    if (record_type.__dictoffset__ == 0 and record_type.__weakrefoffset__ == 0
            and record_type.__itemsize__ == 0 and len(slots) == n and "tool_calls" in slots
            and set(slots) == set(_RECORD_SLOTS) | {"tool_calls"}
            and record_type.__basicsize__ == _HEAD + n * <Py_ssize_t>sizeof(void *)):
        # which pointer is tool_calls (CPython lays slots out in its own
        # order): the one a probe's sentinel lands in
        probe = record_type.__new__(record_type)
        sentinel = object()
        PyObject_GenericSetAttr(probe, "tool_calls", sentinel)
        at = <PyObject **>(<char *><void *>probe + _HEAD)
        for k in range(n):
            if at[k] == <PyObject *>sentinel:
                _own_slots, _own_calls_at = n, k


def own_calls(list recs):
    """Give every record of ``recs`` whose tool calls are not read-only yet
    (:class:`ReadOnlyDict`) a copy with read-only ones (in place; the list
    is returned): the same fields, the tool-call dicts and everything in
    them copied read-only, so no reader can change what another reads.
    Records without tool calls, and records whose tool calls are read-only
    (every record a cache holds), stay as they are."""
    _own_list(recs)
    return recs


cdef int _own_list(list recs) except -1:
    # (own_calls' body; the compiled window calls it through the capsule
    # OWN_CALLS_C, without a Python call)
    cdef Py_ssize_t i, k
    cdef object rec, calls, n
    cdef PyObject **src
    cdef PyObject **dst
    cdef PyObject *c
    if _own_type is None:
        raise RuntimeError("own_calls: own_calls_setup was not called")
    for i in range(len(recs)):
        rec = recs[i]
        if type(rec) is not _own_type:
            calls = rec.tool_calls
            if calls and not _ro_calls(calls):
                recs[i] = _own_fallback(rec)
            continue
        if _own_slots > 0:
            src = <PyObject **>(<char *><void *>rec + _HEAD)
            c = src[_own_calls_at]
            # (most records have none: an empty tuple, read without a call)
            if c == NULL or (PyTuple_CheckExact(<object>c) and PyTuple_GET_SIZE(<object>c) == 0):
                continue
            calls = <object>c
            if not calls or _ro_calls(calls):
                continue
            # the instance is its header and its field pointers: copy them
            # (the new object's are NULL) but the tool calls, which get a
            # read-only copy
            copied = _ro_tuple(calls)
            n = rf_blank(_own_type)
            dst = <PyObject **>(<char *><void *>n + _HEAD)
            for k in range(_own_slots):
                if k == _own_calls_at:
                    Py_XINCREF(<PyObject *>copied)
                    dst[k] = <PyObject *>copied
                else:
                    Py_XINCREF(src[k])
                    dst[k] = src[k]
            recs[i] = n
            continue
        else:
            calls = rec.tool_calls
            if not calls or _ro_calls(calls):
                continue
            n = _own_type.__new__(_own_type)
            for name in _RECORD_SLOTS:
                PyObject_GenericSetAttr(n, name, getattr(rec, name))
        PyObject_GenericSetAttr(n, "tool_calls", _ro_tuple(calls))
        recs[i] = n
    return 0


cdef int _own_list_c(object recs) except -1:
    return _own_list(<list>recs)


#: ``int (*)(object list) except -1``: own_calls in place, for compiled
#: callers (rune_fast._index.repo_window_setup)
OWN_CALLS_C = PyCapsule_New(<void *>_own_list_c, b"rune_fast._encode.own_calls", NULL)


# ------------------------------------------------------- the record's constructor

cdef extern from "Python.h":
    int PyUnicode_KIND(object o)
    void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    int PyUnicode_2BYTE_KIND
    int PyUnicode_4BYTE_KIND
    void Py_XDECREF(PyObject *o)

cdef extern from "math.h" nogil:
    bint isfinite(double x)

cdef extern from "Python.h":
    bint PyDict_Next(object d, Py_ssize_t *pos, PyObject **key, PyObject **value)
    int PyUnicode_Compare(object a, object b)       # (two exact strs: it cannot fail)

cdef extern from *:
    """
    typedef int (*rf_initproc)(PyObject *, PyObject *, PyObject *);
    /* the type's tp_init slot: CPython calls it for t(...) in place of
       slot_tp_init's lookup of __init__ */
    static void rf_set_tp_init(PyObject *t, rf_initproc f) { ((PyTypeObject *)t)->tp_init = f; }
    """
    ctypedef int (*rf_initproc)(PyObject *, PyObject *, PyObject *) except -1
    void rf_set_tp_init(object t, rf_initproc f)


class _Default:
    """The default of ``msg_id`` and ``ts`` in the record's constructor: a
    fresh id, the time now."""
    __slots__ = ()

    def __repr__(self):
        return "<default>"


#: What a record constructor's argument left out gets (``records._MISSING``).
MISSING = _Default()

# The message record's fields in the constructor's argument order.
cdef tuple _INIT_FIELDS = ("msg_id", "ts", "role", "content", "channel_id", "task_id",
                           "token_estimate", "tool_calls", "tool_call_id", "origin", "hlc")
DEF N_INIT = 11

# Set once by message_init_setup.
cdef type _mi_type = None
cdef object _mi_new_id = None       # () -> a fresh msg_id
cdef object _mi_now = None          # () -> time.time()
cdef object _mi_slow = None         # records._checked_message
cdef bint _mi_untrack = False       # _mi_type holds no __dict__ (see _mi_gc)
# where each field's pointer lies in an instance (bytes from its start; -1:
# set through the slot's descriptor)
cdef Py_ssize_t _mi_at[N_INIT]


def message_init_setup(type record_type, object new_id, object now, object slow):
    """Set what :func:`message_init` builds: instances of ``record_type`` (a
    slotted class holding the message fields), ``new_id() -> str`` for a
    missing ``msg_id``, ``now() -> float`` for a missing ``ts``, and
    ``slow(*fields) -> fields`` that checks and normalises the fields of
    anything but the plain case, or raises naming the bad one."""
    global _mi_type, _mi_new_id, _mi_now, _mi_slow, _mi_untrack
    cdef Py_ssize_t k, j, n = N_INIT
    cdef PyObject **at
    cdef tuple slots = getattr(record_type, "__slots__", ())
    _mi_type, _mi_new_id, _mi_now, _mi_slow = record_type, new_id, now, slow
    _mi_untrack = record_type.__dictoffset__ == 0
    for k in range(N_INIT):
        _mi_at[k] = -1
    if (record_type.__dictoffset__ == 0 and record_type.__weakrefoffset__ == 0
            and record_type.__itemsize__ == 0 and len(slots) == n
            and set(slots) == set(_INIT_FIELDS)
            and record_type.__basicsize__ == _HEAD + n * <Py_ssize_t>sizeof(void *)):
        # CPython lays the slots out in its own order: find each field's
        # pointer by the sentinel a probe's field holds
        probe = record_type.__new__(record_type)
        at = <PyObject **>(<char *><void *>probe + _HEAD)
        for k in range(N_INIT):
            sentinel = object()
            PyObject_GenericSetAttr(probe, _INIT_FIELDS[k], sentinel)
            for j in range(n):
                if at[j] == <PyObject *>sentinel:
                    _mi_at[k] = _HEAD + j * <Py_ssize_t>sizeof(void *)
    if record_type.__dict__.get("__init__") is message_init:
        # a type whose __init__ is message_init is called through
        # _mi_tp_init (below); its subclasses keep slot_tp_init, and
        # setting __init__ on it puts slot_tp_init back (CPython
        # recomputes the slot)
        rf_set_tp_init(record_type, _mi_tp_init)


cdef extern from "rf_utf8.h" nogil:
    bint rf_ucs_no_surrogate(int kind, const void *data, size_t n)


cdef inline bint _utf8_str(object s) noexcept:
    """Whether a str encodes as UTF-8 (holds no lone surrogate): the code
    points scanned as they lie (rf_utf8.h), about 0.05 ns a byte in cache."""
    cdef int kind
    if PyUnicode_IS_ASCII(s):
        return True
    kind = PyUnicode_KIND(s)
    if kind == 1:
        return True
    return rf_ucs_no_surrogate(kind, PyUnicode_DATA(s), <size_t>PyUnicode_GET_LENGTH(s))


cdef inline bint _plain_str(object s) noexcept:
    return type(s) is str and _utf8_str(s)


cdef object _NOT_PLAIN = object()


cdef object _plain_json(object v, int depth):
    """A detached copy of a plain JSON value (dicts with str keys, lists, and
    tuples as lists, read-only ones as plain ones, of str, int, finite
    float, bool, None), what
    records._json_value returns for it; None for anything else (a subclass,
    a Mapping, a non-finite float, a lone surrogate, nesting past 256
    levels) ``_NOT_PLAIN``: the Python path normalises or refuses it by
    name."""
    cdef object t = type(v)
    cdef object c, x
    cdef Py_ssize_t i, n
    if v is None or t is bool or t is int:
        return v
    if t is str:
        return v if _utf8_str(v) else _NOT_PLAIN
    if t is float:
        return v if isfinite(<double>v) else _NOT_PLAIN
    if depth >= _JSON_SAFE_DEPTH:
        return _NOT_PLAIN
    if t is dict or t is ReadOnlyDict:
        c = {}
        for k, x in (<dict>v).items():
            if not _plain_str(k):
                return _NOT_PLAIN
            x = _plain_json(x, depth + 1)
            if x is _NOT_PLAIN:
                return _NOT_PLAIN
            c[k] = x
        return c
    if t is list or t is tuple or t is ReadOnlyList:
        n = len(v)
        c = [None] * n
        for i in range(n):
            x = _plain_json(v[i], depth + 1)
            if x is _NOT_PLAIN:
                return _NOT_PLAIN
            (<list>c)[i] = x
        return c
    return _NOT_PLAIN


cdef object _plain_calls_copy(object calls):
    """The tool calls as the constructor stores them (a tuple of detached
    dict copies) when each is a plain (or read-only) dict with str ``id`` and ``name`` and
    an ``arguments`` key, of plain JSON values; None otherwise."""
    cdef Py_ssize_t i, n = len(calls)
    cdef list out = [None] * n
    cdef object call, c
    for i in range(n):
        call = calls[i]
        if (type(call) is not dict and type(call) is not ReadOnlyDict) or "arguments" not in <dict>call:
            return None
        c = (<dict>call).get("id")
        if type(c) is not str:
            return None
        c = (<dict>call).get("name")
        if type(c) is not str:
            return None
        c = _plain_json(call, 1)
        if c is _NOT_PLAIN:
            return None
        out[i] = c
    return tuple(out)


cdef inline int _mi_set(object self, Py_ssize_t k, object v) except -1:
    cdef PyObject **slot
    cdef PyObject *old
    if _mi_at[k] < 0:
        return PyObject_GenericSetAttr(self, _INIT_FIELDS[k], v)
    slot = <PyObject **>(<char *><void *>self + _mi_at[k])
    old = slot[0]
    Py_XINCREF(<PyObject *>v)
    slot[0] = <PyObject *>v
    Py_XDECREF(old)
    return 0


def message_init(self, msg_id=MISSING, ts=MISSING, role="user", content="", channel_id="",
                 task_id="", token_estimate=None, tool_calls=(), tool_call_id="", origin="",
                 hlc=""):
    """The message record's ``__init__`` (set up by
    :func:`message_init_setup`): the plain case -- exact str fields that
    encode as UTF-8, a finite float time, a known role, plain JSON tool
    calls -- is checked here and stored; anything else is checked (and
    normalised, or refused naming the field) by the Python path."""
    if _mi_type is None:
        raise RuntimeError("message_init: message_init_setup was not called")
    if not isinstance(self, _mi_type):
        raise TypeError(f"message_init: expected a {_mi_type.__name__}, got {type(self).__name__}")
    _mi_fill(self, msg_id, ts, role, content, channel_id, task_id, token_estimate, tool_calls,
             tool_call_id, origin, hlc)


cdef int _mi_fill(object self, object msg_id, object ts, object role, object content,
                  object channel_id, object task_id, object token_estimate, object tool_calls,
                  object tool_call_id, object origin, object hlc) except -1:
    """Check, normalise and store the fields (message_init's body)."""
    cdef object calls
    if msg_id is MISSING:
        msg_id = _mi_new_id()
    if ts is MISSING:
        ts = _mi_now()
    calls = ()
    if (type(ts) is float and isfinite(<double>ts) and type(role) is str and role in _ROLE_SET
            and type(msg_id) is str and PyUnicode_GET_LENGTH(msg_id) > 0
            and type(channel_id) is str and PyUnicode_GET_LENGTH(channel_id) > 0
            and _plain_str(msg_id) and _plain_str(channel_id) and _plain_str(task_id)
            and _plain_str(content) and _plain_str(tool_call_id) and _plain_str(origin)
            and _plain_str(hlc)
            and (type(tool_calls) is tuple or type(tool_calls) is list)
            and (token_estimate is None or (type(token_estimate) is int and token_estimate >= 0))):
        if len(tool_calls):
            calls = _plain_calls_copy(tool_calls)
        if calls is not None:
            if token_estimate is None:
                token_estimate = (PyUnicode_GET_LENGTH(content) + 3) // 4
            _mi_set(self, 0, msg_id)
            _mi_set(self, 1, ts)
            _mi_set(self, 2, role)
            _mi_set(self, 3, content)
            _mi_set(self, 4, channel_id)
            _mi_set(self, 5, task_id)
            _mi_set(self, 6, token_estimate)
            _mi_set(self, 7, calls)
            _mi_set(self, 8, tool_call_id)
            _mi_set(self, 9, origin)
            _mi_set(self, 10, hlc)
            _mi_gc(self, not calls)
            return 0
    fields = _mi_slow(msg_id, ts, role, content, channel_id, task_id, token_estimate,
                      tool_calls, tool_call_id, origin, hlc)
    for k in range(N_INIT):
        _mi_set(self, k, fields[k])
    _mi_gc(self, False)
    return 0


cdef inline void _mi_gc(object rec, bint atomic) noexcept:
    """Leave a record of the message type itself (slotted: no ``__dict__``)
    out of the cyclic collector's walks when ``atomic``: every field an
    exact str, float or int and no tool calls, so no reference cycle can
    pass through it -- the rule CPython applies to tuples and dicts of such
    values. Any other record is (again) tracked. Tracked, every record a
    program built or held was walked by each collection its allocations
    set off and promoted to the oldest generation, which every full
    collection walks: 1,000,000 records built 1.18 us each (0.50
    untracked), a full collection with them alive 163 ms (28)."""
    if atomic and _mi_untrack and type(rec) is _mi_type:
        if PyObject_GC_IsTracked(rec):
            PyObject_GC_UnTrack(<void *>rec)
    elif not PyObject_GC_IsTracked(rec):
        PyObject_GC_Track(<void *>rec)


# The record type's own tp_init slot (message_init_setup puts it there).
# ``R(**d)`` reached message_init through slot_tp_init: a lookup of
# __init__, the kwargs dict unpacked into a tuple of names and an array,
# then matched name by name -- about 200 ns of a 1 us construction. This
# takes the arguments as type_call hands them over: positionals from the
# tuple, keywords by walking the dict once, each key matched by identity
# (the names are interned; a call's keywords come in the fields' order, so
# the next field is tried first) or else by equality. Anything else -- a
# key it does not know, one given twice, too many positionals, a subclass
# -- goes to message_init itself, which raises as it always did.
cdef PyObject *_mi_names[N_INIT]
for _k in range(N_INIT):
    _mi_names[_k] = <PyObject *>_INIT_FIELDS[_k]
del _k
# message_init's defaults, in field order
cdef tuple _MI_DEFAULTS = (MISSING, MISSING, "user", "", "", "", None, (), "", "", "")


cdef inline Py_ssize_t _mi_key(PyObject *key, Py_ssize_t first) noexcept:
    """The field a keyword names (trying ``first`` on), or -1."""
    cdef Py_ssize_t i, j = first
    for i in range(N_INIT):
        if j >= N_INIT:
            j = 0
        if _mi_names[j] == key:
            return j
        j += 1
    if type(<object>key) is str:
        for j in range(N_INIT):
            if PyUnicode_Compare(<object>key, <object>_mi_names[j]) == 0:
                return j
    return -1


cdef int _mi_generic(PyObject *self, PyObject *args, PyObject *kwds) except -1:
    if kwds == NULL:
        message_init(<object>self, *<tuple>args)
    else:
        message_init(<object>self, *<tuple>args, **<dict>kwds)
    return 0


cdef int _mi_tp_init(PyObject *self, PyObject *args, PyObject *kwds) except -1:
    cdef PyObject *v[N_INIT]
    cdef PyObject *key
    cdef PyObject *value
    cdef Py_ssize_t n = PyTuple_GET_SIZE(<tuple>args), k, j, pos = 0
    cdef unsigned int seen
    if type(<object>self) is not _mi_type or n > N_INIT:
        return _mi_generic(self, args, kwds)
    for k in range(n):
        v[k] = PyTuple_GET_ITEM(<tuple>args, k)
    for k in range(n, N_INIT):
        v[k] = NULL
    seen = (1u << n) - 1
    if kwds != NULL:
        k = n
        while PyDict_Next(<object>kwds, &pos, &key, &value):
            j = _mi_key(key, k)
            if j < 0 or (seen >> j) & 1:
                return _mi_generic(self, args, kwds)
            seen |= 1u << j
            v[j] = value
            k = j + 1
    for k in range(N_INIT):
        if v[k] == NULL:
            v[k] = PyTuple_GET_ITEM(_MI_DEFAULTS, k)
        Py_XINCREF(v[k])          # held for the call: nothing else may drop them
    try:
        _mi_fill(<object>self, <object>v[0], <object>v[1], <object>v[2], <object>v[3], <object>v[4],
                 <object>v[5], <object>v[6], <object>v[7], <object>v[8], <object>v[9], <object>v[10])
    finally:
        for k in range(N_INIT):
            Py_XDECREF(v[k])
    return 0
