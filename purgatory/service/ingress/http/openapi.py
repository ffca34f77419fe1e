"""The OpenAPI document of the HTTP API (service layer).

Its paths come from the route table (:data:`purgatory.service.ingress.http.routes.ROUTES`), which
also
serves them, and its bodies from the records' JSON Schemas (:func:`purgatory._codec.schema`),
so the HTTP bodies are documented by the very schemas that describe the Kafka records. Each
route documents its own answers and those of its kind (a body: 400, 408, 413, 422; a token:
401, 429, 503), every one with its media type and headers. The generated document is kept
in the repository (``purgatory/service/ingress/http/openapi.json``, checked by a test to match this
builder)
and served at ``/openapi.json``. Regenerate it with ``python -m
purgatory.service.ingress.http.openapi``.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from typing import Any

from purgatory._codec import schema
from purgatory.service.ingress.http.routes import ROUTES
from purgatory.service.ingress.http.table import (
    METHOD_NOT_ALLOWED,
    NOT_FOUND_PATH,
    Answer,
    ApiRoute,
    Param,
)
from purgatory.service.ops.overview import MAX_DEADLINES, MAX_SCOPES
from purgatory.service.ops.recent import MAX_RECENT
from purgatory.service.ownership.life import PartitionState

__all__ = ["build_openapi", "load_openapi"]

_VERSION = "0.1.0"


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with its ``#/$defs/...`` references replaced by what they point to."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _defs(record: dict[str, Any]) -> dict[str, Any]:
    defs = record.get("$defs", {})
    return defs if isinstance(defs, dict) else {}


def _body_schema(record: dict[str, Any], kind: str) -> dict[str, Any]:
    """The record's schema for one ``type``, with the ``v``/``type`` envelope made optional."""
    defs = _defs(record)
    body: dict[str, Any] = _inline(defs[kind], defs)
    body["required"] = [r for r in body.get("required", []) if r not in ("v", "type")]
    return body


def _parameter(param: Param) -> dict[str, Any]:
    schema: dict[str, Any] = (
        {"type": "integer", "minimum": param.minimum}
        if param.integer
        else {"type": "string", "minLength": 1}
    )
    return {
        "name": param.name,
        "in": "query",
        "required": param.required,
        "description": param.description,
        "schema": schema,
    }


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _response(answer: Answer) -> dict[str, Any]:
    if answer.schema is not None:
        schema = _ref("schemas", answer.schema)
    elif answer.media_type == "application/json":
        schema = {}
    else:
        schema = {"type": "string"}
    response: dict[str, Any] = {
        "description": answer.description,
        "content": {answer.media_type: {"schema": schema}},
    }
    if answer.headers:
        response["headers"] = {name: _ref("headers", name) for name in answer.headers}
    return response


def _operation(route: ApiRoute) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": route.handler.__name__, "summary": route.summary}
    if route.description is not None:
        operation["description"] = route.description
    if route.params:
        operation["parameters"] = [_parameter(param) for param in route.params]
    if route.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref("schemas", route.body)}},
        }
    operation["responses"] = {str(a.status): _response(a) for a in route.documented}
    if not route.auth:
        operation["security"] = []  # open whatever the document's default
    return operation


def _paths() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return paths


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


_STRING = {"type": "string"}
#: A partition's states in ``/readyz`` and the overview (dropped ones are not listed).
_PARTITION_STATES = [s.value for s in PartitionState if s is not PartitionState.DROPPED]
_INTEGER = {"type": "integer"}
_OUTCOME_OR_NULL = {"oneOf": [_ref("schemas", "Callback"), {"type": "null"}]}
_REGISTRATION_STATUS = {"enum": ["pending", "completed", "duplicate", "rearmed"]}


def _batch(name: str, item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [name],
        "properties": {name: {"type": "array", "items": _ref("schemas", item)}},
    }


def _schemas() -> dict[str, Any]:
    request, signal, callback = schema("request"), schema("signal"), schema("callback")
    return {
        "Register": _body_schema(request, "register"),
        "RegisterBatch": _batch("operations", "Register"),
        "Signal": _body_schema(signal, "signal"),
        "SignalBatch": _batch("signals", "Signal"),
        "Watermark": _body_schema(signal, "watermark"),
        "WatermarkBatch": _batch("watermarks", "Watermark"),
        "Callback": _inline(
            {k: v for k, v in callback.items() if k != "$defs"},
            _defs(callback),
        ),
        "Registration": _object(
            ["status", "scope", "op_id", "outcome"],
            status=_REGISTRATION_STATUS,
            scope=_STRING,
            op_id=_STRING,
            outcome=_OUTCOME_OR_NULL,
        ),
        "RegisterResults": _object(
            ["results"],
            results={
                "type": "array",
                "description": "One per operation, in order: its registration and"
                " `http_status`, or `http_status` and an `error`.",
                "items": _object(
                    ["http_status"],
                    http_status=_INTEGER,
                    status=_REGISTRATION_STATUS,
                    scope=_STRING,
                    op_id=_STRING,
                    outcome=_OUTCOME_OR_NULL,
                    error=_STRING,
                ),
            },
        ),
        "PendingPage": _object(
            ["scope", "operations", "next_cursor", "truncated"],
            scope=_STRING,
            operations={
                "type": "array",
                "items": _object(
                    ["op_id", "keys", "deadline_ms"],
                    op_id=_STRING,
                    keys={"type": "array", "items": _STRING},
                    deadline_ms=_INTEGER,
                    time_domain={"enum": ["processing_time", "event_time"]},
                    condition={"enum": ["all", "any", "count"]},
                    missing={
                        "type": "array",
                        "items": _STRING,
                        "description": "Its keys no remembered signal answers now.",
                    },
                    still_needed={
                        "type": "integer",
                        "minimum": 0,
                        "description": "How many of the missing keys must still signal.",
                    },
                ),
            },
            next_cursor={
                "type": ["string", "null"],
                "description": "The `cursor` of the next page; null on the last page.",
            },
            truncated={"type": "boolean", "description": "Whether a next page exists."},
        ),
        "OperationStatus": _object(
            ["status", "scope", "op_id"],
            status={"enum": ["pending", "completed", "expired", "cancelled"]},
            scope=_STRING,
            op_id=_STRING,
            outcome=_OUTCOME_OR_NULL,
        ),
        "Cancelled": _object(
            ["status", "outcome"],
            status={"const": "cancelled"},
            outcome=_ref("schemas", "Callback"),
        ),
        "SignalsAccepted": _object(
            ["accepted", "completed"], accepted=_INTEGER, completed=_INTEGER
        ),
        "WatermarksAccepted": _object(["accepted", "moved"], accepted=_INTEGER, moved=_INTEGER),
        "Health": _object(["status"], status={"const": "ok"}),
        "Readiness": _object(
            ["ready"],
            ready={"type": "boolean"},
            partitions={
                "type": "object",
                "additionalProperties": _object(
                    ["state"],
                    state={"enum": _PARTITION_STATES},
                    restore_records=_INTEGER,
                    restore_seconds={"type": "number"},
                    fenced=_INTEGER,
                    reason={
                        "type": "string",
                        "description": "Why it is not serving: a restore's error while it"
                        " waits to try again, a fence, a hand-over.",
                    },
                ),
            },
            topics={
                "type": "object",
                "description": "The partition count of each topic keyed by scope, as last seen.",
                "additionalProperties": _INTEGER,
            },
            inputs_stopped={
                "type": ["string", "null"],
                "description": "Why no input is taken (a topic's partition count changed while"
                " the service ran; it must be restarted), null while they are.",
            },
            journal=_object(
                ["state", "unacknowledged_seconds"],
                state={
                    "enum": ["ok", "stalled", "off"],
                    "description": "`stalled` once the oldest journal entry the broker has not"
                    " acknowledged has waited PURGATORY_JOURNAL_WAIT_MS (writes answer 503 with"
                    " Retry-After; the replica stays ready), `off` without a journal.",
                },
                unacknowledged_seconds={
                    "type": "number",
                    "description": "How long that entry has waited (0: none waits).",
                },
            ),
        ),
        "Overview": _overview_schema(),
        "OpenApi": _object(["openapi", "info", "paths"], openapi=_STRING),
        "Error": _object(
            ["error"],
            error=_object(
                ["status", "message"],
                status=_INTEGER,
                field={"type": ["string", "null"], "description": "The field that was wrong."},
                message=_STRING,
            ),
        ),
    }


def _list(item: dict[str, Any], most: int, description: str) -> dict[str, Any]:
    return {"type": "array", "maxItems": most, "items": item, "description": description}


def _overview_schema() -> dict[str, Any]:
    count = {"type": "integer", "minimum": 0}
    partition = {"type": "integer", "minimum": -1}
    text_or_null = {"type": ["string", "null"]}
    return _object(
        [
            "now_ms",
            "ready",
            "partitions",
            "pending",
            "scope_count",
            "scopes",
            "deadlines",
            "computed_ms",
            "compute_ms",
            "complete",
            "outcomes",
            "outcomes_total",
            "dead_letters",
            "dead_letters_total",
        ],
        now_ms=_INTEGER,
        ready={"type": "boolean"},
        partitions={
            "type": "object",
            "description": "The partitions held, as in `Readiness`.",
            "additionalProperties": _object(
                ["state"],
                state={"enum": _PARTITION_STATES},
                restore_records=_INTEGER,
                restore_seconds={"type": "number"},
            ),
        },
        pending=count,
        scope_count=count,
        scopes=_list(
            _object(
                ["scope", "pending", "partition"], scope=_STRING, pending=count, partition=partition
            ),
            MAX_SCOPES,
            "The busiest scopes, most pending first.",
        ),
        deadlines=_list(
            _object(
                ["scope", "op_id", "deadline_ms", "partition"],
                scope=_STRING,
                op_id=_STRING,
                deadline_ms=_INTEGER,
                partition=partition,
            ),
            MAX_DEADLINES,
            "The earliest processing-time deadlines, earliest first.",
        ),
        computed_ms=_INTEGER,
        compute_ms={"type": "number", "minimum": 0},
        complete={"type": "boolean"},
        outcomes=_list(
            _object(
                [
                    "at_ms",
                    "scope",
                    "op_id",
                    "outcome",
                    "late",
                    "registered_ms",
                    "outcome_ms",
                    "deadline_ms",
                    "time_domain",
                    "missing",
                    "partition",
                    "sequence",
                ],
                at_ms=_INTEGER,
                scope=_STRING,
                op_id=_STRING,
                outcome={"enum": ["completed", "expired", "cancelled"]},
                late={"type": "boolean"},
                registered_ms=_INTEGER,
                outcome_ms=_INTEGER,
                deadline_ms=_INTEGER,
                time_domain={"enum": ["processing_time", "event_time"]},
                missing={"type": "array", "items": _STRING},
                partition=partition,
                sequence=_INTEGER,
            ),
            MAX_RECENT,
            "The last outcomes settled here, newest first.",
        ),
        outcomes_total=count,
        dead_letters=_list(
            _object(
                ["at_ms", "topic", "partition", "offset", "reason", "field", "key"],
                at_ms=_INTEGER,
                topic=_STRING,
                partition=partition,
                offset={"type": "integer", "minimum": -1},
                reason=_STRING,
                field=text_or_null,
                key=text_or_null,
            ),
            MAX_RECENT,
            "The last dead letters acknowledged here, newest first.",
        ),
        dead_letters_total=count,
    )


def build_openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the HTTP API: its paths from the route table."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "purgatory",
            "version": _VERSION,
            "description": "Delayed operations that wait for signals on watch keys until a "
            "condition holds or a deadline passes; exactly one outcome each, as a callback. "
            "Every error is an `Error` body naming the field at fault. Any other path answers "
            "404 (`NotFound`), and a method a path does not serve 405 with `Allow` "
            "(`MethodNotAllowed`).",
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "schemas": _schemas(),
            "responses": {
                "NotFound": _response(NOT_FOUND_PATH),
                "MethodNotAllowed": _response(METHOD_NOT_ALLOWED),
            },
            "headers": {
                "Allow": {
                    "description": "The methods the path serves.",
                    "required": True,
                    "schema": _STRING,
                },
                "Purgatory-Applied": {
                    "description": "On a 503: `maybe` when the write may have been applied"
                    " before the service gave up waiting for its journal; mark every later try"
                    " with the request header `Purgatory-Retry: 1`.",
                    "required": False,
                    "schema": {"type": "string", "enum": ["maybe"]},
                },
                "Retry-After": {
                    "description": "Seconds to wait before trying again.",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 0},
                },
                "WWW-Authenticate": {
                    "description": "The scheme to authenticate with: `Bearer`.",
                    "required": True,
                    "schema": _STRING,
                },
            },
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A client's token (PURGATORY_API_TOKENS); not needed when"
                    " no token is configured.",
                }
            },
        },
    }


def load_openapi() -> dict[str, Any]:
    """The document kept in the repository (served at ``/openapi.json``)."""
    text = (
        resources.files("purgatory.service.ingress.http")
        .joinpath("openapi.json")
        .read_text("utf-8")
    )
    loaded: dict[str, Any] = json.loads(text)
    return loaded


if __name__ == "__main__":
    sys.stdout.write(json.dumps(build_openapi(), indent=2, ensure_ascii=False) + "\n")
