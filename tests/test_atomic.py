"""AtomicStore: atomic replacement, checksummed bodies, loud damage."""
from __future__ import annotations

import os
import stat

import pytest

from rune_fast.atomic import AtomicStore
from rune_fast.errors import CorruptStateCheckpointError


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def test_missing_file_gives_default(tmp_path):
    store = AtomicStore(tmp_path / "hot" / "cp.json")
    assert store.read() is None
    assert store.read(default={"empty": True}) == {"empty": True}
    assert not store.exists()


def test_write_read_round_trip_and_modes(tmp_path):
    store = AtomicStore(tmp_path / "hot" / "cp.json")
    value = {"tasks": [{"title": "é ☃ \n", "n": 2**70, "f": 0.1}], "ok": True, "none": None}
    store.write(value)
    assert store.read() == value
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "hot").st_mode) == 0o700
    store.write([1, 2, 3])
    assert store.read() == [1, 2, 3]
    # no temp files left behind
    assert os.listdir(tmp_path / "hot") == ["cp.json"]


def test_refuses_non_json(tmp_path):
    store = AtomicStore(tmp_path / "cp.json")
    with pytest.raises(ValueError):
        store.write({"x": float("nan")})
    with pytest.raises(ValueError):
        store.write({"x": "\ud800"})
    with pytest.raises(TypeError):
        store.write({"x": object()})
    assert not store.exists()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("cut", [0, 1, 10, 25, 40, -2, -1])
def test_truncated_checkpoint_is_loud(tmp_path, cut):
    store = AtomicStore(tmp_path / "cp.json")
    store.write({"tasks": list(range(20)), "name": "checkpoint"})
    data = _read(store.path)
    _write(store.path, data[:cut] if cut >= 0 else data[:len(data) + cut])
    with pytest.raises(CorruptStateCheckpointError) as info:
        store.read()
    assert info.value.path == store.path
    assert store.path in str(info.value)
    assert info.value.offset is not None


def test_every_flipped_byte_is_detected(tmp_path):
    store = AtomicStore(tmp_path / "cp.json")
    store.write({"a": [1, 2, 3], "b": "text"})
    data = _read(store.path)
    for i in range(len(data)):
        for bit in (0x01, 0x20):
            damaged = bytearray(data)
            damaged[i] ^= bit
            _write(store.path, damaged)
            with pytest.raises(CorruptStateCheckpointError):
                store.read()


def test_flip_that_still_parses_is_detected(tmp_path):
    store = AtomicStore(tmp_path / "cp.json")
    store.write({"count": 1234})
    data = _read(store.path).replace(b"1234", b"1235")
    _write(store.path, data)
    with pytest.raises(CorruptStateCheckpointError, match="checksum"):
        store.read()


def test_plain_json_file_is_not_accepted(tmp_path):
    path = tmp_path / "cp.json"
    path.write_text('{"tasks": []}')
    with pytest.raises(CorruptStateCheckpointError) as info:
        AtomicStore(path).read()
    assert info.value.offset == 0


def test_failed_write_keeps_old_checkpoint(tmp_path, monkeypatch):
    store = AtomicStore(tmp_path / "cp.json")
    store.write({"v": 1})

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    from rune_fast.errors import DurabilityError
    with pytest.raises(DurabilityError, match="cp.json"):
        store.write({"v": 2})
    monkeypatch.undo()
    assert store.read() == {"v": 1}
    assert os.listdir(tmp_path) == ["cp.json"]


def test_remove(tmp_path):
    store = AtomicStore(tmp_path / "cp.json")
    store.write({})
    store.remove()
    store.remove()
    assert store.read() is None
