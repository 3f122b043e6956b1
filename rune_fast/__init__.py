"""rune_fast: a durable, fast store for LLM agent conversation history and task state.

The public names of ``rune_fast.records``, ``rune_fast.conversation_state``,
``rune_fast.composition`` and ``rune_fast.sync`` are re-exported here.
"""
from .errors import (
    CorruptStateCheckpointError,
    DurabilityError,
    FramingError,
    IllegalTaskTransitionError,
    ReadOnlyStoreError,
    RecordTooLargeError,
    RecoveryWarning,
    RuneError,
    StateLockedError,
    StoreClosedError,
    UnknownTaskError,
)
from .records import (
    TASK_STATUSES,
    TASK_TRANSITIONS,
    ConversationMessageRecord,
    OrchestrationRecord,
    TaskStateRecord,
    new_id,
)
from .conversation_state import (
    CompactionReport,
    ConversationStateRepository,
    MessageRead,
    ReadStatus,
    SearchHit,
    TaskStateRepository,
    VerifyReport,
)
from .composition import AUTHORITY_KINDS, build_conversation_state, compose_conversation_state
from .sync import (
    DEFAULT_CONVERSATION,
    Hlc,
    HlcClock,
    LastN,
    OpRecord,
    Role,
    Turn,
    fold,
    repair,
    to_anthropic,
    to_openai,
)

__version__ = "0.1.0"

__all__ = [
    "AUTHORITY_KINDS",
    "DEFAULT_CONVERSATION",
    "TASK_STATUSES",
    "TASK_TRANSITIONS",
    "CompactionReport",
    "ConversationMessageRecord",
    "ConversationStateRepository",
    "CorruptStateCheckpointError",
    "DurabilityError",
    "FramingError",
    "Hlc",
    "HlcClock",
    "IllegalTaskTransitionError",
    "LastN",
    "MessageRead",
    "OpRecord",
    "OrchestrationRecord",
    "ReadOnlyStoreError",
    "ReadStatus",
    "RecordTooLargeError",
    "RecoveryWarning",
    "Role",
    "RuneError",
    "SearchHit",
    "StateLockedError",
    "StoreClosedError",
    "TaskStateRecord",
    "TaskStateRepository",
    "Turn",
    "UnknownTaskError",
    "VerifyReport",
    "build_conversation_state",
    "compose_conversation_state",
    "fold",
    "new_id",
    "repair",
    "to_anthropic",
    "to_openai",
    "__version__",
]
