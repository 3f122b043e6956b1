"""Atomic JSON checkpoints.

A checkpoint file is one framed line (the same frame as every log line)::

    {"x":"<16 hex of xxh3_64(rest)>","body":<JSON>}\\n

so a flipped byte is caught even where it still parses as JSON. It is replaced
as a whole: temp file in the same folder (0600), write, fsync, rename over the
old one, fsync of the folder. A crash leaves the old or the new, never a mix.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from typing import Any

import xxhash

from .errors import CorruptStateCheckpointError, DurabilityError
from .events import ensure_private_dir, fsync_dir

__all__ = ["AtomicStore"]

_HEAD = b'{"x":"'
_BODY_KEY = b'","body":'
_PREFIX_LEN = len(_HEAD) + 16 + len(_BODY_KEY)


class AtomicStore:
    """One JSON checkpoint file at ``path``, replaced atomically.

    ``write(obj)`` stores any JSON value (str keys, finite numbers) and is
    durable when it returns; ``read()`` returns it, ``default`` if the file
    does not exist, and raises :class:`CorruptStateCheckpointError` naming
    the path and offset for a truncated, damaged or unparseable file -- never
    partial data. Thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._lock = threading.Lock()

    def exists(self) -> bool:
        """True if the checkpoint file exists."""
        return os.path.exists(self.path)

    @staticmethod
    def encode(obj: Any) -> bytes:
        """The checkpoint bytes for ``obj``; ``TypeError``/``ValueError`` if it
        is not JSON (NaN, non-str keys, lone surrogates, other types)."""
        try:
            body = json.dumps(obj, ensure_ascii=False, allow_nan=False,
                              separators=(",", ":")).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"checkpoint body: string is not valid UTF-8 ({exc.reason} at {exc.start})") from None
        rest = b',"body":' + body + b"}"
        return _HEAD + xxhash.xxh3_64_hexdigest(rest).encode("ascii") + b'"' + rest + b"\n"

    def write(self, obj: Any, *, durable: bool = True) -> None:
        """Replace the checkpoint with ``obj``: temp file (0600) in the same
        folder, write, fsync, rename, fsync of the folder. Durable on return.
        With ``durable=False`` the two fsyncs are left out: still old-or-new
        after a process crash (rename is atomic), not after a power loss.
        :class:`DurabilityError` naming the path if any step fails (the old
        checkpoint is then still in place)."""
        data = self.encode(obj)
        folder = os.path.dirname(self.path)
        with self._lock:
            ensure_private_dir(folder)
            fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(self.path) + ".", suffix=".tmp", dir=folder)
            try:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    if durable:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, self.path)
            except OSError as exc:
                _unlink_quietly(tmp)
                raise DurabilityError(f"checkpoint write of {self.path} failed: {exc}") from exc
            except BaseException:
                _unlink_quietly(tmp)
                raise
            if durable:
                fsync_dir(folder)

    def read(self, default: Any = None) -> Any:
        """Return the stored JSON value, or ``default`` if the file is missing.
        :class:`CorruptStateCheckpointError` (path, offset) if it is damaged."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return default
        return self.decode(data, path=self.path)

    @staticmethod
    def decode(data: bytes, *, path: str = "") -> Any:
        """Verify and parse checkpoint bytes (see :meth:`read`)."""
        head = data[:len(_HEAD)]
        if head != _HEAD[:len(head)] or (len(data) >= _PREFIX_LEN and data[22:_PREFIX_LEN] != _BODY_KEY):
            raise CorruptStateCheckpointError("checkpoint has a bad header (not a rune_fast checkpoint)",
                                              path=path, offset=0)
        if len(data) < _PREFIX_LEN + 2:
            raise CorruptStateCheckpointError(
                f"checkpoint truncated: {len(data)} bytes", path=path, offset=len(data))
        if not data.endswith(b"}\n"):
            raise CorruptStateCheckpointError(
                "checkpoint truncated: it does not end with '}\\n'", path=path, offset=len(data))
        rest = data[23:-1]
        if xxhash.xxh3_64_hexdigest(rest).encode("ascii") != data[6:22]:
            raise CorruptStateCheckpointError(
                "checkpoint checksum mismatch (damaged bytes)", path=path, offset=_PREFIX_LEN)
        body = data[_PREFIX_LEN:-2]
        # json, not orjson: orjson turns integers beyond 64 bits into floats.
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            pos: int | None = getattr(exc, "pos", None)
            if pos is None:
                pos = getattr(exc, "start", 0)
            raise CorruptStateCheckpointError(
                f"checkpoint body does not parse: {exc}", path=path, offset=_PREFIX_LEN + pos) from None

    def remove(self) -> None:
        """Delete the checkpoint if it exists (durably)."""
        with self._lock:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                return
            fsync_dir(os.path.dirname(self.path))

    def __repr__(self) -> str:
        return f"AtomicStore({self.path!r})"


def check_path(field: str, value: Any) -> None:
    """TypeError naming ``field`` unless ``value`` is a str path (a str or
    an os.PathLike giving one), ValueError if it is empty: checked before a
    repository creates any folder."""
    if not isinstance(value, (str, os.PathLike)) or not isinstance(os.fspath(value), str):
        raise TypeError(f"{field}: expected a path (str or os.PathLike), got {type(value).__name__}")
    if not os.fspath(value):
        # ("" would be the current folder: a store made wherever the process stands)
        raise ValueError(f"{field}: the path is empty")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
