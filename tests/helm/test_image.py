"""The Dockerfile, which cannot be built here: what it copies, who it runs as, how it starts.

The image is what the chart runs, so it is held to the chart and to the project's packaging: every
package the wheel ships is in the build context and copied, the user is the chart's non-root id,
and every ``PURGATORY_*`` variable it sets is a setting the service knows.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from purgatory._core import ConfigError
from purgatory.service._settings import Settings
from tests.helm._chart import load_values_file

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text("utf-8")
DOCKERIGNORE = (ROOT / ".dockerignore").read_text("utf-8").splitlines()


def _instructions(name: str) -> list[str]:
    """The arguments of every ``name`` instruction, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(name + " ")]


def test_the_build_context_and_the_copies_hold_every_packaged_file() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    needed = ["pyproject.toml", project["project"]["readme"], *(f"{p}/" for p in packages)]
    rules = [line for line in DOCKERIGNORE if line and not line.startswith("#")]
    assert rules[0] == "*"  # nothing reaches the build but what is listed
    copied = " ".join(_instructions("COPY"))
    for path in needed:
        assert f"!{path}" in DOCKERIGNORE, path
        assert path in copied.split(), path
    assert _instructions("RUN")[-1] == "pip install '.[service]'"


def test_it_runs_purgatory_serve_as_the_charts_non_root_user() -> None:
    (user,) = _instructions("USER")
    uid, _, gid = user.partition(":")
    context = load_values_file()["securityContext"]
    assert (int(uid), int(gid)) == (context["runAsUser"], context["runAsGroup"])
    assert int(uid) != 0
    (entrypoint,) = _instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == ["purgatory", "serve"]
    (base,) = _instructions("FROM")
    assert re.fullmatch(r"python:3\.1[1-9]-slim", base), base


def test_its_environment_is_settings_the_service_accepts() -> None:
    environ = dict(
        pair.split("=", 1) for env in _instructions("ENV") for pair in env.split() if "=" in pair
    )
    settings = {k: v for k, v in environ.items() if k.startswith("PURGATORY_")}
    assert settings.keys() <= set(Settings.env_names())
    # Reachable from the pod's network, not loopback: so the image refuses to serve an open API
    # unless it is given a token (the chart's Secret) or told to on purpose.
    with pytest.raises(ConfigError, match=r"PURGATORY_API_TOKEN: required to listen on 0\.0\.0\.0"):
        Settings.from_env(settings)
    parsed = Settings.from_env(settings | {"PURGATORY_API_TOKEN": "a-token-of-16-characters"})
    assert parsed.http_host == "0.0.0.0"
    assert Settings.from_env(settings | {"PURGATORY_ALLOW_UNAUTHENTICATED": "true"}).http_host
    (exposed,) = _instructions("EXPOSE")
    assert int(exposed) == parsed.http_port == load_values_file()["config"]["http_port"]
