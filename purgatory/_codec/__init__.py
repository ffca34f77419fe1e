"""Bytes <-> records: the versioned wire formats of purgatory (shared by the service and the
Spark bridge; standard library only, imports only :mod:`purgatory._core`).

Four topics, one JSON object per record, each with ``"v": 1`` and a ``"type"``; the Kafka
message key is the record's scope in UTF-8:

* requests: ``register`` and ``cancel`` -> :func:`decode_request` / :func:`encode_request`, and
  in-band ``watermark`` records (:func:`decode_requests_record` reads all three);
* signals: ``signal`` and ``watermark`` -> :func:`decode_signal` / :func:`encode_signal`;
* callbacks: ``callback`` -> :func:`encode_callback` / :func:`decode_callback`;
* dead letters: ``dead_letter`` -> :func:`encode_dead_letter`.

Payloads are any JSON value and are held as canonical compact JSON text (see
:func:`canonical_json`). Every rejection is a :class:`RecordError` (a ``BadRecordError``) whose
message starts with the path of the offending field (``keys[2]: must be ...``) or with
``(record)``, and whose ``field`` attribute holds that path. The JSON Schemas of the formats
(:func:`schema`) document every field.
"""

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
from purgatory._codec._outbound import (
    DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES,
    decode_callback,
    encode_callback,
    encode_dead_letter,
    outcome_id,
)
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
from purgatory._codec._schemas import SCHEMA_NAMES, schema

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES",
    "FORMAT_VERSION",
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
    "decode_callback",
    "decode_request",
    "decode_requests_record",
    "decode_signal",
    "encode_callback",
    "encode_dead_letter",
    "encode_request",
    "encode_signal",
    "message_key",
    "outcome_id",
    "schema",
]
