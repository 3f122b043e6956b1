# Read-only tool calls (included by _encode.pyx).
#
# The store hands out the records its caches hold, and the dicts inside a
# record's tool_calls are its one part a caller could change in place. Each
# read used to give every record with tool calls a copy of its own
# (own_calls: ~160 ns a record, a third of a warm window(ch, 8)); instead a
# record enters a cache with its tool calls made read-only once (decoded from
# a line or an archived row, or copied from an appended record), and reads
# hand it out as it is. The values stay dicts and lists (isinstance, ==,
# json/orjson, pickle all see one), and a change raises TypeError. Like a
# frozen record's fields, they can still be changed by calling the base
# class's methods (dict.__setitem__(d, k, v)): the write path checks a
# record's tool calls again before it writes them.

from cpython.dict cimport PyDict_SetItem
from cpython.list cimport PyList_Append


cdef str _RO_HINT = ("tool_calls of a record read from the store are read-only: edit a copy "
                     "(dict(call), list(value), or the record's to_dict())")


cdef object _ro_refuse(object self, str method):
    raise TypeError(f"{type(self).__name__}.{method}: {_RO_HINT}")


# The instance __cinit__ filled last: its __init__ comes right after it (the
# type's call runs both, no Python code between); any later __init__ call
# (which a dict or list would take as an update) is refused.
cdef void *_ro_made = NULL


cdef int _ro_init(object self) except -1:
    global _ro_made
    if _ro_made != <void *>self:
        _ro_refuse(self, "__init__")
    _ro_made = NULL
    return 0


cdef class ReadOnlyDict(dict):
    """A dict whose content cannot be changed (its nested dicts and lists are
    read-only too). Equal to, and JSON-encoded as, the plain dict of its items;
    ``dict(d)`` or ``d.copy()`` is a plain, mutable copy. Changing it raises
    TypeError. Not hashable (as dict)."""

    def __cinit__(self, *args, **kwargs):
        global _ro_made
        if args or kwargs:
            for k, v in dict(*args, **kwargs).items():
                PyDict_SetItem(self, k, _ro_value(v))
        _ro_made = <void *>self

    def __init__(self, *args, **kwargs):
        _ro_init(self)

    def __setitem__(self, key, value):
        _ro_refuse(self, "__setitem__")

    def __delitem__(self, key):
        _ro_refuse(self, "__delitem__")

    def __ior__(self, other):
        _ro_refuse(self, "__ior__")

    def clear(self):
        _ro_refuse(self, "clear")

    def pop(self, *args):
        _ro_refuse(self, "pop")

    def popitem(self):
        _ro_refuse(self, "popitem")

    def setdefault(self, *args):
        _ro_refuse(self, "setdefault")

    def update(self, *args, **kwargs):
        _ro_refuse(self, "update")

    def __reduce__(self):
        return ReadOnlyDict, (dict(self),)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


cdef class ReadOnlyList(list):
    """A list whose content cannot be changed (its nested dicts and lists are
    read-only too). Equal to, and JSON-encoded as, the plain list of its
    items; ``list(v)``, ``v.copy()`` or ``v[:]`` is a plain, mutable copy.
    Changing it raises TypeError."""

    def __cinit__(self, *args):
        global _ro_made
        if args:
            for v in list(*args):
                PyList_Append(self, _ro_value(v))
        _ro_made = <void *>self

    def __init__(self, *args):
        _ro_init(self)

    def __setitem__(self, index, value):
        _ro_refuse(self, "__setitem__")

    def __delitem__(self, index):
        _ro_refuse(self, "__delitem__")

    def __iadd__(self, other):
        _ro_refuse(self, "__iadd__")

    def __imul__(self, n):
        _ro_refuse(self, "__imul__")

    def append(self, object, /):
        _ro_refuse(self, "append")

    def extend(self, iterable, /):
        _ro_refuse(self, "extend")

    def insert(self, index, object, /):
        _ro_refuse(self, "insert")

    def pop(self, *args):
        _ro_refuse(self, "pop")

    def remove(self, value, /):
        _ro_refuse(self, "remove")

    def clear(self):
        _ro_refuse(self, "clear")

    def sort(self, *, key=None, reverse=False):
        _ro_refuse(self, "sort")

    def reverse(self):
        _ro_refuse(self, "reverse")

    def __reduce__(self):
        return ReadOnlyList, (list(self),)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


cdef object _ro_value(object v):
    """``v`` with every dict and list in it read-only, a tuple as a read-only
    list (a read-only one as it is; other values as they are): the
    constructors' case, for any value."""
    cdef object t = type(v)
    if t is ReadOnlyDict or t is ReadOnlyList:
        return v
    if isinstance(v, dict):
        return ReadOnlyDict(v)
    if isinstance(v, (list, tuple)):
        return ReadOnlyList(v)
    return v


cdef object _ro_json(object v):
    """A read-only copy of a stored JSON value (plain dicts, lists, str, int,
    float, bool, None; read-only ones are taken as they are). Anything else
    (a tuple or a Mapping a caller put into its record's tool calls after
    building it, which the store accepted) goes to ``_own_value`` first: the
    plain JSON value stored for it."""
    cdef object t = type(v)
    cdef object c, x
    cdef ReadOnlyDict d
    cdef ReadOnlyList l
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    if t is ReadOnlyDict or t is ReadOnlyList:
        return v
    if t is dict:
        d = ReadOnlyDict.__new__(ReadOnlyDict)
        for k, x in (<dict>v).items():
            PyDict_SetItem(d, k, _ro_json(x))
        return d
    if t is list:
        l = ReadOnlyList.__new__(ReadOnlyList)
        for x in <list>v:
            PyList_Append(l, _ro_json(x))
        return l
    return _ro_json(_own_value(v))


cdef bint _ro_calls(object calls):
    """Whether a record's tool calls are read-only already: a tuple of
    ReadOnlyDict (whose nested values are read-only by construction)."""
    cdef Py_ssize_t i
    if type(calls) is not tuple:
        return False
    for i in range(PyTuple_GET_SIZE(calls)):
        if type(<object>PyTuple_GET_ITEM(calls, i)) is not ReadOnlyDict:
            return False
    return True


cdef tuple _ro_tuple(object calls):
    """A tuple of read-only copies of the tool calls ``calls``."""
    cdef Py_ssize_t i, k
    cdef tuple out
    if _ro_calls(calls):
        return <tuple>calls
    if type(calls) is not tuple:
        return tuple([_ro_json(c) for c in calls])
    k = PyTuple_GET_SIZE(calls)
    out = PyTuple_New(k)
    for i in range(k):
        c = _ro_json(<object>PyTuple_GET_ITEM(calls, i))
        Py_INCREF(c)
        PyTuple_SET_ITEM(out, i, c)
    return out


cdef extern from *:
    """
    /* A decoder's fresh JSON value (exact dicts, lists, str, int, float,
       bool, None; no one else holds its containers) made read-only in
       place: each dict's and list's type set to rd / rl (their layout is
       the base's; a static type is not counted by its instances, a heap
       type is), children first, so a container set is read-only through
       and through. -1 (no exception set) at anything else or nesting past
       256 levels: what was set so far stays set, the rest does not. */
    static int rf_ro_retype(PyObject *v, PyTypeObject *rd, PyTypeObject *rl, int depth) {
        PyTypeObject *t = Py_TYPE(v), *tx;
        PyObject *k, *x;
        Py_ssize_t pos = 0, i, n;
        if (t != &PyDict_Type && t != &PyList_Type)
            return -1;
        if (depth >= 256)
            return -1;
        if (t == &PyDict_Type) {
            while (PyDict_Next(v, &pos, &k, &x)) {
                tx = Py_TYPE(x);
                if (tx == &PyDict_Type || tx == &PyList_Type) {
                    if (rf_ro_retype(x, rd, rl, depth + 1) < 0)
                        return -1;
                } else if (!(tx == &PyUnicode_Type || tx == &PyLong_Type || tx == &PyFloat_Type
                             || tx == &PyBool_Type || x == Py_None))
                    return -1;
            }
            t = rd;
        } else {
            n = PyList_GET_SIZE(v);
            for (i = 0; i < n; i++) {
                x = PyList_GET_ITEM(v, i);
                tx = Py_TYPE(x);
                if (tx == &PyDict_Type || tx == &PyList_Type) {
                    if (rf_ro_retype(x, rd, rl, depth + 1) < 0)
                        return -1;
                } else if (!(tx == &PyUnicode_Type || tx == &PyLong_Type || tx == &PyFloat_Type
                             || tx == &PyBool_Type || x == Py_None))
                    return -1;
            }
            t = rl;
        }
        if (t->tp_flags & Py_TPFLAGS_HEAPTYPE)
            Py_INCREF(t);
        Py_SET_TYPE(v, t);
        return 0;
    }
    """
    int rf_ro_retype(object v, type rd, type rl, int depth)


# Whether a fresh dict or list may become read-only in place (the subclasses
# are the base's layout: no field, no __dict__, no weak references).
cdef bint _ro_retype_ok = (
    ReadOnlyDict.__basicsize__ == dict.__basicsize__ and ReadOnlyList.__basicsize__ == list.__basicsize__
    and ReadOnlyDict.__itemsize__ == dict.__itemsize__ and ReadOnlyList.__itemsize__ == list.__itemsize__
    and ReadOnlyDict.__dictoffset__ == 0 and ReadOnlyList.__dictoffset__ == 0
    and ReadOnlyDict.__weakrefoffset__ == 0 and ReadOnlyList.__weakrefoffset__ == 0)


def fresh_read_only_calls(list calls):
    """:func:`read_only_calls` of a decoder's fresh output, which no one else
    holds (``orjson.loads``'s list of call dicts): its dicts and lists made
    read-only in place, without a copy (a copy and its frees cost a decode
    ~0.3 us a record with tool calls); a call holding anything else (no
    decoder's output) is copied."""
    cdef Py_ssize_t i, k = len(calls)
    cdef tuple out = PyTuple_New(k)
    for i in range(k):
        c = calls[i]
        if type(c) is not dict or not _ro_retype_ok or rf_ro_retype(c, ReadOnlyDict, ReadOnlyList, 1) < 0:
            c = _ro_json(c)
        Py_INCREF(c)
        PyTuple_SET_ITEM(out, i, c)
    return out


def read_only_calls(calls):
    """``calls`` (a sequence of tool-call dicts as decoded from stored JSON)
    as a record read from the store holds them: a tuple of
    :class:`ReadOnlyDict`, every nested dict and list read-only (values that
    are read-only already are shared, not copied)."""
    return _ro_tuple(calls)


def is_read_only_calls(calls) -> bool:
    """Whether ``calls`` is a tuple of :class:`ReadOnlyDict` (what a record
    read from the store holds)."""
    return _ro_calls(calls)
