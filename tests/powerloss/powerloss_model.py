"""The power-loss model: read a recording of shim.c, build the on-disk states
a power loss at any point of it may leave, and check a store opened on one.

A recording is a list of events (file-system calls, in the order they
happened). A crash at point ``k`` keeps the events before ``k``:

- a file's data (writes, truncations, preallocations) recorded before the
  start of an fsync/fdatasync of that file (any descriptor of it) that
  returned before ``k`` is durable; every later one is kept whole, dropped,
  or torn: cut into 512-byte or 4 KiB pieces (aligned in the file), each
  kept or lost on its own (a page lost before a later page kept). A dropped
  write that grew the file may leave the size grown and the bytes zero (the
  size reached the disk before the data);
- a directory entry change (create, rename, unlink, mkdir) is durable once an
  fsync of its folder started after it and returned before ``k``; of the
  others, mode "prefix" keeps an in-order prefix (a journaling file system),
  mode "subset" keeps each one or not (a rename lost while a later change in
  another folder, or an earlier one, stayed).

Bytes the workload wrote to its ``acks`` file (outside the state folder) say
what was acknowledged before ``k``; they are read from the recording itself.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

O_TRUNC = os.O_TRUNC
O_CREAT = os.O_CREAT
O_DIRECTORY = os.O_DIRECTORY
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2


@dataclass
class Op:
    i: int                  # index in the recording
    kind: str               # data: W T F Z (O_TRUNC); entry: create mkdir rename unlink rmdir
    ino: int = -1
    off: int = 0
    length: int = 0
    mode: int = 0
    data: bytes = b""
    path: str = ""
    new: str = ""


@dataclass
class Recording:
    root: str
    n: int = 0                                  # events
    data_ops: dict[int, list[Op]] = field(default_factory=dict)       # ino -> ops
    entry_ops: list[Op] = field(default_factory=list)
    syncs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)   # ino -> (begin, end)
    dir_syncs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # folder -> (begin, end)
    acks: list[tuple[int, str]] = field(default_factory=list)       # (event index, line)
    unsynced_at_end: int = 0


def parse(log_path: str, root: str, acks_path: str) -> Recording:
    """Read a shim log into a :class:`Recording` (paths under ``root``)."""
    with open(log_path, "rb") as f:
        raw = f.read()
    rec = Recording(root=root)
    ns: dict[str, tuple[str, int]] = {root: ("d", 0)}     # live namespace: path -> (type, ino)
    fds: dict[int, int] = {}                               # fd -> ino
    dir_of_ino: dict[int, str] = {0: root}
    next_ino = 1
    pending_sync: dict[int, tuple[int, int | str]] = {}   # sync id -> (begin index, ino or folder)
    pos = 0
    i = 0
    acks_buf = b""
    while pos < len(raw):
        nl = raw.index(b"\n", pos)
        f = raw[pos:nl].decode().split("\t")
        pos = nl + 1
        op = f[0]
        if op == "O":
            fd, flags, existed, path = int(f[1]), int(f[2]), int(f[3]), f[4]
            cur = ns.get(path)
            if cur is None:
                if existed:
                    raise ValueError(f"{log_path}: event {i}: open of {path} that existed outside the record")
                if flags & O_DIRECTORY:
                    raise ValueError(f"{log_path}: event {i}: folder {path} opened before its mkdir")
                ino = next_ino
                next_ino += 1
                ns[path] = ("f", ino)
                rec.data_ops[ino] = []
                rec.entry_ops.append(Op(i, "create", ino=ino, path=path))
            else:
                ino = cur[1]
                if cur[0] == "f" and flags & O_TRUNC:
                    rec.data_ops[ino].append(Op(i, "T", ino=ino, length=0))
            fds[fd] = ino
        elif op == "W":
            fd, off, n = int(f[1]), int(f[2]), int(f[3])
            data = raw[pos:pos + n]
            pos += n
            ino = fds[fd]
            if ino not in rec.data_ops:
                raise ValueError(f"{log_path}: event {i}: write to folder fd {fd}")
            rec.data_ops[ino].append(Op(i, "W", ino=ino, off=off, length=n, data=data))
            if f[4] == acks_path:
                acks_buf += data
                while b"\n" in acks_buf:
                    line, _, acks_buf = acks_buf.partition(b"\n")
                    rec.acks.append((i, line.decode()))
        elif op == "T":
            ino = fds[int(f[1])]
            rec.data_ops[ino].append(Op(i, "T", ino=ino, length=int(f[2])))
        elif op == "F":
            ino = fds[int(f[1])]
            rec.data_ops[ino].append(Op(i, "F", ino=ino, mode=int(f[2]), off=int(f[3]), length=int(f[4])))
        elif op == "SB":
            ino = fds[int(f[1])]
            target: int | str = dir_of_ino[ino] if ino in dir_of_ino else ino
            pending_sync[int(f[2])] = (i, target)
        elif op == "SE":
            begin, target = pending_sync.pop(int(f[2]))
            if int(f[3]) == 0:
                if isinstance(target, str):
                    rec.dir_syncs.setdefault(target, []).append((begin, i))
                else:
                    rec.syncs.setdefault(target, []).append((begin, i))
        elif op == "R":
            old, new = f[1], f[2]
            if old == "-" or new == "-":
                raise ValueError(f"{log_path}: event {i}: rename across the recorded folder: {f}")
            moved = ns.pop(old)
            if moved[0] == "d":
                raise ValueError(f"{log_path}: event {i}: folder rename {old} is not modelled")
            ns[new] = moved
            rec.entry_ops.append(Op(i, "rename", ino=moved[1], path=old, new=new))
        elif op == "U":
            ns.pop(f[1])
            rec.entry_ops.append(Op(i, "unlink", path=f[1]))
        elif op == "RD":
            ns.pop(f[1])
            rec.entry_ops.append(Op(i, "rmdir", path=f[1]))
        elif op == "M":
            ino = next_ino
            next_ino += 1
            ns[f[1]] = ("d", ino)
            dir_of_ino[ino] = f[1]
            rec.entry_ops.append(Op(i, "mkdir", ino=ino, path=f[1]))
        elif op == "C":
            fds.pop(int(f[1]), None)
        elif op == "DUP":
            fds[int(f[2])] = fds[int(f[1])]
        else:
            raise ValueError(f"{log_path}: event {i}: unknown record {f!r}")
        i += 1
    rec.n = i
    return rec


@dataclass
class Crash:
    """One crash state: where, and the choices made for what was unsynced."""
    k: int
    files: dict[str, bytes]          # path -> content (paths under the root)
    dirs: list[str]
    lost_writes: int                 # unsynced data ops not kept whole
    desc: str


def _durable_before(spans: list[tuple[int, int]], k: int) -> int:
    """The latest sync start whose sync returned before ``k`` (-1: none)."""
    best = -1
    for begin, end in spans:
        if end < k and begin > best:
            best = begin
    return best


def _apply(buf: bytearray, op: Op, rng: random.Random | None, block: int, grow_zero: bool) -> bool:
    """Apply data op ``op`` to ``buf``; with ``rng``, whole, dropped or torn.
    Returns whether it was applied whole."""
    if op.kind == "T":
        if rng is not None and rng.random() < 0.5:
            return False
        if op.length < len(buf):
            del buf[op.length:]
        else:
            buf.extend(bytes(op.length - len(buf)))
        return True
    if op.kind == "F":
        if rng is not None and rng.random() < 0.5:
            return False
        end = op.off + op.length
        if op.mode & FALLOC_FL_PUNCH_HOLE:
            stop = min(end, len(buf))
            if stop > op.off:
                buf[op.off:stop] = bytes(stop - op.off)
        elif not op.mode & FALLOC_FL_KEEP_SIZE and end > len(buf):
            buf.extend(bytes(end - len(buf)))
        return True
    end = op.off + op.length
    fate = "keep" if rng is None else rng.choices(("keep", "drop", "tear"), (0.45, 0.2, 0.35))[0]
    if fate == "keep":
        pieces = [(op.off, end)]
    elif fate == "drop":
        pieces = []
    else:
        pieces = []
        start = op.off
        while start < end:
            stop = min(end, (start // block + 1) * block)
            if rng.random() < 0.5:
                pieces.append((start, stop))
            start = stop
    top = max((b for _a, b in pieces), default=0)
    if grow_zero:
        top = end
    if top > len(buf):
        buf.extend(bytes(top - len(buf)))
    for a, b in pieces:
        buf[a:b] = op.data[a - op.off:b - op.off]
    return fate == "keep"


def crash_state(rec: Recording, k: int, rng: random.Random, entry_mode: str = "prefix") -> Crash:
    """The files and folders a power loss before event ``k`` may leave."""
    block = rng.choice((512, 4096))
    # directory entries
    ops = [op for op in rec.entry_ops if op.i < k]

    def durable(op: Op) -> bool:
        folders = {os.path.dirname(op.path)}
        if op.kind == "rename":
            folders.add(os.path.dirname(op.new))
        return all(_durable_before(rec.dir_syncs.get(d, []), k) > op.i for d in folders)

    flags = [durable(op) for op in ops]
    loose = [j for j, d in enumerate(flags) if not d]
    if entry_mode == "prefix":
        keep_n = rng.randint(0, len(loose))
        kept = set(loose[:keep_n])
    else:
        kept = {j for j in loose if rng.random() < 0.5}
    ns: dict[str, tuple[str, int]] = {rec.root: ("d", 0)}
    for j, op in enumerate(ops):
        if not (flags[j] or j in kept):
            continue
        if op.kind in ("create", "mkdir"):
            ns[op.path] = ("f" if op.kind == "create" else "d", op.ino)
        elif op.kind == "rename":
            if op.path in ns:
                ns[op.new] = ns.pop(op.path)
        else:
            ns.pop(op.path, None)
    # keep only entries whose folders are there
    present = {p for p, (t, _i) in ns.items() if t == "d"}

    def reachable(p: str) -> bool:
        d = os.path.dirname(p)
        while d != rec.root and len(d) > len(rec.root):
            if d not in present:
                return False
            d = os.path.dirname(d)
        return True

    files: dict[str, bytes] = {}
    dirs = sorted(p for p in present if p != rec.root and reachable(p))
    lost = 0
    contents: dict[int, bytes] = {}
    for path, (t, ino) in ns.items():
        if t != "f" or not reachable(path):
            continue
        if ino not in contents:
            cut = _durable_before(rec.syncs.get(ino, []), k)
            buf = bytearray()
            for op in rec.data_ops[ino]:
                if op.i >= k:
                    break
                if op.i < cut:
                    _apply(buf, op, None, block, False)
                else:
                    whole = _apply(buf, op, rng, block, rng.random() < 0.3)
                    lost += not whole
            contents[ino] = bytes(buf)
        files[path] = contents[ino]
    return Crash(k, files, dirs, lost, f"k={k} block={block} entries={entry_mode} kept={sorted(kept)}")


def materialize(crash: Crash, root: str, dest: str) -> None:
    """Write ``crash`` under ``dest`` (``root`` in its paths becomes ``dest``)."""
    os.makedirs(dest, mode=0o700, exist_ok=True)
    for d in crash.dirs:
        os.makedirs(dest + d[len(root):], mode=0o700, exist_ok=True)
    for p, data in crash.files.items():
        fd = os.open(dest + p[len(root):], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


@dataclass
class Oracle:
    """What the workload had tried and had been told before a crash point."""
    tried: set[str]                 # every message id it tried to append (ever)
    acked: set[str]                 # acknowledged before k, no deletion of it tried since
    deleted: set[str]               # deletion acknowledged before k
    tasks: dict[str, set[str]]      # task -> statuses it may have (last acked, or tried after)
    done: bool


def oracle(rec: Recording, k: int) -> Oracle:
    tried: set[str] = set()
    acked: set[str] = set()
    deleted: set[str] = set()
    tasks: dict[str, set[str]] = {}
    done = False
    for i, line in rec.acks:
        word, *rest = line.split()
        if word == "TRY":
            tried.update(rest)
        if i >= k:
            continue
        if word == "M":
            acked.add(rest[0])
        elif word == "TRYDEL":
            acked.discard(rest[0])      # a deletion in flight may have reached the disk
        elif word == "D":
            acked.discard(rest[0])
            deleted.add(rest[0])
        elif word == "T":
            tasks[rest[0]] = {rest[1]}
        elif word == "TT":
            tasks[rest[0]].add(rest[1])
        elif word == "DONE":
            done = True
    return Oracle(tried, acked, deleted, tasks, done)
