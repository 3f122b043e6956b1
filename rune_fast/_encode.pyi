# Types of rune_fast._encode, compiled from csrc/_encode.pyx (kept by hand: a
# change of a signature there changes it here). ``record_type`` is
# rune_fast.records.ConversationMessageRecord; the callables are the Python
# paths of rune_fast.codec that the compiled one hands a record to.
from collections.abc import Callable
from typing import Any, TypeVar

import numpy.typing as npt
from typing_extensions import Buffer, Self, disjoint_base

_R = TypeVar("_R")
_T = TypeVar("_T")

#: Set by rune_fast.codec to its MAX_RECORD_BYTES.
max_record_bytes: int

def encode_messages(msgs: list[Any], record_type: type[_R],
                    slow: Callable[[_R], tuple[bytes, str, bytes]],
                    calls_json: Callable[[_R], tuple[bytes, bytes]],
                    defer_hash: bool = False, hash_job: bool | None = None,
                    ) -> tuple[list[bytes], Any, list[bytes]]: ...
def hash_canonical(hashes: list[Any]) -> list[str]: ...

#: whether payload hashes are computed in C without the GIL (else by hashlib)
compiled_sha256: bool
def _use_compiled_sha256(on: bool) -> bool: ...
def _float_repr(v: float) -> str | None: ...

@disjoint_base
class HashJob:
    def __new__(cls, hashes: list[Any] | None = None, threaded: bool = True) -> Self: ...
    def result(self) -> list[Any]: ...

@disjoint_base
class FrameBuffer:
    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    # the buffer protocol (C slots: Python names them only from 3.12)
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

def frame_messages(bodies: list[bytes], order: list[int], seq0: int,
                   into: FrameBuffer | None = None) -> tuple[bytes | FrameBuffer, list[int]]: ...
def message_envelopes(keys: list[bytes], hashes: list[str] | HashJob, order: list[int],
                      ts_json: bytes) -> bytes: ...
def cool_columns(data: Buffer, starts: npt.ArrayLike,
                 calls_texts: Callable[[bytes], tuple[bytes, bytes] | None],
                 ) -> tuple[list[int], dict[str, tuple[bytes, bytes] | bytes]]: ...
def record_from_line(line: Buffer, record_type: type[_R],
                     calls_from_json: Callable[[bytes], tuple[Any, ...] | None],
                     ) -> tuple[_R, int] | None: ...
def json_safe(v: object) -> bool: ...
def own_calls_setup(record_type: type[_R], fallback: Callable[[_R], _R],
                    value: Callable[[Any], Any]) -> None: ...
def own_calls(recs: list[_T]) -> list[_T]: ...
#: own_calls as a C function, for compiled callers (_index.repo_window_setup)
OWN_CALLS_C: object

class _Default: ...

#: the default of the message constructor's ``msg_id`` and ``ts``
MISSING: _Default

def message_init_setup(record_type: type[Any], new_id: Callable[[], str], now: Callable[[], float],
                       slow: Callable[..., tuple[Any, ...]]) -> None: ...
def message_init(self: Any, msg_id: str | _Default = ..., ts: float | _Default = ..., role: str = "user",
                 content: str = "", channel_id: str = "", task_id: str = "",
                 token_estimate: int | None = None, tool_calls: Any = (), tool_call_id: str = "",
                 origin: str = "", hlc: str = "") -> None: ...
