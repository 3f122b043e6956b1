"""A read-only viewer of a state directory that holds only a legacy
checkpoint (``hot/conversation_messages.json``) shows its messages, the
first of each id, in order, without importing or writing anything; a
writer's open then imports it as before, and the viewer's refresh follows."""
from __future__ import annotations

import json
import os

import pytest

from rune_fast.conversation_state import ConversationStateRepository, ReadStatus
from rune_fast.errors import CorruptStateCheckpointError


def _legacy(root, items) -> str:
    hot = root / "hot"
    hot.mkdir(parents=True)
    path = hot / "conversation_messages.json"
    path.write_text(json.dumps(items))
    return str(path)


def _files(root) -> dict[str, int]:
    return {os.path.relpath(os.path.join(d, n), root): os.path.getsize(os.path.join(d, n))
            for d, _dirs, names in os.walk(root) for n in names}


def test_a_viewer_shows_a_legacy_checkpoint_and_writes_nothing(tmp_path):
    items = [{"msg_id": f"m{i}", "channel_id": "c" if i % 2 else "d", "content": f"Grüße {i}",
              "ts": 1.0 + i, "role": "user"} for i in range(6)]
    items.append(dict(items[2], content="a later copy of m2"))      # the first of each id wins
    _legacy(tmp_path, {"messages": items})
    before = _files(tmp_path)
    with ConversationStateRepository(tmp_path, read_only=True) as viewer:
        assert len(viewer) == 6
        assert [m.msg_id for m in viewer.window("c", 10)] == ["m1", "m3", "m5"]
        assert [m.content for m in viewer.window("d", 10)] == ["Grüße 0", "Grüße 2", "Grüße 4"]
        read = viewer.get_message("m4")
        assert read.status is ReadStatus.FOUND_VERIFIED and read.record.content == "Grüße 4"
        assert [h.record.msg_id for h in viewer.search("GRÜSSE 3")] == ["m3"]
        assert viewer.verify().ok
        assert _files(tmp_path) == before                               # nothing written
        with ConversationStateRepository(tmp_path) as writer:          # a writer imports it
            assert len(writer) == 6
        assert not os.path.exists(tmp_path / "hot" / "conversation_messages.json")
        viewer.refresh()
        assert [m.msg_id for m in viewer.window("c", 10)] == ["m1", "m3", "m5"]


def test_a_damaged_legacy_checkpoint_is_named_to_a_viewer(tmp_path):
    path = _legacy(tmp_path, [{"msg_id": "m1", "channel_id": "c", "content": "x", "ts": 1.0}])
    with open(path, "a") as f:
        f.write("}")
    with pytest.raises(CorruptStateCheckpointError) as e:
        ConversationStateRepository(tmp_path, read_only=True)
    assert e.value.path == path
