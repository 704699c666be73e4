"""thread-effects: per-thread SQLite actors that run scheduled effects.

Every conversation thread owns its SQLite database and schedules effects — named
functions that run later, outside the model's turn.

The public API is re-exported here; see DESIGN.md and the README.
"""

from runtime.config import MAX_ATTEMPTS, RetentionPolicy, Settings
from runtime.effects import (
    EffectChanged,
    EffectDefinition,
    EffectRun,
    EffectStatus,
    RunChange,
    define_effect,
)
from runtime.errors import (
    DataDirLocked,
    EffectDefinitionError,
    EffectNotFound,
    EffectsError,
    InvalidDelay,
    InvalidEffectArgs,
    InvalidThreadId,
    RunNotFound,
    RunStateError,
    RuntimeClosed,
    SubscriptionOverflow,
    ThreadExists,
    ThreadNotFound,
    ThreadStorageError,
)
from runtime.frames import Subscription
from runtime.storage.base import ThreadInfo
from runtime.supervisor import Runtime, ThreadPage, validate_thread_id
from runtime.thread import Execution, RunPage, ThreadState

__all__ = [
    "MAX_ATTEMPTS",
    "DataDirLocked",
    "EffectChanged",
    "EffectDefinition",
    "EffectDefinitionError",
    "EffectNotFound",
    "EffectRun",
    "EffectStatus",
    "EffectsError",
    "Execution",
    "InvalidDelay",
    "InvalidEffectArgs",
    "InvalidThreadId",
    "RetentionPolicy",
    "RunChange",
    "RunNotFound",
    "RunPage",
    "RunStateError",
    "Runtime",
    "RuntimeClosed",
    "Settings",
    "Subscription",
    "SubscriptionOverflow",
    "ThreadExists",
    "ThreadInfo",
    "ThreadNotFound",
    "ThreadPage",
    "ThreadState",
    "ThreadStorageError",
    "define_effect",
    "validate_thread_id",
]
