"""How a setting is read from the environment (service layer, beneath :mod:`settings`: the
parsing of the one reader of the environment).

A :class:`~purgatory.service.settings.Settings` field is declared with :func:`setting` (or
:func:`int_setting`), which keeps its :class:`Spec` (its :class:`Kind`, help text, whether it is
a secret) in the field's metadata; everything here works from those specs, so the settings
module only lists fields and the rules between them. Every field ``name`` is read from
``PURGATORY_<NAME>`` (upper case, :func:`env_name`); a secret field may instead be read from
the file named by ``PURGATORY_<NAME>_FILE`` (a mounted Kubernetes Secret). Values are parsed by
kind:

* integers (:class:`Int`): decimal digits, within the range the field documents;
* booleans (:class:`Bool`): ``true``/``false``/``1``/``0``/``yes``/``no`` (any case);
* choices (:class:`Choice`): one of the listed strings (log levels in any case);
* lists (:class:`ListOf`): comma-separated, no empty item;
* optional fields: an unset or empty variable means "not set" (``None``).

Every problem is reported at once in one :class:`ConfigError`, one line per problem, each line
starting with the variable's name and saying the expected form. A ``PURGATORY_*`` variable that
names no setting is an error (a typo must not pass silently); the variables Kubernetes injects for
a Service named ``purgatory...`` (``PURGATORY_SERVICE_HOST``, ``PURGATORY_PORT=tcp://...``) are
recognised by name and value and ignored.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from purgatory._core import ConfigError

__all__ = [
    "FILE_SUFFIX",
    "PREFIX",
    "Bool",
    "Choice",
    "Int",
    "Kind",
    "ListOf",
    "Spec",
    "Text",
    "coerce_fields",
    "describe",
    "env_name",
    "int_setting",
    "read_environ",
    "redacted_repr",
    "setting",
]

PREFIX = "PURGATORY_"
FILE_SUFFIX = "_FILE"


class Kind(Protocol):
    """How one field's value is parsed from text, checked, and written back as text."""

    @property
    def expected(self) -> str: ...

    def parse(self, text: str) -> object: ...

    def coerce(self, value: object) -> object: ...  # raises ValueError or TypeError

    def format(self, value: Any) -> str: ...


_DIGITS = re.compile(r"-?[0-9]+")


@dataclass(frozen=True, slots=True)
class Int:
    """An integer in ``[minimum, maximum]``."""

    minimum: int
    maximum: int

    @property
    def expected(self) -> str:
        return f"must be an integer between {self.minimum} and {self.maximum}"

    def parse(self, text: str) -> object:
        if not _DIGITS.fullmatch(text.strip()):
            raise ValueError(text)
        return self.coerce(int(text))

    def coerce(self, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(value)
        if not self.minimum <= value <= self.maximum:
            raise ValueError(value)
        return value

    def format(self, value: Any) -> str:
        return str(value)


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True, slots=True)
class Bool:
    """``true``/``false``/``1``/``0``/``yes``/``no``, in any case."""

    expected: str = "must be one of true, false, 1, 0, yes, no"

    def parse(self, text: str) -> object:
        return _BOOLS[text.strip().lower()]  # KeyError is a LookupError, caught as a bad value

    def coerce(self, value: object) -> object:
        if not isinstance(value, bool):
            raise TypeError(value)
        return value

    def format(self, value: Any) -> str:
        return "true" if value else "false"


@dataclass(frozen=True, slots=True)
class Text:
    """A string matching ``pattern``; ``describe`` says what that means to a person.

    ``strip`` removes surrounding white space from the text, ``squeeze`` the white space around
    commas as well (from values and overrides alike).
    """

    pattern: re.Pattern[str]
    describe: str
    strip: bool = True
    squeeze: bool = False

    @property
    def expected(self) -> str:
        return f"must be {self.describe}"

    def parse(self, text: str) -> object:
        return self.coerce(text.strip() if self.strip else text)

    def coerce(self, value: object) -> object:
        if not isinstance(value, str):
            raise TypeError(value)
        if self.squeeze:
            value = re.sub(r"\s*,\s*", ",", value.strip())
        if not self.pattern.fullmatch(value):
            raise ValueError(value)
        return value

    def format(self, value: Any) -> str:
        return str(value)


@dataclass(frozen=True, slots=True)
class Choice:
    """A member of ``kind``, by its value (in any case with ``any_case``)."""

    kind: type[enum.StrEnum]
    any_case: bool = False

    @property
    def expected(self) -> str:
        return f"must be one of {', '.join(self.kind)}"

    def parse(self, text: str) -> object:
        return self.coerce(text.strip())

    def coerce(self, value: object) -> object:
        if not isinstance(value, str):
            raise TypeError(value)
        for member in self.kind:
            if value == member.value or (self.any_case and value.lower() == member.value):
                return member
        raise ValueError(value)

    def format(self, value: Any) -> str:
        return str(value.value)


@dataclass(frozen=True, slots=True)
class ListOf:
    """A comma-separated list of ``item`` values, no empty item, no duplicate."""

    item: Kind
    describe: str

    @property
    def expected(self) -> str:
        return f"must be a comma-separated list of distinct {self.describe}"

    def parse(self, text: str) -> object:
        return self.coerce([self.item.parse(part) for part in text.split(",")])

    def coerce(self, value: object) -> object:
        if isinstance(value, str):
            return self.parse(value)
        if not isinstance(value, list | tuple):
            raise TypeError(value)
        items = tuple(self.item.coerce(item) for item in value)
        if not items or len(set(items)) != len(items):
            raise ValueError(value)
        return items

    def format(self, value: Any) -> str:
        return ",".join(self.item.format(item) for item in value)


@dataclass(frozen=True, slots=True)
class Spec:
    """What a field's metadata holds: its kind, its help text, whether it may be unset (its
    default is None) and whether it is a secret (never shown, may be read from a file)."""

    kind: Kind
    help: str
    optional: bool = False
    secret: bool = False


def setting(default: object, kind: Kind, help: str, *, secret: bool = False) -> Any:
    """A settings field: its default, and its :class:`Spec` in the metadata."""
    spec = Spec(kind, help, optional=default is None, secret=secret)
    return field(default=default, metadata={"spec": spec})


def int_setting(default: int, minimum: int, maximum: int, help: str) -> Any:
    """An integer settings field in ``[minimum, maximum]``."""
    return setting(default, Int(minimum, maximum), help)


def env_name(field_name: str) -> str:
    """``PURGATORY_<FIELD_NAME>``: the environment variable of a settings field."""
    return PREFIX + field_name.upper()


def coerce_fields(settings: Any) -> list[str]:
    """Check (and coerce, in place) every field of a frozen settings dataclass by its kind.

    Returns:
        One line per field whose value its kind refuses.
    """
    problems: list[str] = []
    for f in fields(settings):
        spec: Spec = f.metadata["spec"]
        value = getattr(settings, f.name)
        if value is None and spec.optional:
            continue
        try:
            object.__setattr__(settings, f.name, spec.kind.coerce(value))
        except (ValueError, TypeError):
            problems.append(_problem(f.name, spec, value))
    return problems


def read_environ(
    cls: type[Any], environ: Mapping[str, str], overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """The field values of settings class ``cls`` that ``environ`` sets, parsed by kind.

    Args:
        cls: the settings dataclass (its fields carry a :class:`Spec`).
        environ: the environment; only ``PURGATORY_*`` names are looked at.
        overrides: field values that win over the environment (their fields are not read).

    Raises:
        ConfigError: listing, one per line, every variable with an invalid value, every
            unknown ``PURGATORY_*`` variable and every unknown override.
    """
    names = {f.name for f in fields(cls)}
    known = {name for name, _, _ in describe(cls)}
    suffixes = [name[len(PREFIX) :] for name in known]
    problems = [f"unknown setting override {name!r}" for name in overrides if name not in names]
    for name in sorted(environ):
        if name.startswith(PREFIX) and name not in known:
            if _is_service_link(name, environ[name]):
                continue
            close = difflib.get_close_matches(name[len(PREFIX) :], suffixes, n=1)
            hint = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
            problems.append(f"{name}: unknown setting{hint}")
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in overrides:
            continue
        spec: Spec = f.metadata["spec"]
        found = _read(f.name, spec, environ, problems)
        if found is None:
            continue
        text, source = found
        if spec.optional and not text.strip():
            values[f.name] = None
            continue
        try:
            values[f.name] = spec.kind.parse(text)
        except (ValueError, TypeError, LookupError):
            problems.append(_problem(f.name, spec, text, source=source))
    if problems:
        raise ConfigError("\n".join(problems))
    return values


def describe(cls: type[Any]) -> list[tuple[str, str, str]]:
    """``(variable, default as text ('' when unset), help)`` for every variable read, in field
    order (``*_FILE`` after its secret)."""
    rows: list[tuple[str, str, str]] = []
    for f in fields(cls):
        spec: Spec = f.metadata["spec"]
        default = "" if f.default is None else spec.kind.format(f.default)
        name = env_name(f.name)
        rows.append((name, default, spec.help))
        if spec.secret:
            rows.append((name + FILE_SUFFIX, "", f"File holding {name} (instead of it)."))
    return rows


def redacted_repr(settings: Any) -> str:
    """``Name(field=value, ...)`` with every secret that is set shown as ``<redacted>``."""
    shown: list[str] = []
    for f in fields(settings):
        value = getattr(settings, f.name)
        secret = f.metadata["spec"].secret and value is not None
        shown.append(f"{f.name}={'<redacted>' if secret else repr(value)}")
    return f"{type(settings).__name__}({', '.join(shown)})"


def _problem(name: str, spec: Spec, got: object, *, source: str | None = None) -> str:
    shown = "<redacted>" if spec.secret else repr(got)
    hint = ""
    if isinstance(got, str) and re.fullmatch(_URL, got):
        hint = " (a Kubernetes service link? set enableServiceLinks: false in the pod spec)"
    return f"{source or env_name(name)}: {spec.kind.expected}, got {shown}{hint}"


def _read(
    name: str, spec: Spec, environ: Mapping[str, str], problems: list[str]
) -> tuple[str, str] | None:
    """The field's text and the variable it came from, or None when unset (or unreadable)."""
    env = env_name(name)
    text = environ.get(env)
    if not spec.secret:
        return None if text is None else (text, env)
    file_env = env + FILE_SUFFIX
    path = environ.get(file_env)
    if path is None:
        return None if text is None else (text, env)
    if text is not None:
        problems.append(f"{env}: set either {env} or {file_env}, not both")
        return None
    try:
        with open(path, encoding="utf-8") as secret_file:
            content = secret_file.read()
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{file_env}: must name a readable UTF-8 file, got {path!r} ({exc})")
        return None
    # Secret files usually end with a newline that is not part of the secret.
    return content.rstrip("\r\n"), file_env


# What Kubernetes injects for every Service in the namespace (enableServiceLinks), for a Service
# whose name starts with "purgatory": <NAME>_SERVICE_HOST=10.0.0.1, <NAME>_SERVICE_PORT=8080,
# <NAME>_PORT=tcp://10.0.0.1:8080, <NAME>_PORT_8080_TCP{,_PROTO,_PORT,_ADDR}=...
_IP = r"[0-9A-Fa-f:.]+"
_URL = r"(tcp|udp|sctp)://\S+"
_SERVICE_LINKS = [
    (re.compile(r"PURGATORY(_\w+)?_SERVICE_HOST"), re.compile(_IP)),
    (re.compile(r"PURGATORY(_\w+)?_SERVICE_PORT(_\w+)?"), re.compile(r"[0-9]+")),
    (re.compile(r"PURGATORY(_\w+)?_PORT(_[0-9]+_(TCP|UDP|SCTP))?"), re.compile(_URL)),
    (re.compile(r"PURGATORY(_\w+)?_PORT_[0-9]+_(TCP|UDP|SCTP)_PROTO"), re.compile(r"tcp|udp|sctp")),
    (re.compile(r"PURGATORY(_\w+)?_PORT_[0-9]+_(TCP|UDP|SCTP)_PORT"), re.compile(r"[0-9]+")),
    (re.compile(r"PURGATORY(_\w+)?_PORT_[0-9]+_(TCP|UDP|SCTP)_ADDR"), re.compile(_IP)),
]


def _is_service_link(name: str, value: str) -> bool:
    return any(n.fullmatch(name) and v.fullmatch(value) for n, v in _SERVICE_LINKS)
