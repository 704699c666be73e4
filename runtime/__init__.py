"""thread-effects: per-thread SQLite actors that run scheduled effects.

Every conversation thread owns its SQLite database and schedules effects — named
functions that run later, outside the model's turn.

The public API is re-exported here; see docs/design.md and the README. Importing this
package also registers the conversation layer (`runtime.conversation`) as a default
extension of every `Runtime` (see `runtime.extension`).
"""

from runtime.agents import AgentDefinition, define_agent
from runtime.config import MAX_ATTEMPTS, RetentionPolicy, Settings
from runtime.conversation import ConversationExtension  # registers the default layer
from runtime.effect_tools import (
    EffectToolContext,
    EffectToolDefinition,
    EffectToolSettings,
    ToolRunState,
    define_effect_tool,
    wrap_tools_for_run,
)
from runtime.effects import EffectDefinition, EffectRun, EffectStatus, RunAttempt, define_effect
from runtime.endpoints import ThreadEndpointDefinition, define_thread_endpoint
from runtime.errors import (
    AgentDefinitionError,
    AgentNotFound,
    DataDirLocked,
    EffectDefinitionError,
    EffectKeyBusy,
    EffectNotFound,
    EffectRecordLost,
    EffectResultError,
    EffectsError,
    InvalidArgument,
    InvalidDelay,
    InvalidEffectArgs,
    InvalidSchedule,
    InvalidThreadId,
    MessageNotFound,
    ModelNotAvailable,
    RunNotFound,
    RunStateError,
    RuntimeClosed,
    RuntimeStorageError,
    ScheduleNotFound,
    SubscriptionOverflow,
    ThreadExists,
    ThreadNotFound,
    ThreadPaused,
    ThreadStorageError,
    TooManyImmediateRuns,
    TurnFailed,
    TurnInProgress,
    TurnLeaseLost,
    TurnRunIdConflict,
)
from runtime.events import (
    EffectChanged,
    EffectRecordChanged,
    MessageCreated,
    RecordChange,
    RunChange,
    ScheduleChange,
    ScheduleChanged,
    ThreadDeleted,
)
from runtime.extension import Extension
from runtime.frames import Subscription
from runtime.hooks import HookDefinition, HookPoint, define_hook
from runtime.ids import validate_thread_id
from runtime.keys import canonical_json, default_effect_key, effect_marker, find_effect_markers
from runtime.messages import (
    Message,
    MessagePage,
    MessageRole,
    ToolCall,
    ToolResult,
    TurnResult,
)
from runtime.recurrence import Schedule, ScheduleState
from runtime.storage.base import ThreadInfo
from runtime.storage.records import (
    EffectRecord,
    EffectRecordPage,
    EffectRecordStatus,
    EffectRecordStore,
    InMemoryEffectStore,
    SqliteEffectStore,
)
from runtime.supervisor import RunsPage, Runtime, ThreadPage
from runtime.thread import Execution, RunPage, ScheduleCreated, Scheduled, ThreadState
from runtime.tools import ToolDefinition, define_tool

__all__ = [
    "MAX_ATTEMPTS",
    "AgentDefinition",
    "AgentDefinitionError",
    "AgentNotFound",
    "ConversationExtension",
    "DataDirLocked",
    "EffectChanged",
    "EffectDefinition",
    "EffectDefinitionError",
    "EffectKeyBusy",
    "EffectNotFound",
    "EffectRecord",
    "EffectRecordChanged",
    "EffectRecordLost",
    "EffectRecordPage",
    "EffectRecordStatus",
    "EffectRecordStore",
    "EffectResultError",
    "EffectRun",
    "EffectStatus",
    "EffectToolContext",
    "EffectToolDefinition",
    "EffectToolSettings",
    "EffectsError",
    "Execution",
    "Extension",
    "HookDefinition",
    "HookPoint",
    "InMemoryEffectStore",
    "InvalidArgument",
    "InvalidDelay",
    "InvalidEffectArgs",
    "InvalidSchedule",
    "InvalidThreadId",
    "Message",
    "MessageCreated",
    "MessageNotFound",
    "MessagePage",
    "MessageRole",
    "ModelNotAvailable",
    "RecordChange",
    "RetentionPolicy",
    "RunAttempt",
    "RunChange",
    "RunNotFound",
    "RunPage",
    "RunStateError",
    "RunsPage",
    "Runtime",
    "RuntimeClosed",
    "RuntimeStorageError",
    "Schedule",
    "ScheduleChange",
    "ScheduleChanged",
    "ScheduleCreated",
    "ScheduleNotFound",
    "ScheduleState",
    "Scheduled",
    "Settings",
    "SqliteEffectStore",
    "Subscription",
    "SubscriptionOverflow",
    "ThreadDeleted",
    "ThreadEndpointDefinition",
    "ThreadExists",
    "ThreadInfo",
    "ThreadNotFound",
    "ThreadPage",
    "ThreadPaused",
    "ThreadState",
    "ThreadStorageError",
    "TooManyImmediateRuns",
    "ToolCall",
    "ToolDefinition",
    "ToolResult",
    "ToolRunState",
    "TurnFailed",
    "TurnInProgress",
    "TurnLeaseLost",
    "TurnResult",
    "TurnRunIdConflict",
    "canonical_json",
    "default_effect_key",
    "define_agent",
    "define_effect",
    "define_effect_tool",
    "define_hook",
    "define_thread_endpoint",
    "define_tool",
    "effect_marker",
    "find_effect_markers",
    "validate_thread_id",
    "wrap_tools_for_run",
]
