"""The codec's public surface: a sorted ``__all__``, documented names, stdlib-only imports."""

from __future__ import annotations

import subprocess
import sys

import purgatory._codec as codec


def _isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions: the order ruff's RUF022 keeps."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def test_all_is_sorted_unique_and_complete() -> None:
    names = list(codec.__all__)
    assert names == sorted(names, key=_isort_key)
    assert len(set(names)) == len(names)
    public = {n for n in vars(codec) if not n.startswith("_")} - {"annotations"}
    assert public == set(names)


def test_every_public_callable_and_class_has_a_docstring() -> None:
    for name in codec.__all__:
        value = getattr(codec, name)
        if isinstance(value, type) or (callable(value) and not name[0].isupper()):
            assert value.__doc__, name


def test_the_codec_imports_only_the_standard_library_and_the_core() -> None:
    code = (
        "import sys; before = set(sys.modules); import purgatory._codec; "
        "names = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(','.join(sorted(names - set(sys.stdlib_module_names) - {'purgatory'})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    code = "import sys, purgatory._codec; print([m for m in sys.modules if 'service' in m])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
