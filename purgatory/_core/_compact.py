"""Compact JSON out: the one encoder of every record the project writes (core; stdlib only).

``dumps(value)`` is ``json.dumps(value, separators=(",", ":"), ensure_ascii=False,
allow_nan=False)``: no spaces, text as UTF-8 (not ``\\u`` escapes), no ``NaN``. The codec's
records, the journal's entries and envelope, snapshots and their manifests all write with it,
so the same value is the same bytes wherever it is written. It is one call of the C encoder:
:meth:`json.JSONEncoder.encode` builds a new C encoder on every call, which costs more than the
encoding of a small value; this one is built once, with the same arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable

__all__ = ["dumps", "dumps_bytes"]

_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False
)


def _make_dumps() -> Callable[[object], str]:
    try:
        from _json import encode_basestring, make_encoder  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a Python without the C accelerator
        return _ENCODER.encode
    encode = make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False
    )

    def dumps(value: object) -> str:
        return "".join(encode(value, 0))

    return dumps


#: ``dumps(value) -> str``: compact JSON; one call of the C encoder.
dumps = _make_dumps()


def dumps_bytes(value: object) -> bytes:
    """:func:`dumps` as UTF-8 (lone surrogates kept as they came, as the records carry them)."""
    return dumps(value).encode("utf-8", "surrogatepass")
