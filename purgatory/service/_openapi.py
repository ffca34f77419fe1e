"""The OpenAPI document of the HTTP API (service layer).

Built from the records' JSON Schemas (:func:`purgatory._codec.schema`), so the HTTP bodies are
documented by the very schemas that describe the Kafka records; the generated document is kept
in the repository (``purgatory/service/openapi.json``, checked by a test to match this builder)
and served at ``/openapi.json``. Regenerate it with ``python -m purgatory.service._openapi``.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from typing import Any

from purgatory._codec import schema

__all__ = ["build_openapi", "load_openapi"]

_VERSION = "0.1.0"


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json(ref: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


def _query(
    name: str, description: str, *, required: bool = True, integer: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": {"type": "integer", "minimum": 0}
        if integer
        else {"type": "string", "minLength": 1},
    }


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


def build_openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the HTTP API."""
    request, signal, callback = schema("request"), schema("signal"), schema("callback")
    scope_q = _query("scope", "The operation's scope.")
    op_q = _query("op_id", "The operation's id within its scope.")
    errors = {
        "400": _error_response("Malformed JSON."),
        "401": _error_response("Missing or wrong bearer token (when an API token is set)."),
        "413": _error_response("Body over max_request_bytes, or batch over max_batch."),
        "422": _error_response("A field is out of its domain; `field` names it."),
        "503": _error_response(
            "The scope's partition is being restored (or is not served by this replica), or"
            " the journal could not make the write durable; retry after the Retry-After header."
        ),
    }
    op_json = {"description": "The operation.", **_json("OperationStatus")}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "purgatory",
            "version": _VERSION,
            "description": "Delayed operations that wait for signals on watch keys until a "
            "condition holds or a deadline passes; exactly one outcome each, as a callback.",
        },
        "paths": {
            "/v1/operations": {
                "post": {
                    "summary": "Register an operation (idempotent by scope and op_id).",
                    "requestBody": {"required": True, **_json("Register")},
                    "responses": {
                        "201": {
                            "description": "Registered (pending, or completed at once).",
                            **_json("Registration"),
                        },
                        "200": {
                            "description": "Duplicate, or a timer re-armed.",
                            **_json("Registration"),
                        },
                        "409": _error_response("op_id reused with another body."),
                        "429": _error_response("A pending limit was reached."),
                        **errors,
                    },
                },
                "get": {
                    "summary": "List the pending operations of a scope.",
                    "parameters": [scope_q],
                    "responses": {"200": {"description": "Pending operations."}, **errors},
                },
            },
            "/v1/operations:batch": {
                "post": {
                    "summary": "Register many operations; each gets its own status.",
                    "requestBody": {"required": True, **_json("RegisterBatch")},
                    "responses": {
                        "200": {"description": "One result per operation, in order."},
                        **errors,
                    },
                },
            },
            "/v1/operation": {
                "get": {
                    "summary": "Get an operation and its outcome, if any.",
                    "parameters": [scope_q, op_q],
                    "responses": {
                        "200": op_json,
                        "404": _error_response("Unknown operation."),
                        **errors,
                    },
                },
                "delete": {
                    "summary": "Cancel a pending operation (its outcome is `cancelled`).",
                    "parameters": [scope_q, op_q],
                    "responses": {
                        "200": {"description": "Cancelled.", **_json("Callback")},
                        "404": _error_response("Unknown operation."),
                        "409": _error_response("The operation already finished."),
                        **errors,
                    },
                },
            },
            "/v1/operation/wait": {
                "get": {
                    "summary": "Wait (long poll) for an operation's outcome.",
                    "parameters": [
                        scope_q,
                        op_q,
                        _query(
                            "timeout_ms",
                            "How long to wait, at most max_wait_ms.",
                            required=False,
                            integer=True,
                        ),
                    ],
                    "responses": {
                        "200": op_json,
                        "404": _error_response("Unknown operation."),
                        **errors,
                    },
                },
            },
            "/v1/signals": {
                "post": {
                    "summary": "Publish signals (facts remembered with a TTL).",
                    "requestBody": {"required": True, **_json("SignalBatch")},
                    "responses": {
                        "200": {"description": "Accepted, and how many operations completed."},
                        **errors,
                    },
                },
            },
            "/v1/watermarks": {
                "post": {
                    "summary": "Advance scopes' event-time watermarks (monotonic; older: no-op).",
                    "requestBody": {"required": True, **_json("WatermarkBatch")},
                    "responses": {
                        "200": {"description": "Accepted, and how many moved."},
                        **errors,
                    },
                },
            },
            "/healthz": {
                "get": {"summary": "Liveness.", "responses": {"200": {"description": "Alive."}}}
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: every input partition held is restored and served.",
                    "description": "The body lists each partition held: `serving`, or"
                    " `restoring` with the changelog records read and the seconds spent so far.",
                    "responses": {
                        "200": {"description": "Ready."},
                        "503": {"description": "Not ready (starting, or a partition restoring)."},
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics.",
                    "responses": {"200": {"description": "Text exposition."}},
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document.",
                    "responses": {"200": {"description": "OpenAPI 3.1."}},
                }
            },
        },
        "components": {
            "schemas": {
                "Register": _body_schema(request, "register"),
                "RegisterBatch": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["operations"],
                    "properties": {
                        "operations": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/Register"},
                        }
                    },
                },
                "Signal": _body_schema(signal, "signal"),
                "SignalBatch": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["signals"],
                    "properties": {
                        "signals": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/Signal"},
                        }
                    },
                },
                "Watermark": _body_schema(signal, "watermark"),
                "WatermarkBatch": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["watermarks"],
                    "properties": {
                        "watermarks": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/Watermark"},
                        }
                    },
                },
                "Callback": _inline(
                    {k: v for k, v in callback.items() if k != "$defs"},
                    _defs(callback),
                ),
                "Registration": {
                    "type": "object",
                    "properties": {
                        "status": {"enum": ["pending", "completed", "duplicate", "rearmed"]},
                        "scope": {"type": "string"},
                        "op_id": {"type": "string"},
                        "outcome": {
                            "oneOf": [{"$ref": "#/components/schemas/Callback"}, {"type": "null"}]
                        },
                    },
                },
                "OperationStatus": {
                    "type": "object",
                    "properties": {
                        "status": {"enum": ["pending", "completed", "expired", "cancelled"]},
                        "scope": {"type": "string"},
                        "op_id": {"type": "string"},
                        "outcome": {
                            "oneOf": [{"$ref": "#/components/schemas/Callback"}, {"type": "null"}]
                        },
                    },
                },
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["status", "message"],
                            "properties": {
                                "status": {"type": "integer"},
                                "field": {
                                    "type": ["string", "null"],
                                    "description": "The field that was wrong.",
                                },
                                "message": {"type": "string"},
                            },
                        }
                    },
                },
            }
        },
    }


def load_openapi() -> dict[str, Any]:
    """The document kept in the repository (served at ``/openapi.json``)."""
    text = resources.files("purgatory.service").joinpath("openapi.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


if __name__ == "__main__":
    sys.stdout.write(json.dumps(build_openapi(), indent=2, ensure_ascii=False) + "\n")
