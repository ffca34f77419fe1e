"""The JSON Schemas of the record formats (codec concept: published formats; stdlib only).

The schemas live in ``purgatory/schemas/`` (shipped in the wheel) and are the user-facing
documentation of every field. The codec is the authority: it also enforces what a schema cannot
say (sizes in UTF-8 bytes, ``count`` at most the number of keys, configured limits), so every
record the codec accepts validates against its schema, and not the other way round.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files

from purgatory._core import UsageError

__all__ = ["SCHEMA_NAMES", "schema"]

#: The record formats that have a schema, by the name :func:`schema` takes.
SCHEMA_NAMES = ("callback", "dead_letter", "request", "signal")


@cache
def _schema_text(name: str) -> str:
    return files("purgatory").joinpath("schemas", f"{name}.v1.schema.json").read_text("utf-8")


def schema(name: str) -> dict[str, object]:
    """The JSON Schema (draft 2020-12) of one record format, as a new dict.

    Args:
        name: ``request``, ``signal``, ``callback`` or ``dead_letter``.

    Raises:
        UsageError: if there is no such schema.
    """
    if name not in SCHEMA_NAMES:
        raise UsageError(f"name must be one of {', '.join(SCHEMA_NAMES)}, got {name!r}")
    loaded: dict[str, object] = json.loads(_schema_text(name))
    return loaded
