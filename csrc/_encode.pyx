# cython: boundscheck=False, wraparound=False
"""The append path's encoding, compiled: records to the bytes a batch writes.

:func:`encode_messages` gives, for each record, the record JSON of its tail
line (``orjson.dumps(record.to_dict())``), its ``payload_hash`` (sha256 of the
canonical JSON: sorted keys, no spaces) and its id key (the JSON-escaped
``msg_id``, as the index keys it), byte for byte what
:func:`rune_fast.codec.message_body_and_hash` and :func:`rune_fast.codec.key`
give (tests/test_encode.py checks it on generated records). Both JSON forms are
written from one escaping of each string. A record it cannot spell exactly
(a time outside the range where ``repr`` and orjson print floats alike, a
token estimate past 2**63, a string that is not valid UTF-8) and a record past
the size limit go through the Python path, which names the problem.

:func:`frame_messages` and :func:`message_envelopes` frame a batch's tail
lines and event-store envelopes (docs/FORMAT.md) into one buffer each.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free
from cpython.unicode cimport PyUnicode_AsUTF8String
from libc.stdint cimport int64_t
from libc.stdio cimport snprintf
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, strlen

from rf_core cimport RF_MAX_LINE, RF_PREFIX_LEN, rf_write_prefix

import hashlib

from rune_fast.errors import FramingError

cdef extern from "Python.h":
    char *PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int *ptype) except NULL
    int Py_DTSF_ADD_DOT_0
    bint PyUnicode_IS_ASCII(object o)
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *size) except NULL
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1

# The Python callables the compiled path hands records to.
_sha256 = hashlib.sha256

#: ``,"k":"m","r":`` -- what stands between a message line's prefix and its record JSON.
cdef bytes _MSG_PREFIX = b',"k":"m","r":'
cdef bytes _ENV_HEAD = b',"type":"conversation.message","id":"'
cdef bytes _ENV_HASH = b'","payload_hash":"'
cdef bytes _ENV_TS = b'","ts":'

cdef extern from "rf_json.h" nogil:
    size_t rf_json_escape(const unsigned char *s, size_t n, unsigned char *out)


cdef struct Buf:
    char *p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _reserve(Buf *b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap
    cdef char *p
    if b.n + extra <= b.cap:
        return 0
    cap = max(b.cap * 2, b.n + extra, 4096)
    p = <char *>realloc(b.p, <size_t>cap)
    if p == NULL:
        raise MemoryError("encode_messages: scratch buffer")
    b.p = p
    b.cap = cap
    return 0


cdef inline void _put(Buf *b, const char *s, Py_ssize_t n) noexcept:
    # room was reserved by the caller
    memcpy(b.p + b.n, s, <size_t>n)
    b.n += n


cdef int _put_escaped(Buf *b, const unsigned char *s, Py_ssize_t n) except -1:
    """JSON-escape the UTF-8 bytes s[0:n) onto b, as orjson and json do."""
    _reserve(b, 6 * n + 16)
    b.n += <Py_ssize_t>rf_json_escape(s, <size_t>n, <unsigned char *>b.p + b.n)
    return 0


cdef int _escape_str(Buf *b, object s) except -1:
    """Escape str ``s`` onto b; -2 if it is not a str or not valid UTF-8."""
    cdef Py_ssize_t n
    cdef const char *p
    cdef bytes tmp
    if type(s) is not str:
        return -2
    if PyUnicode_IS_ASCII(s):
        p = PyUnicode_AsUTF8AndSize(s, &n)     # the str's own bytes: no copy
        _put_escaped(b, <const unsigned char *>p, n)
        return 0
    try:
        tmp = PyUnicode_AsUTF8String(s)        # not cached on the str (memory)
    except UnicodeEncodeError:
        return -2
    _put_escaped(b, <const unsigned char *>PyBytes_AS_STRING(tmp), PyBytes_GET_SIZE(tmp))
    return 0


# The eight string fields, in the order they are escaped into the scratch buffer.
cdef enum:
    F_MSG_ID, F_CHANNEL, F_TASK, F_HLC, F_CONTENT, F_ROLE, F_TOOL_CALL_ID, F_ORIGIN, N_STR

cdef tuple _STR_FIELDS = ("msg_id", "channel_id", "task_id", "hlc", "content", "role",
                          "tool_call_id", "origin")


cdef inline void _lit(Buf *b, const char *s) noexcept:
    _put(b, s, <Py_ssize_t>strlen(s))


cdef inline void _field(Buf *o, const char *name, Buf *esc,
                        Py_ssize_t *start, Py_ssize_t *length, int f) noexcept:
    # ,"name":"<escaped>"   (name includes its leading punctuation)
    _lit(o, name)
    _put(o, esc.p + start[f], length[f])
    _put(o, b'"', 1)


cdef class _Scratch:
    """Reusable buffers of one encode_messages call."""
    cdef Buf esc
    cdef Buf out

    def __dealloc__(self):
        free(self.esc.p)
        free(self.out.p)


def encode_messages(list msgs, type record_type, object slow, object calls_json):
    """(bodies, hashes, keys) of the records in ``msgs``: lists of bytes, str
    and bytes, one entry per record.

    ``record_type`` is ConversationMessageRecord; anything else in ``msgs``
    raises TypeError naming its index. ``slow(record) -> (body, hash, key)``
    encodes a record this path does not spell; ``calls_json(record) ->
    (body_json, canonical_json)`` gives the two JSON forms of a non-empty
    ``tool_calls``."""
    cdef Py_ssize_t n = len(msgs), i, k, total, cl_b, cl_c
    cdef list bodies = [None] * n
    cdef list hashes = [None] * n
    cdef list keys = [None] * n
    cdef _Scratch sc = _Scratch()
    cdef Py_ssize_t start[N_STR]
    cdef Py_ssize_t length[N_STR]
    cdef char tokbuf[24]
    cdef char *tsrep = NULL
    cdef Py_ssize_t tslen, toklen
    cdef long long tok
    cdef int overflow, bad
    cdef double ts = 0.0
    cdef bytes body, canon, cb, cc
    cdef object rec, calls, v
    cdef object version = record_type.SCHEMA_VERSION
    cdef bytes verb
    if type(version) is not int:
        raise TypeError(f"encode_messages: {record_type.__name__}.SCHEMA_VERSION must be int")
    verb = str(version).encode("ascii")
    for i in range(n):
        rec = msgs[i]
        if type(rec) is not record_type:
            raise TypeError(f"msgs[{i}]: expected {record_type.__name__}, got {type(rec).__name__}")
        # -- the values this path spells exactly; anything else goes slow
        v = rec.ts
        tok = 0
        bad = type(v) is not float
        if not bad:
            ts = v
            bad = not (ts == 0.0 or 1e-4 <= abs(ts) < 1e16)
        if not bad:
            v = rec.token_estimate
            bad = type(v) is not int
            if not bad:
                tok = PyLong_AsLongLongAndOverflow(v, &overflow)
                bad = overflow != 0 or tok < 0
        calls = rec.tool_calls
        if not bad and type(calls) is not tuple:
            bad = True
        sc.esc.n = 0
        k = 0
        while not bad and k < N_STR:
            start[k] = sc.esc.n
            bad = _escape_str(&sc.esc, getattr(rec, _STR_FIELDS[k])) != 0
            length[k] = sc.esc.n - start[k]
            k += 1
        if bad:
            bodies[i], hashes[i], keys[i] = slow(rec)
            continue
        if len(calls):
            cb, cc = calls_json(rec)
        else:
            cb = cc = b"[]"
        cl_b = PyBytes_GET_SIZE(cb)
        cl_c = PyBytes_GET_SIZE(cc)
        toklen = snprintf(tokbuf, sizeof(tokbuf), "%lld", tok)
        tsrep = PyOS_double_to_string(ts, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
        try:
            tslen = <Py_ssize_t>strlen(tsrep)
            total = 0
            for k in range(N_STR):
                total += length[k]
            # 12 keys with quotes, colons, commas and braces: 167 bytes (+ slack)
            total += 200 + tslen + toklen + cl_b + cl_c + PyBytes_GET_SIZE(verb)
            sc.out.n = 0
            _reserve(&sc.out, total)
            # the tail line's record JSON, in to_dict() order
            _field(&sc.out, b'{"msg_id":"', &sc.esc, start, length, F_MSG_ID)
            _field(&sc.out, b',"channel_id":"', &sc.esc, start, length, F_CHANNEL)
            _field(&sc.out, b',"task_id":"', &sc.esc, start, length, F_TASK)
            _field(&sc.out, b',"hlc":"', &sc.esc, start, length, F_HLC)
            _field(&sc.out, b',"content":"', &sc.esc, start, length, F_CONTENT)
            _lit(&sc.out, b',"ts":')
            _put(&sc.out, tsrep, tslen)
            _field(&sc.out, b',"role":"', &sc.esc, start, length, F_ROLE)
            _lit(&sc.out, b',"token_estimate":')
            _put(&sc.out, tokbuf, toklen)
            _lit(&sc.out, b',"tool_calls":')
            _put(&sc.out, PyBytes_AS_STRING(cb), cl_b)
            _field(&sc.out, b',"tool_call_id":"', &sc.esc, start, length, F_TOOL_CALL_ID)
            _field(&sc.out, b',"origin":"', &sc.esc, start, length, F_ORIGIN)
            _lit(&sc.out, b',"schema_version":')
            _put(&sc.out, PyBytes_AS_STRING(verb), PyBytes_GET_SIZE(verb))
            _lit(&sc.out, b'}')
            body = PyBytes_FromStringAndSize(sc.out.p, sc.out.n)
            # the canonical JSON: the same values, keys sorted
            sc.out.n = 0
            _field(&sc.out, b'{"channel_id":"', &sc.esc, start, length, F_CHANNEL)
            _field(&sc.out, b',"content":"', &sc.esc, start, length, F_CONTENT)
            _field(&sc.out, b',"hlc":"', &sc.esc, start, length, F_HLC)
            _field(&sc.out, b',"msg_id":"', &sc.esc, start, length, F_MSG_ID)
            _field(&sc.out, b',"origin":"', &sc.esc, start, length, F_ORIGIN)
            _field(&sc.out, b',"role":"', &sc.esc, start, length, F_ROLE)
            _lit(&sc.out, b',"schema_version":')
            _put(&sc.out, PyBytes_AS_STRING(verb), PyBytes_GET_SIZE(verb))
            _field(&sc.out, b',"task_id":"', &sc.esc, start, length, F_TASK)
            _lit(&sc.out, b',"token_estimate":')
            _put(&sc.out, tokbuf, toklen)
            _field(&sc.out, b',"tool_call_id":"', &sc.esc, start, length, F_TOOL_CALL_ID)
            _lit(&sc.out, b',"tool_calls":')
            _put(&sc.out, PyBytes_AS_STRING(cc), cl_c)
            _lit(&sc.out, b',"ts":')
            _put(&sc.out, tsrep, tslen)
            _lit(&sc.out, b'}')
        finally:
            PyMem_Free(tsrep)
            tsrep = NULL
        if PyBytes_GET_SIZE(body) > max_record_bytes:
            bodies[i], hashes[i], keys[i] = slow(rec)    # raises RecordTooLargeError
            continue
        canon = PyBytes_FromStringAndSize(sc.out.p, sc.out.n)
        bodies[i] = body
        hashes[i] = _sha256(canon).hexdigest()
        keys[i] = PyBytes_FromStringAndSize(sc.esc.p + start[F_MSG_ID], length[F_MSG_ID])
    return bodies, hashes, keys


#: Set by rune_fast.codec to its MAX_RECORD_BYTES (one constant, one place).
max_record_bytes = 8 * 1024 * 1024


cdef int _seq_digits(int64_t seq, char *out) noexcept:
    return snprintf(out, 24, "%lld", <long long>seq)


def frame_messages(list bodies, list order, int64_t seq0):
    """``(data, lengths)``: the framed tail lines of ``bodies[order[j]]`` with
    append sequence ``seq0 + j`` (``data`` their concatenation, ``lengths``
    each line's length with its newline). Each line is
    ``{"x":"<xxh3>",``"k":"m","r":<body>,"s":<seq>}`` + newline."""
    cdef Py_ssize_t m = len(order), j, total = 0, bl, rl, pos = 0
    cdef bytes body, out
    cdef char digits[24]
    cdef int nd
    cdef char *o
    cdef unsigned char *rest
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(_MSG_PREFIX)
    cdef list lengths = [0] * m
    if seq0 < 0:
        raise FramingError(f"frame_messages: negative sequence {seq0}")
    for j in range(m):
        body = bodies[order[j]]
        bl = PyBytes_GET_SIZE(body)
        nd = _seq_digits(seq0 + j, digits)
        rl = plen + bl + 5 + nd + 1
        if <size_t>(RF_PREFIX_LEN + rl + 1) > RF_MAX_LINE:
            raise FramingError(f"frame_messages: the line of bodies[{order[j]}] would be "
                               f"{RF_PREFIX_LEN + rl + 1} bytes, over MAX_LINE ({RF_MAX_LINE})")
        lengths[j] = RF_PREFIX_LEN + rl + 1
        total += RF_PREFIX_LEN + rl + 1
    out = PyBytes_FromStringAndSize(NULL, total)
    o = PyBytes_AS_STRING(out)
    for j in range(m):
        body = bodies[order[j]]
        bl = PyBytes_GET_SIZE(body)
        nd = _seq_digits(seq0 + j, digits)
        rest = <unsigned char *>o + pos + RF_PREFIX_LEN
        rl = 0
        memcpy(rest, PyBytes_AS_STRING(_MSG_PREFIX), <size_t>plen)
        rl += plen
        memcpy(rest + rl, PyBytes_AS_STRING(body), <size_t>bl)
        rl += bl
        memcpy(rest + rl, b',"s":', 5)
        rl += 5
        memcpy(rest + rl, digits, <size_t>nd)
        rl += nd
        rest[rl] = b'}'
        rl += 1
        rf_write_prefix(rest, <size_t>rl, <unsigned char *>o + pos)
        rest[rl] = b'\n'
        pos += RF_PREFIX_LEN + rl + 1
    return out, lengths


def message_envelopes(list keys, list hashes, list order, bytes ts_json):
    """The framed event-store envelopes of the messages ``order`` indexes:
    ``{"type":"conversation.message","id":<key>,"payload_hash":<hash>,"ts":<ts_json>}``
    each (``frame_object`` of that dict), concatenated."""
    cdef Py_ssize_t m = len(order), j, total = 0, pos = 0, rl
    cdef bytes key, h, out
    cdef list hb = [None] * m
    cdef Py_ssize_t hl = PyBytes_GET_SIZE(_ENV_HEAD), tl = PyBytes_GET_SIZE(ts_json)
    cdef Py_ssize_t ml = PyBytes_GET_SIZE(_ENV_HASH), sl = PyBytes_GET_SIZE(_ENV_TS)
    cdef char *o
    cdef unsigned char *rest
    for j in range(m):
        key = keys[order[j]]
        h = (<str>hashes[order[j]]).encode("ascii")
        hb[j] = h
        total += RF_PREFIX_LEN + hl + PyBytes_GET_SIZE(key) + ml + PyBytes_GET_SIZE(h) + sl + tl + 2
    out = PyBytes_FromStringAndSize(NULL, total)
    o = PyBytes_AS_STRING(out)
    for j in range(m):
        key = keys[order[j]]
        h = hb[j]
        rest = <unsigned char *>o + pos + RF_PREFIX_LEN
        rl = 0
        memcpy(rest, PyBytes_AS_STRING(_ENV_HEAD), <size_t>hl)
        rl += hl
        memcpy(rest + rl, PyBytes_AS_STRING(key), <size_t>PyBytes_GET_SIZE(key))
        rl += PyBytes_GET_SIZE(key)
        memcpy(rest + rl, PyBytes_AS_STRING(_ENV_HASH), <size_t>ml)
        rl += ml
        memcpy(rest + rl, PyBytes_AS_STRING(h), <size_t>PyBytes_GET_SIZE(h))
        rl += PyBytes_GET_SIZE(h)
        memcpy(rest + rl, PyBytes_AS_STRING(_ENV_TS), <size_t>sl)
        rl += sl
        memcpy(rest + rl, PyBytes_AS_STRING(ts_json), <size_t>tl)
        rl += tl
        rest[rl] = b'}'
        rl += 1
        rf_write_prefix(rest, <size_t>rl, <unsigned char *>o + pos)
        rest[rl] = b'\n'
        pos += RF_PREFIX_LEN + rl + 1
    if pos != total:
        raise FramingError(f"message_envelopes: wrote {pos} of {total} bytes")
    return out
