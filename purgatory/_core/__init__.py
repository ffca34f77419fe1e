"""The sans-IO core: told the time as int milliseconds, never reads a clock, never does I/O.

Only the standard library is imported here (an import-linter contract checks it).
"""

from purgatory._core._errors import (
    BadRecordError,
    ConfigError,
    ConflictError,
    InvariantError,
    LimitError,
    PurgatoryError,
    SizeLimitError,
    TransportError,
    UsageError,
)
from purgatory._core.durability.entries import (
    AdvanceEntry,
    CancelEntry,
    JournalEntry,
    RegisterEntry,
    SignalEntry,
    WatermarkEntry,
)
from purgatory._core.durability.journal import (
    JournalRecorder,
    decode_entry,
    encode_entry,
    replay_journal,
)
from purgatory._core.durability.snapshot import (
    SNAPSHOT_VERSION,
    restore_engine,
    snapshot_engine,
)
from purgatory._core.engine.engine import Engine
from purgatory._core.engine.engine_types import (
    EngineConfig,
    EngineStatistics,
    Registration,
    RegistrationStatus,
)
from purgatory._core.engine.model import (
    Condition,
    OperationSpec,
    Outcome,
    OutcomeKind,
    SignalFact,
)
from purgatory._core.engine.validate import MAX_TIME_MS
from purgatory._core.flink.key_groups import (
    MAX_KEY_GROUPS,
    java_string_hash,
    key_group_for,
    key_group_range_for_operator,
    murmur_hash,
    operator_index_for_key_group,
)
from purgatory._core.flink.keyed_timers import (
    FiredTimer,
    KeyedTimers,
    KeyedTimersStatistics,
    TimeDomain,
)
from purgatory._core.flink.ttl_state import (
    CleanupStrategy,
    StateVisibility,
    TtlConfig,
    TtlEntry,
    TtlState,
    TtlStatistics,
    UpdateType,
)
from purgatory._core.wheel.operation import DelayedOperation
from purgatory._core.wheel.purgatory import (
    DelayedOperationPurgatory,
    PurgatoryStatistics,
)
from purgatory._core.wheel.timer import (
    Timer,
    TimerStatistics,
    TimerTask,
)

__all__ = [
    "MAX_KEY_GROUPS",
    "MAX_TIME_MS",
    "SNAPSHOT_VERSION",
    "AdvanceEntry",
    "BadRecordError",
    "CancelEntry",
    "CleanupStrategy",
    "Condition",
    "ConfigError",
    "ConflictError",
    "DelayedOperation",
    "DelayedOperationPurgatory",
    "Engine",
    "EngineConfig",
    "EngineStatistics",
    "FiredTimer",
    "InvariantError",
    "JournalEntry",
    "JournalRecorder",
    "KeyedTimers",
    "KeyedTimersStatistics",
    "LimitError",
    "OperationSpec",
    "Outcome",
    "OutcomeKind",
    "PurgatoryError",
    "PurgatoryStatistics",
    "RegisterEntry",
    "Registration",
    "RegistrationStatus",
    "SignalEntry",
    "SignalFact",
    "SizeLimitError",
    "StateVisibility",
    "TimeDomain",
    "Timer",
    "TimerStatistics",
    "TimerTask",
    "TransportError",
    "TtlConfig",
    "TtlEntry",
    "TtlState",
    "TtlStatistics",
    "UpdateType",
    "UsageError",
    "WatermarkEntry",
    "decode_entry",
    "encode_entry",
    "java_string_hash",
    "key_group_for",
    "key_group_range_for_operator",
    "murmur_hash",
    "operator_index_for_key_group",
    "replay_journal",
    "restore_engine",
    "snapshot_engine",
]
