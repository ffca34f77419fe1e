"""purgatory: durable delayed operations for data pipelines.

The engine, sans-IO: every call is told the time as ``int`` milliseconds (names end in ``_ms``)
and returns what happened; nothing here reads a clock, logs or does I/O, and ``import purgatory``
imports no trio and no Kafka. The trio service is :mod:`purgatory.service`, its HTTP client
:mod:`purgatory.client`, the clock layer :mod:`reaper`, the Spark side :mod:`spark_bridge`.

Kafka's request purgatory, its names in snake_case:

* :class:`Timer` -- the hierarchical timing wheel: ``add``, ``advance_clock``,
  ``next_expiration_ms``;
* :class:`TimerTask` -- something due at ``deadline_ms``; subclass it and override ``run``;
* :class:`DelayedOperation` -- waits for a condition until its deadline, completed exactly once;
* :class:`DelayedOperationPurgatory` -- operations watched by key (``try_complete_else_watch``,
  ``check_and_complete``, ``cancel_for_key``) and expired by a timer;
* :class:`TimerStatistics` -- what ``Timer.statistics()`` returns;
* :class:`PurgatoryStatistics` -- what ``DelayedOperationPurgatory.statistics()`` returns.

Flink's keyed timers and state TTL:

* :class:`KeyedTimers` -- processing- and event-time timers keyed by (scope, key, namespace,
  timestamp), with per-scope watermarks;
* :class:`TimeDomain` -- processing time or event time;
* :class:`FiredTimer` -- a timer that fired, as ``KeyedTimers.poll`` returns it;
* :class:`KeyedTimersStatistics` -- what ``KeyedTimers.statistics()`` returns;
* :class:`TtlState` -- a map whose values expire ``ttl_ms`` after their last access;
* :class:`TtlConfig` -- its ``ttl_ms`` and the three policies below;
* :class:`UpdateType` -- which accesses refresh a value's last access time;
* :class:`StateVisibility` -- whether an expired value not cleaned up yet may be read;
* :class:`CleanupStrategy` -- expired values removed by timers (exact) or incrementally;
* :class:`TtlEntry` -- a stored value with its access and expiration times;
* :class:`TtlStatistics` -- what ``TtlState.statistics()`` returns.

Key groups (Flink's formulas, bit for bit):

* :func:`key_group_for` -- the key group of a scope;
* :func:`key_group_range_for_operator` -- the key groups one operator owns;
* :func:`operator_index_for_key_group` -- the operator that owns a key group;
* :data:`MAX_KEY_GROUPS` -- the largest number of key groups.

The engine, what the service runs per partition:

* :class:`Engine` -- declarative operations over signals and watermarks: ``register``,
  ``signal``, ``advance_watermark``, ``cancel``, ``advance_clock``;
* :class:`EngineConfig` -- its tuning and limits;
* :class:`OperationSpec` -- what a client registers;
* :class:`Condition` -- when an operation's keys satisfy it: all, any or a count;
* :class:`Registration` -- the answer to ``Engine.register``;
* :class:`RegistrationStatus` -- what ``Engine.register`` did (pending, duplicate, ...);
* :class:`Outcome` -- the single terminal result of an operation, delivered as a callback;
* :class:`OutcomeKind` -- completed, expired or cancelled;
* :class:`EngineStatistics` -- what ``Engine.statistics()`` returns;
* :data:`MAX_TIME_MS` -- the latest time the engine accepts (9999-12-31, in epoch ms).

Durability:

* :func:`snapshot_engine` -- an engine's state as bytes;
* :func:`restore_engine` -- an engine rebuilt from those bytes;
* :class:`JournalRecorder` -- records every input an engine applies (``Engine(journal=...)``);
* :func:`replay_journal` -- applies recorded inputs, deciding the same outcomes again.

Errors (one tree; third-party errors are translated into it at the boundary):

* :class:`PurgatoryError` -- the base of every error raised on purpose;
* :class:`UsageError` -- a bad argument (a ``ValueError``), named in the message;
* :class:`ConflictError` -- an operation id reused with another body (a usage error);
* :class:`LimitError` -- a configured limit would be exceeded (a usage error);
* :class:`SizeLimitError` -- a callback would carry too many bytes (a limit error);
* :class:`BadRecordError` -- a record could not be decoded or validated;
* :class:`ConfigError` -- a setting is missing or invalid, named in the message;
* :class:`TransportError` -- a broker, socket or HTTP peer failed.
"""

from purgatory._core import (
    MAX_KEY_GROUPS,
    MAX_TIME_MS,
    BadRecordError,
    CleanupStrategy,
    Condition,
    ConfigError,
    ConflictError,
    DelayedOperation,
    DelayedOperationPurgatory,
    Engine,
    EngineConfig,
    EngineStatistics,
    FiredTimer,
    JournalRecorder,
    KeyedTimers,
    KeyedTimersStatistics,
    LimitError,
    OperationSpec,
    Outcome,
    OutcomeKind,
    PurgatoryError,
    PurgatoryStatistics,
    Registration,
    RegistrationStatus,
    SizeLimitError,
    StateVisibility,
    TimeDomain,
    Timer,
    TimerStatistics,
    TimerTask,
    TransportError,
    TtlConfig,
    TtlEntry,
    TtlState,
    TtlStatistics,
    UpdateType,
    UsageError,
    key_group_for,
    key_group_range_for_operator,
    operator_index_for_key_group,
    replay_journal,
    restore_engine,
    snapshot_engine,
)

__all__ = [
    "MAX_KEY_GROUPS",
    "MAX_TIME_MS",
    "BadRecordError",
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
    "JournalRecorder",
    "KeyedTimers",
    "KeyedTimersStatistics",
    "LimitError",
    "OperationSpec",
    "Outcome",
    "OutcomeKind",
    "PurgatoryError",
    "PurgatoryStatistics",
    "Registration",
    "RegistrationStatus",
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
    "key_group_for",
    "key_group_range_for_operator",
    "operator_index_for_key_group",
    "replay_journal",
    "restore_engine",
    "snapshot_engine",
]
