"""The service's settings (service layer concept: configuration; the one reader of the environment).

Configuration flows one way: Helm values -> ``PURGATORY_*`` environment variables -> one frozen
:class:`Settings` -> constructor arguments. This module lists the fields (each one's variable,
kind, default and help) and the rules between fields; how a field is read from its variable, a
secret from its file, and every problem gathered into one :class:`ConfigError` is
:mod:`purgatory.service.settings_env`.

From settings to a component's configuration there is one way, by layer:

* A service component's configuration is built by a classmethod ``from_settings(settings)``
  of its configuration class, beside it: the module that uses a setting is the one that says
  which setting it reads. :class:`~purgatory.service.kafka.config.KafkaClientConfig`,
  :class:`~purgatory.service.kafka.clients.KafkaTransport`,
  :class:`~purgatory.service.dispatch.reply_to.ReplyToPolicy` and
  :class:`~purgatory.service.dispatch.follow.FollowerConfig` do. Every service stage sits above
  this module in the import layers, so each may import :class:`Settings`.
* The core's and the codec's configurations (:class:`~purgatory._core.EngineConfig`,
  :class:`~purgatory._codec.Limits`) may not import the service, so they are built here, by
  :meth:`Settings.to_engine_config` and :meth:`Settings.to_limits`; a value the core refuses
  becomes a :class:`ConfigError`.

The composition root (:mod:`purgatory.service.app`) is to call these, not build a
configuration from the fields itself.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from purgatory._codec import Limits
from purgatory._core import MAX_TIME_MS, ConfigError, EngineConfig, TtlConfig, UsageError
from purgatory._kafka_options import HOST_PORTS, OPTIONS, kafka_connection_problems
from purgatory.service.settings_env import (
    Bool,
    Choice,
    Int,
    ListOf,
    Text,
    coerce_fields,
    env_name,
    int_setting,
    read_environ,
    redacted_repr,
    setting,
)
from purgatory.service.settings_env import describe as _describe

__all__ = [
    "Delivery",
    "LogFormat",
    "LogLevel",
    "SaslMechanism",
    "SecurityProtocol",
    "Settings",
    "env_name",
]

_DAY_MS = 86_400_000
_MAX_BYTES = 1 << 30
# The field table's vocabulary, kept short: the kinds and field declarations of settings_env.
_Bool = Bool
_Choice = Choice
_Int = Int
_List = ListOf
_Text = Text
_setting = setting
_int = int_setting


class SecurityProtocol(enum.StrEnum):
    """How the Kafka clients talk to the brokers."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(enum.StrEnum):
    """How the Kafka clients authenticate with SASL."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


class LogLevel(enum.StrEnum):
    """The lowest level of the log events written."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class Delivery(enum.StrEnum):
    """How outcomes are delivered: ``acknowledged`` (write-ahead journal, callbacks by
    acknowledgement: at least once, de-duplicated by ``id``) or ``transactional`` (journal,
    callbacks and input offsets in one Kafka transaction per partition: exactly once for
    ``read_committed`` readers)."""

    ACKNOWLEDGED = "acknowledged"
    TRANSACTIONAL = "transactional"


class LogFormat(enum.StrEnum):
    """How log events are written: JSON lines, or aligned text for a terminal."""

    JSON = "json"
    CONSOLE = "console"


_TOKEN = re.compile(r"[^\s,]+")  # one word: no whitespace, no comma
_TOPIC = re.compile(r"(?!\.{1,2}$)[a-zA-Z0-9._-]{1,249}")
_TOPIC_PREFIX = re.compile(r"[a-zA-Z0-9._-]{0,249}")
_HTTP_TOKEN = re.compile(r"[\x21-\x7e]{16,4096}")  # visible ASCII: it travels in a header
_CLIENT_TOKEN = r"[a-zA-Z0-9._-]{1,64}=[\x21-\x2b\x2d-\x7e]{16,4096}"  # name=token, no comma
_CLIENT_TOKENS = re.compile(rf"{_CLIENT_TOKEN}(,{_CLIENT_TOKEN})*")
_ANY = re.compile(r".+", re.DOTALL)

_BASE_URL = re.compile(r"https?://[^\s,/?#]+(/[^\s,?#]*)?")
_WORD = _Text(_TOKEN, "a non-empty word without spaces or commas")
_PATH = _Text(_TOKEN, "a file path without spaces or commas")
_TOPIC_NAME = _Text(_TOPIC, "a Kafka topic name: 1 to 249 characters from a-z A-Z 0-9 . _ -")


@dataclass(frozen=True, slots=True, kw_only=True, repr=False)
class Settings:
    """Every setting of the service, validated; build it with :meth:`Settings.from_env`.

    Each field's documentation (meaning and unit) is its ``help`` text below, and its default is
    the value beside it; :meth:`describe` lists both with the environment variable's name.

    Raises:
        ConfigError: (a ``ValueError``) naming each variable whose value is invalid.
    """

    http_host: str = _setting(
        "127.0.0.1", _WORD, "Address the HTTP API listens on (0.0.0.0 for every interface)."
    )
    http_port: int = _int(8080, 1, 65535, "TCP port of the HTTP API and of /metrics.")
    kafka_bootstrap_servers: str = _setting(
        "localhost:9092",
        _Text(HOST_PORTS, "a comma-separated list of host:port", squeeze=True),
        "Kafka brokers to bootstrap from, as a comma-separated list of host:port.",
    )
    kafka_client_id: str = _setting("purgatory", _WORD, "Client id the Kafka clients send.")
    kafka_group_id: str = _setting(
        "purgatory", _WORD, "Kafka consumer group that splits the partitions between replicas."
    )
    kafka_security_protocol: SecurityProtocol = _setting(  # noqa: RUF009 (returns a field())
        SecurityProtocol.PLAINTEXT, _Choice(SecurityProtocol), "Protocol to talk to the brokers."
    )
    kafka_sasl_mechanism: SaslMechanism | None = _setting(  # noqa: RUF009 (returns a field())
        None, _Choice(SaslMechanism), "SASL mechanism; required with the SASL_* protocols."
    )
    kafka_sasl_username: str | None = _setting(
        None, _Text(_ANY, "a non-empty string", strip=False), "SASL user (PLAIN and SCRAM)."
    )
    kafka_sasl_password: str | None = _setting(
        None, _Text(_ANY, "a non-empty string", strip=False), "SASL password.", secret=True
    )
    kafka_ssl_cafile: str | None = _setting(
        None, _PATH, "PEM file of the CA that signed the brokers' certificates (SSL protocols)."
    )
    kafka_ssl_certfile: str | None = _setting(
        None, _PATH, "PEM file of this client's certificate, for mutual TLS."
    )
    kafka_ssl_keyfile: str | None = _setting(
        None, _PATH, "PEM file of this client's private key, for mutual TLS."
    )
    kafka_static_partitions: tuple[int, ...] | None = _setting(
        None,
        _List(_Int(0, 2**31 - 1), "partition numbers"),
        "Partitions this replica owns (for example its pod ordinal's share); "
        "unset: join the consumer group instead.",
    )
    peer_urls: tuple[str, ...] | None = _setting(
        None,
        _List(_Text(_BASE_URL, "an http(s) URL"), "http:// or https:// base URLs"),
        "Every replica's base URL, in pod-ordinal order (ordinal mode): partition p belongs to"
        " replica p * replicas // partitions, and a request for a scope another replica owns"
        " is forwarded to it; unset: no forwarding.",
    )
    replica_ordinal: int | None = _setting(
        None, _Int(0, 9_999), "This replica's index in PURGATORY_PEER_URLS (its pod ordinal)."
    )
    advertised_url: str | None = _setting(
        None,
        _Text(_BASE_URL, "an http(s) URL"),
        "This replica's base URL as the other replicas reach it (group mode): the group shares"
        " every owner's URL, and a request for a scope another replica owns is forwarded to it;"
        " unset: this replica neither forwards nor takes forwarded requests by URL.",
    )
    kafka_group_instance_id: str | None = _setting(
        None,
        _WORD,
        "Static group membership (group mode): a stable id per replica (the pod name) keeps its"
        " partitions across a restart within the session timeout, without a rebalance.",
    )
    topic_requests: str = _setting(
        "purgatory.requests", _TOPIC_NAME, "Topic of registrations and cancels (key = scope)."
    )
    topic_signals: str = _setting(
        "purgatory.signals", _TOPIC_NAME, "Topic of signals and watermarks (key = scope)."
    )
    topic_callbacks: str = _setting(
        "purgatory.callbacks", _TOPIC_NAME, "Topic the outcomes are delivered to."
    )
    topic_dead_letters: str = _setting(
        "purgatory.dead-letters", _TOPIC_NAME, "Topic of rejected records, with the reason."
    )
    topic_changelog: str = _setting(
        "purgatory.changelog",
        _TOPIC_NAME,
        "Topic of the journal: every input applied, per partition (the source of truth).",
    )
    topic_snapshots: str = _setting(
        "purgatory.snapshots",
        _TOPIC_NAME,
        "Topic of the partitions' snapshots (chunks and manifests); they bound the replay.",
    )
    topic_partitions: int | None = _setting(
        None,
        _Int(1, 10_000),
        "Partitions every topic keyed by scope has: the service refuses to start unless the"
        " requests, signals, changelog and snapshots topics all have this many (unset: they"
        " must only agree), and stops taking inputs if one changes while it runs; purgatory"
        " dev creates its topics with it (4 when unset).",
    )
    max_keys_per_operation: int = _int(1000, 1, 1_000_000, "Watch keys one operation may list.")
    max_key_bytes: int = _int(512, 1, 1 << 20, "Longest watch key, in UTF-8 bytes.")
    max_scope_bytes: int = _int(512, 1, 1 << 20, "Longest scope, in UTF-8 bytes.")
    max_op_id_bytes: int = _int(256, 1, 1 << 20, "Longest operation id, in UTF-8 bytes.")
    max_payload_bytes: int = _int(
        65536, 0, _MAX_BYTES, "Largest payload of a signal or an operation, in bytes."
    )
    max_record_bytes: int = _int(
        1_048_576, 1024, _MAX_BYTES, "Largest Kafka record accepted or produced, in bytes."
    )
    max_signal_bytes_per_operation: int = _int(
        524_288,
        1,
        _MAX_BYTES,
        "Signal payload bytes one operation's callback may carry; the signal or registration"
        " that would cross it is refused.",
    )
    max_request_bytes: int = _int(4_194_304, 1024, _MAX_BYTES, "Largest HTTP body, in bytes.")
    max_batch: int = _int(10_000, 1, 1_000_000, "Items in one HTTP batch request.")
    max_deadline_ahead_ms: int = _int(
        366 * _DAY_MS, 1, MAX_TIME_MS, "Furthest a deadline may be in the future, in ms."
    )
    max_pending: int = _int(10_000_000, 1, 1 << 40, "Pending operations per replica.")
    max_pending_per_scope: int = _int(1_000_000, 1, 1 << 40, "Pending operations per scope.")
    max_pending_bytes_per_scope: int = _int(
        0, 0, 1 << 40, "Estimated bytes a scope's pending operations may hold (0: no limit)."
    )
    max_remembered_signals_per_scope: int = _int(
        0,
        0,
        1 << 40,
        "Signals a scope may remember for operations registered later (0: no limit); a signal"
        " a pending operation awaits is always taken.",
    )
    max_remembered_bytes_per_scope: int = _int(
        0, 0, 1 << 40, "Estimated bytes a scope's remembered signals may hold (0: no limit)."
    )
    max_pending_per_client: int = _int(
        0, 0, 1 << 40, "Pending operations one client may hold, across scopes (0: no limit)."
    )
    max_pending_bytes_per_client: int = _int(
        0,
        0,
        1 << 40,
        "Estimated bytes of memory one client's pending operations may hold (0: no limit).",
    )
    max_memory_bytes: int = _int(
        0,
        0,
        1 << 40,
        "Memory budget of a replica, in estimated bytes with a 64 MiB base: registrations and"
        " signals nobody awaits are refused (429) beyond it (0: none; else more than 64 MiB).",
    )
    max_wait_ms: int = _int(60_000, 0, 3_600_000, "Longest HTTP long poll, in ms.")
    tick_ms: int = _int(1, 1, 60_000, "Resolution of the timing wheel, in ms.")
    wheel_size: int = _int(512, 2, 1 << 20, "Buckets per level of the timing wheel.")
    signal_ttl_ms: int = _int(
        7 * _DAY_MS, 1, MAX_TIME_MS, "How long a signal is remembered after its last write, in ms."
    )
    outcome_ttl_ms: int = _int(
        _DAY_MS, 1, MAX_TIME_MS, "How long an outcome is remembered for idempotent retries, in ms."
    )
    purge_interval: int = _int(
        1000, 0, 2**31, "Completed operations that may linger in watch lists before a purge."
    )
    max_fire_per_step: int = _int(
        10_000, 1, 2**31, "Overdue timers fired per step on restore (bounded catch-up)."
    )
    reaper_max_sleep_ms: int = _int(
        200, 1, 60_000, "Longest the reaper sleeps without re-reading the clock, in ms."
    )
    executor_capacity: int = _int(
        1024, 1, 1 << 24, "Batches the completion executor queues before intake waits."
    )
    kafka_linger_ms: int = _int(
        0,
        0,
        1_000,
        "How long the producer waits to fill a batch of callbacks, in ms (the callbacks of"
        " one poll reach it together, so 0 batches them without adding latency).",
    )
    kafka_fetch_max_wait_ms: int = _int(
        10,
        0,
        60_000,
        "How long the broker may hold a fetch with no new data, in ms: on the embedded broker"
        " it bounds signal latency; a real Kafka answers as data arrives (raise it to save"
        " idle CPU).",
    )
    journal: bool = _setting(
        True,
        _Bool(),
        "Journal every input to the changelog topic before answering or delivering, and"
        " restore each partition from it (false: state is in memory only, and a restart loses"
        " the pending operations).",
    )
    delivery: Delivery = _setting(  # noqa: RUF009 (returns a field())
        Delivery.ACKNOWLEDGED,
        _Choice(Delivery, any_case=True),
        "acknowledged: journal first, then each callback by the broker's acknowledgement (at"
        " least once: after a crash, consumers drop repeats by id; any broker). transactional:"
        " each partition's journal record, the callbacks and dead letters it released and the"
        " input offsets in one Kafka transaction (exactly once for read_committed readers;"
        " needs Apache Kafka 2.5+; checked at start).",
    )
    transaction_timeout_ms: int = _int(
        60_000,
        1_000,
        900_000,
        "How long the broker lets a transaction stay open before it aborts it, in ms"
        " (transactional delivery): how long a replica that stopped mid-transaction can hold"
        " read_committed readers of its partitions back. At most the broker's"
        " transaction.max.timeout.ms (15 minutes by default).",
    )
    journal_wait_ms: int = _int(
        5_000,
        1,
        600_000,
        "How long an HTTP write waits for the broker to acknowledge its journal entry, in ms:"
        " past it the write answers 503 with Retry-After (it stays applied and becomes durable"
        " once acknowledged), and /readyz and the metrics report the journal stalled.",
    )
    snapshot_interval_ms: int = _int(
        60_000,
        0,
        86_400_000,
        "How often a partition whose journal grew is snapshotted, in ms, by a process beside"
        " the service that tails the journal (0: never; a restore then replays the whole"
        " journal).",
    )
    reply_to_timeout_ms: int = _int(
        30_000,
        0,
        3_600_000,
        "How long a callback to an operation's reply_to topic is retried before it is"
        " dead-lettered, in ms.",
    )
    reply_to_topics: tuple[str, ...] | None = _setting(
        None,
        _List(_TOPIC_NAME, "Kafka topic names"),
        "Topics an operation's reply_to may name, exactly, beside the callbacks topic and the"
        " topics under PURGATORY_REPLY_TO_PREFIX (unset: none). Names starting with '_' and"
        " the service's own topics are refused whatever it says.",
    )
    reply_to_prefix: str = _setting(
        "purgatory.reply.",
        _Text(
            _TOPIC_PREFIX,
            "0 to 249 characters from a-z A-Z 0-9 . _ - (empty: no prefix)",
        ),
        "An operation's reply_to may name any topic starting with it (empty: no prefix, only"
        " the callbacks topic and PURGATORY_REPLY_TO_TOPICS). Names starting with '_' and the"
        " service's own topics are refused whatever it says.",
    )
    api_token: str | None = _setting(
        None,
        _Text(_HTTP_TOKEN, "16 to 4096 visible ASCII characters", strip=False),
        "The token of the client named 'default': the API then requires"
        " 'Authorization: Bearer <token>'.",
        secret=True,
    )
    api_tokens: str | None = _setting(
        None,
        _Text(
            _CLIENT_TOKENS,
            "a comma-separated list of name=token (names of 1 to 64 characters from"
            " a-z A-Z 0-9 . _ -, tokens of 16 to 4096 visible ASCII characters but comma)",
            squeeze=True,
        ),
        "Named clients' tokens, name=token,...: each name labels its requests' logs and"
        " metrics and carries its own quotas.",
        secret=True,
    )
    allow_unauthenticated: bool = _setting(
        False,
        _Bool(),
        "Serve the API without a token on an address beyond loopback (without it, a replica"
        " with no token configured refuses to listen there).",
    )
    log_level: LogLevel = _setting(  # noqa: RUF009 (returns a field())
        LogLevel.INFO, _Choice(LogLevel, any_case=True), "Lowest level of the log events written."
    )
    log_format: LogFormat = _setting(  # noqa: RUF009 (returns a field())
        LogFormat.JSON, _Choice(LogFormat, any_case=True), "json (lines) or console (text)."
    )
    shutdown_grace_ms: int = _int(
        10_000,
        0,
        3_600_000,
        "Time a graceful stop may take (HTTP requests, executor drain), in ms.",
    )
    hand_over_ms: int = _int(
        15_000,
        0,
        3_600_000,
        "Group mode: how long a graceful stop first serves on while the other replicas warm"
        " its partitions and take them over, in ms (0: leave at once; they restore cold).",
    )

    def __post_init__(self) -> None:
        problems = coerce_fields(self)
        if not problems:
            problems = _cross_field_problems(self)
        if problems:
            raise ConfigError("\n".join(problems))

    def client_tokens(self) -> dict[str, str]:
        """``{client name: token}`` from ``api_tokens`` and ``api_token`` (named ``default``)."""
        tokens = dict(_named_tokens(self.api_tokens))
        if self.api_token is not None:
            tokens.setdefault("default", self.api_token)
        return tokens

    def __repr__(self) -> str:
        return redacted_repr(self)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> Settings:
        """Read the settings from ``environ`` (usually ``os.environ``).

        Args:
            environ: the environment; only ``PURGATORY_*`` names are looked at.
            overrides: field values (Python values, not text) that win over the environment,
                for example from command-line options; validated like the rest.

        Returns:
            The validated settings.

        Raises:
            ConfigError: listing, one per line, every variable with an invalid value, every
                unknown ``PURGATORY_*`` variable and every unknown override.
        """
        return cls(**read_environ(cls, environ, overrides), **overrides)

    @classmethod
    def env_names(cls) -> list[str]:
        """Every environment variable read, in field order (``*_FILE`` after its secret)."""
        return [name for name, _, _ in cls.describe()]

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """``(variable, default as text ('' when unset), help)`` for every variable read."""
        return _describe(cls)

    def to_engine_config(self) -> EngineConfig:
        """The core engine's configuration from these settings.

        Raises:
            ConfigError: if the engine rejects a value (the ranges here are meant to prevent it).
        """
        try:
            return EngineConfig(
                tick_ms=self.tick_ms,
                wheel_size=self.wheel_size,
                purge_interval=self.purge_interval,
                signal_ttl=TtlConfig(ttl_ms=self.signal_ttl_ms),
                outcome_ttl_ms=self.outcome_ttl_ms,
                max_fire_per_step=self.max_fire_per_step,
                max_pending=self.max_pending,
                max_pending_per_scope=self.max_pending_per_scope,
                max_signal_bytes_per_operation=self.max_signal_bytes_per_operation,
                # 0 means no limit: the engine's default and largest value, 1 << 40.
                max_pending_bytes_per_scope=self.max_pending_bytes_per_scope or 1 << 40,
                max_remembered_signals_per_scope=self.max_remembered_signals_per_scope or 1 << 40,
                max_remembered_bytes_per_scope=self.max_remembered_bytes_per_scope or 1 << 40,
            )
        except UsageError as exc:
            raise ConfigError(f"engine settings: {exc}") from exc

    def to_limits(self) -> Limits:
        """The codec's record limits from these settings.

        Raises:
            ConfigError: if the codec rejects a value (``PURGATORY_MAX_PAYLOAD_BYTES=0``,
                which the settings accept and the codec's ``Limits`` does not).
        """
        try:
            return Limits(
                max_keys_per_operation=self.max_keys_per_operation,
                max_key_bytes=self.max_key_bytes,
                max_scope_bytes=self.max_scope_bytes,
                max_op_id_bytes=self.max_op_id_bytes,
                max_payload_bytes=self.max_payload_bytes,
                max_record_bytes=self.max_record_bytes,
            )
        except UsageError as exc:
            raise ConfigError(f"record limit settings: {exc}") from exc


_TOPIC_FIELDS = tuple(
    f.name for f in fields(Settings) if f.name.startswith("topic_") and f.name != "topic_partitions"
)


def _cross_field_problems(settings: Settings) -> list[str]:
    """What the fields, each valid alone, break together: one line per rule broken."""
    env = env_name
    # One validator for the connection settings, shared with KafkaClientConfig and the
    # Spark bridge; it names the PURGATORY_KAFKA_* variables and reads the SSL files.
    problems = kafka_connection_problems(
        {option: getattr(settings, "kafka_" + option) for option in OPTIONS}
    )
    problems.extend(_reply_to_problems(settings))
    topics: dict[str, str] = {}
    for name in _TOPIC_FIELDS:
        topic = getattr(settings, name)
        if topic in topics:
            problems.append(
                f"{env(name)}: must differ from {env(topics[topic])}, both are {topic!r}"
            )
        topics.setdefault(topic, name)
    if (settings.peer_urls is None) != (settings.replica_ordinal is None):
        problems.append(
            f"{env('replica_ordinal')}: set it together with {env('peer_urls')} (both, or neither)"
        )
    elif (
        settings.peer_urls is not None
        and settings.replica_ordinal is not None
        and settings.replica_ordinal >= len(settings.peer_urls)
    ):
        problems.append(
            f"{env('replica_ordinal')}: must index {env('peer_urls')}"
            f" ({len(settings.peer_urls)} URLs), got {settings.replica_ordinal}"
        )
    problems.extend(_auth_problems(settings))
    if settings.delivery is Delivery.TRANSACTIONAL and not settings.journal:
        problems.append(
            f"{env('delivery')}: transactional delivery writes the journal in its"
            f" transactions; it needs {env('journal')}=true"
        )
    if settings.max_pending_per_scope > settings.max_pending:
        problems.append(
            f"{env('max_pending_per_scope')}: must not exceed {env('max_pending')}"
            f" ({settings.max_pending}), got {settings.max_pending_per_scope}"
        )
    if settings.max_payload_bytes >= settings.max_record_bytes:
        problems.append(
            f"{env('max_payload_bytes')}: must be less than {env('max_record_bytes')}"
            f" ({settings.max_record_bytes}), got {settings.max_payload_bytes}"
        )
    if settings.max_signal_bytes_per_operation >= settings.max_record_bytes:
        problems.append(
            f"{env('max_signal_bytes_per_operation')}: must be less than"
            f" {env('max_record_bytes')} ({settings.max_record_bytes}),"
            f" got {settings.max_signal_bytes_per_operation}"
        )
    return problems


def _reply_to_problems(settings: Settings) -> list[str]:
    """What the reply_to allow-list names but the service refuses whatever it says: Kafka's
    internal topics (a leading '_') and the service's own topics (the callbacks topic is
    always allowed, so naming it is harmless)."""
    env = env_name
    problems = []
    if settings.reply_to_prefix.startswith("_"):
        problems.append(
            f"{env('reply_to_prefix')}: must not start with '_' (Kafka's internal topics"
            f" are never a reply_to), got {settings.reply_to_prefix!r}"
        )
    own = {getattr(settings, name): name for name in _TOPIC_FIELDS if name != "topic_callbacks"}
    for topic in settings.reply_to_topics or ():
        if topic.startswith("_"):
            problems.append(
                f"{env('reply_to_topics')}: must not name {topic!r}: names starting with '_'"
                " (Kafka's internal topics) are never a reply_to"
            )
        elif topic in own:
            problems.append(
                f"{env('reply_to_topics')}: must not name {topic!r}, the service's own"
                f" {env(own[topic])}"
            )
    return problems


def _named_tokens(api_tokens: str | None) -> list[tuple[str, str]]:
    """``api_tokens`` as (name, token) pairs, in the order written."""
    if api_tokens is None:
        return []
    return [
        (name, token) for name, _, token in (item.partition("=") for item in api_tokens.split(","))
    ]


def _auth_problems(settings: Settings) -> list[str]:
    """Who may use the API: distinct client names and tokens, and no open API beyond loopback
    unless asked for."""
    env = env_name
    problems = []
    if settings.api_tokens is not None:
        pairs = _named_tokens(settings.api_tokens)
        names = [name for name, _ in pairs]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            problems.append(f"{env('api_tokens')}: names a client twice: {repeated}")
        if settings.api_token is not None and "default" in names:
            problems.append(
                f"{env('api_token')}: is the client 'default', which {env('api_tokens')}"
                " names as well"
            )
        tokens = [token for _, token in pairs]
        if len(set(tokens)) < len(tokens) or settings.api_token in tokens:
            problems.append(f"{env('api_tokens')}: two clients share a token")
    open_api = settings.api_tokens is None and settings.api_token is None
    if open_api and not settings.allow_unauthenticated and not _loopback(settings.http_host):
        problems.append(
            f"{env('api_token')}: required to listen on {settings.http_host} (beyond loopback):"
            f" set it or {env('api_tokens')}, or set {env('allow_unauthenticated')}=true to"
            " serve an open API on purpose"
        )
    return problems


def _loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
