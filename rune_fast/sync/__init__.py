"""Multi-device transcripts: hybrid logical clocks, ops, the transcript fold,
provider-valid repair, request renderers and retention (SPEC section 7).

A conversation turn is an *op* ``(op_id, hlc, payload)``. Every device that
holds the same set of ops folds them into a byte-identical transcript, whatever
order they arrived in, and :func:`repair` turns any transcript (or any window
of one) into a message list that the Anthropic Messages API and the OpenAI Chat
Completions API both accept once rendered with :func:`to_anthropic` /
:func:`to_openai`.

Data path::

    ops (OpRecord | 3-tuple | mapping)  --as_op-->  OpRecord
      --fold(ops, conversation_id)-->   [Turn] ordered by (hlc, op_id)
      --LastN(n)-->                     newest n turns
      --repair-->                       [{"role": "user"|"assistant"|"tool_result", ...}]
      --to_anthropic / to_openai-->     provider request ``messages``

The provider rules that :func:`repair` and the renderers guarantee, and that
:func:`check_repaired`, :func:`check_anthropic` and :func:`check_openai`
verify, are written down once, in ``docs/PROVIDER_RULES.md``; every violation
string these checkers return starts with the rule id from that page.

Surfaces (:class:`Surface`): the conversation surface is an event stream keyed
by ``op_id`` whose entries are independent, so it tolerates retention
(``LastN``). The routing surface is an event stream that is replayed in order
(each entry updates a running estimate), so it forbids any trimming. Entity
surfaces are keyed by content (the same fact written twice is one entry) and
forbid trimming too: dropping an entity loses state, not history.

Decisions a caller should know:

- Identity is the op: a resent op (same ``op_id``) is one turn; two ops with
  byte-identical payloads are two turns. If two *different* versions of one
  ``op_id`` meet, the one with the smaller ``(hlc, canonical JSON of the
  payload)`` wins on every device. A tombstone (payload ``{"deleted": true}``)
  removes its ``op_id`` whatever the order of arrival.
- ``system`` turns are not part of a transcript; user/assistant turns whose
  text is blank (and that carry no tool calls) are skipped by :func:`repair`,
  because both providers reject or ignore empty messages.
- :func:`repair` keeps a leading assistant message (OpenAI accepts it);
  :func:`to_anthropic` drops everything before the first user message rather
  than invent a user turn.
- Malformed input raises ``TypeError``/``ValueError`` naming the op, message
  or tool call; nothing is silently replaced.

Nothing here does I/O and nothing holds module-level mutable state; the only
objects with state are :class:`HlcClock` (thread-safe) and :class:`SyncState`.

The package follows the data path, one module a stage: ``clock`` (Hlc,
HlcClock), ``ops`` (OpRecord, as_op, surfaces, tombstones), ``fold`` (turns,
canonical JSON, the fold), ``repair``, ``renderers`` (the provider requests and
their checkers), ``retention`` (LastN, compact, SyncState) and ``bridge``
(ops to and from the repository's record dicts).
"""
from __future__ import annotations

from .clock import Hlc, HlcClock
from .ops import DEFAULT_CONVERSATION, OpRecord, Surface, as_op, is_tombstone, tombstone_op
from .fold import Role, Turn, canonical_json, fold, transcript_hash
from .repair import check_repaired, repair
from .renderers import check_anthropic, check_openai, to_anthropic, to_openai
from .retention import LastN, SyncState, compact, resume_messages
from .bridge import op_from_record_dict, record_dict_from_op, record_stamp, turns_from_records  # noqa: F401

__all__ = [
    "DEFAULT_CONVERSATION",
    "Hlc",
    "HlcClock",
    "Surface",
    "OpRecord",
    "as_op",
    "Role",
    "Turn",
    "fold",
    "repair",
    "to_anthropic",
    "to_openai",
    "check_repaired",
    "check_anthropic",
    "check_openai",
    "LastN",
    "compact",
    "SyncState",
    "resume_messages",
    "canonical_json",
    "transcript_hash",
    "is_tombstone",
    "tombstone_op",
    "op_from_record_dict",
    "record_dict_from_op",
    "turns_from_records",
]

