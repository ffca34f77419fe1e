"""Bytes <-> records: the versioned wire formats of purgatory (shared by the service and the
Spark bridge; standard library only, imports only :mod:`purgatory._core`).

Four topics, one JSON object per record, each with ``"v": 1`` and a ``"type"``; the Kafka
message key is the record's scope in UTF-8:

* requests: ``register`` and ``cancel`` -> :func:`decode_request` / :func:`encode_request`, and
  in-band ``watermark`` records (:func:`decode_requests_record` reads all three);
* signals: ``signal`` and ``watermark`` -> :func:`decode_signal` / :func:`encode_signal`;
* callbacks: ``callback`` -> :func:`encode_callback` / :func:`decode_callback`;
* dead letters: ``dead_letter`` -> :func:`encode_dead_letter`, with :func:`dead_letter_key`
  (every letter fits the record limit whatever it wraps: see ``_dead_letters``).

Payloads are any JSON value and are held as canonical compact JSON text (see
:func:`canonical_json`). Every rejection is a :class:`RecordError` (a ``BadRecordError``) whose
message starts with the path of the offending field (``keys[2]: must be ...``) or with
``(record)``, and whose ``field`` attribute holds that path. The JSON Schemas of the formats
(:func:`schema`) document every field.
"""

from purgatory._codec._dead_letters import (
    DEAD_LETTER_KEY_BYTES,
    DEFAULT_MAX_DEAD_LETTER_KEY_BYTES,
    DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    dead_letter_budget,
    dead_letter_key,
    encode_dead_letter,
)
from purgatory._codec._inbound import (
    DEFAULT_LIMITS,
    FORMAT_VERSION,
    decode_request,
    decode_requests_record,
    decode_signal,
    encode_request,
    encode_signal,
    message_key,
)
from purgatory._codec._json import canonical_json
from purgatory._codec._outbound import decode_callback, encode_callback, outcome_id
from purgatory._codec._records import (
    CancelRequest,
    Limits,
    RecordError,
    RegisterRequest,
    Request,
    SignalInput,
    SignalRecord,
    WatermarkRecord,
)
from purgatory._codec._retry import APPLIED_HEADER, RETRY_HEADER, is_retry
from purgatory._codec._schemas import SCHEMA_NAMES, schema

__all__ = [
    "APPLIED_HEADER",
    "DEAD_LETTER_KEY_BYTES",
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_DEAD_LETTER_KEY_BYTES",
    "DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES",
    "DEFAULT_MAX_RECORD_BYTES",
    "FORMAT_VERSION",
    "RETRY_HEADER",
    "SCHEMA_NAMES",
    "CancelRequest",
    "Limits",
    "RecordError",
    "RegisterRequest",
    "Request",
    "SignalInput",
    "SignalRecord",
    "WatermarkRecord",
    "canonical_json",
    "dead_letter_budget",
    "dead_letter_key",
    "decode_callback",
    "decode_request",
    "decode_requests_record",
    "decode_signal",
    "encode_callback",
    "encode_dead_letter",
    "encode_request",
    "encode_signal",
    "is_retry",
    "message_key",
    "outcome_id",
    "schema",
]
