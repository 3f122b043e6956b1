"""Every room's mutable state is written by that room alone (docs/DESIGN.md,
"Rooms").

The rooms of rune_fast._conv share one object, the repository; _conv/host.py
declares each of its attributes under the room (module) that owns it. This
test reads the sources with ``ast`` and fails when a room writes an attribute
another room owns (or one nobody declares): an assignment ``self._x = ...``
(also ``self._x[k] = ...``, ``self._x.field = ...``, ``del self._x[k]``,
augmented assignment) or a call of a mutating method (``self._x.add(...)``,
``.pop``, ``.clear``, ``.update``, ...). A room changes another's state by
calling one of that room's methods.

Only the repository is checked: the classes that own their state as objects
(WriteThread, MapBudget, TombstoneFile, _Staged) write their own ``self``.
"""
from __future__ import annotations

import ast
import os
import re

import rune_fast

PKG = os.path.dirname(rune_fast.__file__)
CONV = os.path.join(PKG, "_conv")
HOST = os.path.join(CONV, "host.py")

#: methods of list, dict, set (and the containers the rooms keep) that change them
MUTATORS = frozenset({
    "add", "discard", "remove", "pop", "popitem", "clear", "update", "append", "extend", "insert",
    "setdefault", "sort", "reverse", "difference_update", "intersection_update",
    "symmetric_difference_update", "__setitem__", "__delitem__",
    # the compiled hot index and decode cache (rune_fast/_index.pyi)
    "attach", "detach", "ingest", "append_bytes", "relocate", "remove_many", "remove_lines", "remove_located",
    "set_seg_filters",
    "move_many", "make_room", "insert", "insert_many",
})

#: the facade module's owner name in host.py's comments
FACADE = "conversation_state.py"

#: Types of the attributes that are objects owning their own state (each
#: writes it alone, under its own lock): calling one of their methods is not
#: a write of the repository's state, even one named like a mutator
#: (``self._events.append(...)`` journals an envelope). Assigning the
#: attribute itself, or a field of the object, still is.
OWNER_OBJECTS = frozenset({"EventStore", "TombstoneFile", "WriteThread", "MapBudget", "CoolArchive",
                           "AtomicStore", "DirLock"})


def declared_owners(types: dict[str, str] | None = None) -> dict[str, set[str]]:
    """attribute -> the modules that own it, from the comments that head
    each group of host.py's ``RepoState`` ("# recovery.py: ...",
    "# compaction.py and cooling.py: ..."); ``types`` gets each one's
    annotation."""
    owners: dict[str, set[str]] = {}
    group: set[str] = set()
    inside = False
    with open(HOST, encoding="utf-8") as f:
        for line in f:
            if line.startswith("class RepoState"):
                inside = True
                continue
            if not inside:
                continue
            if line and not line[0].isspace() and line.strip():
                break       # the class ended
            text = line.strip()
            if text.startswith("#"):
                group = set(re.findall(r"(\w+\.py)", text))
                continue
            m = re.match(r"(\w+)\s*:\s*(.*)", text)
            if m and group:
                owners[m.group(1)] = set(group)
                if types is not None:
                    types[m.group(1)] = m.group(2)
    return owners


def _root_attr(node: ast.AST, names: set[str], aliases: dict[str, str], *, called: bool = False) -> str | None:
    """The attribute X of ``self.X`` at the root of ``node`` (``self.X``,
    ``self.X[k]``, ``self.X.y``, ``self.X[k].y``..., or a local name bound
    to ``self.X``), None otherwise."""
    if isinstance(node, ast.Name) and not called:
        return None         # (rebinding a local name writes nothing)
    while True:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
            return node.attr
        if isinstance(node, ast.Name) and node.id in aliases:
            return aliases[node.id]
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
            continue
        if isinstance(node, ast.Starred):
            node = node.value
            continue
        return None


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, (ast.Tuple, ast.List)):
        return [t for elt in node.elts for t in _targets(elt)]
    return [node]


def _aliases(tree: ast.AST, names: set[str]) -> dict[str, str]:
    """Local names bound to ``self.X`` (``d = self._decoded``, ``a, b =
    self._a, self._b``) or to one of its mutators (``pop = self._x.pop``):
    writes through them are writes to X."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for tgt in node.targets:
            pairs: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(tgt, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    and len(tgt.elts) == len(node.value.elts):
                pairs = list(zip(tgt.elts, node.value.elts))
            else:
                pairs = [(tgt, node.value)]
            for t, v in pairs:
                if not isinstance(t, ast.Name) or not isinstance(v, ast.Attribute):
                    continue
                if isinstance(v.value, ast.Name) and v.value.id in names:
                    out[t.id] = v.attr
                elif v.attr in MUTATORS and isinstance(v.value, ast.Attribute) \
                        and isinstance(v.value.value, ast.Name) and v.value.value.id in names:
                    out[t.id] = v.value.attr + "." + v.attr
    return out


def writes(tree: ast.AST, names: set[str]) -> list[tuple[int, str, str]]:
    """(line, attribute, how) of each write to ``<name>.<attribute>`` in
    ``tree``, local aliases followed within each function."""
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = {w for f in funcs or [tree] for w in _writes(f, names)}
    return sorted(found)


def _writes(tree: ast.AST, names: set[str]) -> list[tuple[int, str, str]]:
    out: list[tuple[int, str, str]] = []
    aliases = _aliases(tree, names)
    bound = {k: v.split(".")[0] for k, v in aliases.items() if "." in v}
    aliases = {k: v for k, v in aliases.items() if "." not in v}
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        how = ""
        if isinstance(node, ast.Assign):
            targets = [t for tgt in node.targets for t in _targets(tgt)]
            how = "assigns"
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
            how = "assigns"
        elif isinstance(node, ast.Delete):
            targets = [t for tgt in node.targets for t in _targets(tgt)]
            how = "deletes"
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.comprehension)):
            items = [node.target] if not isinstance(node, (ast.With, ast.AsyncWith)) else \
                [i.optional_vars for i in node.items if i.optional_vars is not None]
            targets = [t for tgt in items for t in _targets(tgt)]
            how = "assigns"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATORS:
            targets = [node.func.value]
            how = f"calls .{node.func.attr}() on"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in bound:
            out.append((node.lineno, bound[node.func.id], f"calls {node.func.id}() (a bound mutator) of"))
            continue
        for t in targets:
            attr = _root_attr(t, names, aliases, called=how.startswith("calls"))
            if attr is not None:
                out.append((getattr(node, "lineno", getattr(t, "lineno", 0)), attr, how))
    return out


def _is_repository_class(cls: ast.ClassDef) -> bool:
    """A room of the repository: a ``Host`` mixin, or the facade class."""
    bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
    return "Host" in bases or cls.name == "ConversationStateRepository"


def _owner_object(annotation: str) -> bool:
    return set(re.findall(r"\w+", annotation)) & OWNER_OBJECTS != set()


def violations() -> list[str]:
    types: dict[str, str] = {}
    owners = declared_owners(types)
    files = sorted(os.path.join(CONV, n) for n in os.listdir(CONV) if n.endswith(".py"))
    files.append(os.path.join(PKG, "conversation_state.py"))
    found = []
    for path in files:
        module = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        scopes: list[tuple[ast.AST, set[str]]] = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and _is_repository_class(node):
                scopes.append((node, {"self"}))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # a module function handed the repository (viewer._retry)
                params = {a.arg for a in node.args.args} & {"self", "repo", "host"}
                if params:
                    scopes.append((node, params))
        for scope, names in scopes:
            for line, attr, how in writes(scope, names):
                if attr.startswith("__"):
                    continue        # (the facade's switch to the viewer type: self.__class__)
                if how.startswith("calls") and _owner_object(types.get(attr, "")):
                    continue
                own = owners.get(attr)
                if own is None:
                    found.append(f"{module}:{line} {how} self.{attr}, which host.py does not declare")
                elif module not in own:
                    found.append(f"{module}:{line} {how} self.{attr}, owned by {' and '.join(sorted(own))}")
    return found


def test_host_declares_groups():
    owners = declared_owners()
    assert owners["_index"] == {"snapshot.py"}
    assert owners["_lock"] == {FACADE}
    assert owners["_since_compact"] == {"compaction.py", "cooling.py"}
    assert len(owners) > 60


def test_checker_sees_writes():
    src = ("class R(Host):\n"
           "    def f(self):\n"
           "        self._a = 1\n"
           "        self._b[k] = 2\n"
           "        del self._c[k]\n"
           "        self._d += 1\n"
           "        self._e.add(1)\n"
           "        self._f[k].append(1)\n"
           "        self._g.size = 3\n"
           "        self._h, (self._i, x) = 1, (2, 3)\n"
           "        self._j.get(1)\n"
           "        y = self._k\n"
           "        m, n = self._m, self._n\n"
           "        m[1] = 2\n"
           "        n.add(3)\n"
           "        p = self._p.pop\n"
           "        p(1)\n"
           "        q = self._q.get\n"
           "        q(1)\n")
    got = {attr for _line, attr, _how in writes(ast.parse(src), {"self"})}
    assert got == {"_a", "_b", "_c", "_d", "_e", "_f", "_g", "_h", "_i", "_m", "_n", "_p"}


def test_every_room_writes_only_its_own_state():
    found = violations()
    assert not found, "a room writes state it does not own:\n  " + "\n  ".join(found)
