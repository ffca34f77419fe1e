"""The README and docs: short front door, links that resolve, Markdown that renders, and every
command they show either run here or by the test named beside it.

The README's first operation is run for real: its CLI lines against ``purgatory dev`` (the
embedded broker and the service, on free loopback ports), then its Python example; and its first
operation again on ``purgatory dev --broker kafka``, which must stop on SIGTERM with its Kafka,
and keep its log in ``--data-dir`` for the next start.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio
from markdown_it import MarkdownIt
from markdown_it.token import Token

from purgatory.devtools.broker import free_port
from tests.bounds import bound, observe
from tests.conftest import KAFKA_QUIET_S
from tests.devtools.test_broker import _children, _dead, _poll

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_SHELLS = ("sh", "bash", "console", "shell")
_PURGATORY = Path(sys.executable).parent / "purgatory"
#: How long ``purgatory dev`` takes to be ready on a quiet machine (its broker, topics, service).
DEV_QUIET_S = 10.0
#: The same with ``--broker kafka`` (a JVM, and on a first start the storage tool before it).
DEV_KAFKA_QUIET_S = 12.0
#: How long dev gives its Kafka to serve at its start (``KafkaBroker``'s ``start_timeout_s``):
#: past it dev says so and exits 2, so a wait for dev's broker need not guess beyond it.
DEV_KAFKA_START_S = 60.0

# Commands the pages show that this file does not run itself: who runs them, or why nothing
# here can (no cluster, no registry, no user Prometheus on these machines).
ELSEWHERE = {
    "make demo": "tests/spark_bridge/test_pipeline.py runs the demo's entry point end to end",
    "make check": ".ci/run (CI) runs it on a clean clone",
    "make kafka": "make check runs it first; tests/devtools/test_kafka_broker.py uses its jars",
    "java": "tests/devtools/test_kafka_broker.py: KafkaBroker runs the same two commands",
    "make bench": "tests/benchmarks/test_service_smoke.py runs the benchmarks' code paths",
    "make bench-spark": "tests/benchmarks run the Spark benchmark's code paths",
    "make bench-airflow": "tests/airflow runs the same service, Airflow and DAG the benchmark does",
    "helm": "tests/helm render the chart with the Helm SDK (no cluster here)",
    "kubectl": "needs a cluster: tests/helm check what it would apply",
    "docker": "needs a registry: tests/helm/test_image.py checks the Dockerfile",
    "curl": "against a user's own Prometheus or pod: tests/monitoring/test_e2e.py queries ours",
    "promtool": "tests/monitoring/test_rules.py runs promtool check/test rules on the same files",
    ".venv/bin/python": "tests/monitoring/test_rules.py renders the rules the same way",
    "purgatory-pipeline": "tests/spark_bridge/test_pipeline.py",
    "kafka-topics.sh": "tests/test_kafka_doc.py creates the same topics on Apache Kafka",
    "pip": "make airflow installs purgatory[airflow] (editable) into .venv-airflow",
    "airflow": "tests/airflow/test_dags.py adds the connection with the same command",
    "make nemesis": "tests/nemesis/test_nemesis.py runs its short form through the same run_one",
}


def _blocks(text: str) -> Iterator[tuple[str, str]]:
    """Each fenced block of Markdown ``text``: its info string and its content."""
    for token in MarkdownIt().parse(text):
        if token.type == "fence":
            yield token.info.strip(), token.content


def _commands(script: str) -> Iterator[str]:
    """Each command of a shell block: continuation lines joined, comments dropped."""
    joined = script.replace("\\\n", " ")
    for line in joined.splitlines():
        command = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if command:
            yield command


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= 300, len(lines)
    text = "\n".join(lines)
    for page in ("engine", "service", "spark", "kubernetes", "security", "performance"):
        assert f"(docs/{page}.md)" in text, page


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_resolves(page: Path) -> None:
    for target in _LINK.findall(page.read_text("utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: {target} does not exist"
        if anchor and file.suffix == ".md":
            slugs = {_slug(t.content) for t in _headings(file)}
            assert anchor in slugs, f"{page.name}: no heading #{anchor} in {file.name}"


def _headings(page: Path) -> Iterator[Token]:
    tokens = MarkdownIt().parse(page.read_text("utf-8"))
    for before, token in itertools.pairwise(tokens):
        if before.type == "heading_open":
            yield token


def _slug(text: str) -> str:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_page_renders(page: Path) -> None:
    text = page.read_text("utf-8")
    assert text.count("```") % 2 == 0, "an unclosed code fence"
    html = MarkdownIt("commonmark").enable("table").render(text)
    assert html.count("<h1>") == 1, "one title per page"
    for image in re.findall(r'<img src="([^"]+)"', html):
        assert (page.parent / image).exists(), image


def test_every_command_shown_is_run_here_or_by_a_named_test() -> None:
    unknown = []
    for page in PAGES:
        for info, script in _blocks(page.read_text("utf-8")):
            if info not in _SHELLS:
                continue
            for command in _commands(script):
                words = shlex.split(command.rstrip("&").strip(), comments=True)
                head = " ".join(words[:2]) if words[0] == "make" else words[0]
                if head in ELSEWHERE or head in ("purgatory", "export", "kill"):
                    continue
                if words[0].endswith("/purgatory"):  # .venv/bin/purgatory dev
                    continue
                unknown.append(f"{page.name}: {command}")
    assert not unknown, "commands no test runs:\n" + "\n".join(unknown)


@pytest.fixture(scope="module")
def dev_url() -> Iterator[str]:
    """``purgatory dev`` on a free loopback port, as the README starts it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dev = subprocess.Popen(
        [str(_PURGATORY), "dev", "--port", str(port)],
        env=_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        began = time.perf_counter()
        _wait_ready(url)
        observe("purgatory dev ready", time.perf_counter() - began, DEV_QUIET_S)
        yield url
    finally:
        dev.terminate()
        dev.wait(timeout=30)


def _environment() -> dict[str, str]:
    """This environment without PURGATORY_* variables (a stray one would be refused)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")}


def _cli(url: str, *args: str, within_s: float | None = None, log: Path | None = None) -> str:
    """``purgatory ARGS --url URL``'s output; a failure, or no answer within ``within_s``
    (``bound(60)`` when omitted), names the command, its bound and what it printed (and the
    end of the service's ``log``, when given)."""
    within_s = bound(60) if within_s is None else within_s
    command = ["purgatory", *args]
    began = time.perf_counter()
    try:
        done = subprocess.run(
            [str(_PURGATORY), *args, "--url", url],
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=within_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"{shlex.join(command)}: no answer within {within_s:.0f} s; stderr: {exc.stderr!r}"
            + (f"; the service's log: {_tail(log)}" if log is not None else "")
        ) from None
    took_s = time.perf_counter() - began
    assert done.returncode == 0, (
        f"{shlex.join(command)}: exit {done.returncode} after {took_s:.1f} s (bound"
        f" {within_s:.0f} s): {done.stderr.strip()[-2000:]}"
        + (f"; the service's log: {_tail(log)}" if log is not None else "")
    )
    return done.stdout


@pytest.mark.kafka
def test_the_readme_first_operation_runs_as_shown(dev_url: str, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("## A first operation", 1)[1].split("\n## ", 1)[0]
    blocks = list(_blocks(section))
    shell = next(content for info, content in blocks if info == "sh")
    python = next(content for info, content in blocks if info == "python")
    answers = []
    for command in _commands(shell):
        words = shlex.split(command)
        if words[0] != "purgatory":
            continue  # starting dev, PATH, kill: done by the fixture
        answers.append(_cli(dev_url, *words[1:]))
    outcomes = [json.loads(answer) for answer in answers]
    assert outcomes[2] == {"accepted": 1, "completed": 1}  # as the README says
    assert outcomes[3]["outcome"]["outcome"] == "completed"
    assert outcomes[3]["outcome"]["payload"] == {"job": "report"}
    assert outcomes[5]["outcome"]["outcome"] == "expired"
    assert outcomes[5]["outcome"]["missing"] == ["never"]
    script = tmp_path / "first.py"
    script.write_text(python.replace("http://127.0.0.1:8080", dev_url))
    ran = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=bound(60), check=True
    )
    assert ran.stdout.startswith("completed ['ingest/orders@2026-11-22'"), ran.stdout


@pytest.mark.kafka
def test_purgatory_top_shows_what_the_replica_holds(dev_url: str) -> None:
    _cli(dev_url, "op", "create", "--scope", "top/a", "--id", "w", "--key", "k", "--timeout-ms",
         "600000")  # fmt: skip
    _cli(dev_url, "op", "create", "--scope", "top/b", "--id", "gone", "--key", "never",
         "--timeout-ms", "1")  # fmt: skip
    expired = json.loads(_cli(dev_url, "op", "wait", "--scope", "top/b", "--id", "gone"))
    assert expired["outcome"]["outcome"] == "expired"
    frame = _cli(dev_url, "top", "--once")
    assert frame.startswith("purgatory  ready=yes  partitions=4/4 serving")
    sections = frame.split("\n\n")
    scopes = next(s for s in sections if s.startswith("busiest scopes:"))
    assert "top/a" in scopes
    deadlines = next(s for s in sections if s.startswith("next deadlines:"))
    assert re.search(r"\b(9|10)m\d\ds\s+top/a\s+w\b", deadlines), deadlines
    outcomes = next(s for s in sections if s.startswith("latest outcomes:"))
    assert re.search(r"expired\s+top/b\s+gone\s+never", outcomes), outcomes


def _first_operation() -> list[list[str]]:
    """The README's first operation: register, two signals, wait (each without ``purgatory``)."""
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("## A first operation", 1)[1].split("\n## ", 1)[0]
    shell = next(content for info, content in _blocks(section) if info == "sh")
    commands = [shlex.split(c) for c in _commands(shell) if c.startswith("purgatory ")]
    return [words[1:] for words in commands[:4]]


def _dev_on_kafka(port: int, data: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = ["dev", "--broker", "kafka", "--port", str(port), "--data-dir", str(data)]
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(_PURGATORY), *argv],
            env=_environment(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(dev: subprocess.Popen[bytes], brokers: list[int], log: Path) -> None:
    """SIGTERM, as `kill %1` sends: a graceful stop, exit 0, and no Kafka left behind."""
    dev.send_signal(signal.SIGTERM)
    within_s = bound(30)
    try:
        status = dev.wait(within_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"purgatory dev did not exit within {within_s:.0f} s of SIGTERM: {_tail(log)}"
        ) from None
    assert status == 0, f"purgatory dev exited {status} after SIGTERM: {_tail(log)}"
    within_s = bound(10)
    assert _poll(lambda: all(_dead(pid) for pid in brokers), within_s), (
        f"Kafka {brokers} still running {within_s:.0f} s after purgatory dev exited"
    )


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


class _Phases:
    """How long each phase of a test took: a failure lists them (pytest shows the note)."""

    def __init__(self) -> None:
        self.took: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            exc.add_note(
                f"phases: {self}; failed in {name} after {time.perf_counter() - began:.1f} s"
            )
            raise
        self.took.append((name, time.perf_counter() - began))

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.took) or "none"


@pytest.mark.kafka
def test_the_first_operation_runs_on_apache_kafka_and_its_log_outlives_a_restart(
    tmp_path: Path,
) -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    assert "`purgatory dev --broker kafka`" in readme and "`--data-dir DIR`" in readme
    create, signal_a, signal_b, wait = _first_operation()
    assert (create[:2], wait[:2]) == (["op", "create"], ["op", "wait"])
    port, data, log = free_port(), tmp_path / "kafka", tmp_path / "dev.log"
    url = f"http://127.0.0.1:{port}"
    phase = _Phases()
    dev = _dev_on_kafka(port, data, log)
    brokers: list[int] = []
    try:
        with phase("first start"):
            _wait_kafka_dev_ready(url, dev, log)
        brokers = _children(dev.pid, b"kafka.Kafka")  # Apache Kafka, not Tansu
        assert len(brokers) == 1, _tail(log)
        with phase("first operation"):
            answers = [json.loads(_cli(url, *args)) for args in (create, signal_a, signal_b, wait)]
        assert answers[2] == {"accepted": 1, "completed": 1}
        assert answers[3]["outcome"]["outcome"] == "completed"
        assert answers[3]["outcome"]["payload"] == {"job": "report"}
        with phase("create kept"):
            _cli(url, "op", "create", "--scope", "demo", "--id", "kept", "--key", "later",
                 "--timeout-ms", "600000")  # fmt: skip
        with phase("first stop"):
            _stop(dev, brokers, log)
        assert (data / "kafka-logs").is_dir()  # kept for the next start

        dev = _dev_on_kafka(port, data, log)  # the same data dir: the service restores it
        with phase("second start"):
            _wait_kafka_dev_ready(url, dev, log)
        brokers = _children(dev.pid, b"kafka.Kafka")
        with phase("get kept, create crash"):
            kept = json.loads(_cli(url, "op", "get", "--scope", "demo", "--id", "kept"))
            assert kept["status"] == "pending", kept
            _cli(url, "op", "create", "--scope", "demo", "--id", "crash", "--key", "after",
                 "--timeout-ms", "600000")  # fmt: skip

        # The broker dies under it (kill -9): dev starts it again on the same data dir, and
        # the service carries on by itself; the CLI's retries of the 503 outlast the gap, as
        # long as the user's --timeout-s says: a Kafka start, the dead broker's session and the
        # journal's resumption, about 20 s on a quiet machine, minutes on a loaded one.
        os.kill(brokers[0], signal.SIGKILL)
        retry_s = bound(60)
        with phase("signal across the broker's restart"):
            _cli(url, "signal", "--scope", "demo", "--key", "later", "--timeout-s",
                 f"{retry_s:.0f}", within_s=retry_s + bound(60), log=log)  # fmt: skip
        text = log.read_text(errors="replace")
        assert "dev_broker_exited" in text and "dev_broker_restarted" in text, text[-3000:]
        restarted = re.search(r"dev_broker_restarted .*seconds=([0-9.]+)", text)
        assert restarted is not None, text[-3000:]
        observe("kafka start", float(restarted[1]), KAFKA_QUIET_S)
        within_ms = min(int(bound(30) * 1000), 60_000)  # the longest poll: max_wait_ms
        with phase("wait kept"):
            done = json.loads(_cli(url, "op", "wait", "--scope", "demo", "--id", "kept",
                                   "--timeout-ms", str(within_ms)))  # fmt: skip
        assert done.get("outcome", {}).get("outcome") == "completed", (
            f"op wait: no completed outcome within {within_ms} ms: {done}\n{_tail(log)}"
        )
        with phase("get crash"):
            crash = json.loads(_cli(url, "op", "get", "--scope", "demo", "--id", "crash"))
        assert crash["status"] == "pending", crash  # acknowledged before the crash: kept
        brokers = _children(dev.pid, b"kafka.Kafka")
        assert len(brokers) == 1 and dev.poll() is None, _tail(log)
        with phase("second stop"):
            _stop(dev, brokers, log)
        print(f"phases: {phase}")  # shown with -s, or -rP
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        for pid in brokers:
            if not _dead(pid):
                os.kill(pid, signal.SIGKILL)  # the test failed: leave no Kafka behind it


def _wait_kafka_dev_ready(url: str, dev: subprocess.Popen[bytes], log: Path) -> None:
    """Ready within dev's own bound on its Kafka's start (past it dev exits, saying so), then
    the topics and the service within ``bound(60)``; how long it took grows later bounds."""
    began = time.perf_counter()
    _wait_ready(url, dev=dev, log=log, within_s=DEV_KAFKA_START_S + bound(60))
    observe("purgatory dev --broker kafka ready", time.perf_counter() - began, DEV_KAFKA_QUIET_S)


@pytest.mark.kafka
def test_dev_stops_and_says_why_when_the_embedded_broker_dies(tmp_path: Path) -> None:
    # Tansu keeps everything in memory: a service restored from its empty topics would forget
    # what it acknowledged, so dev stops gracefully and exits 1 naming the cause.
    port, log = free_port(), tmp_path / "dev.log"
    with log.open("ab") as out:
        dev = subprocess.Popen(
            [str(_PURGATORY), "dev", "--port", str(port)],
            env=_environment(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(f"http://127.0.0.1:{port}")
        [tansu] = _children(dev.pid, b"tansu")
        os.kill(tansu, signal.SIGKILL)
        assert dev.wait(60) == 1, log.read_text(errors="replace")[-3000:]
        text = log.read_text(errors="replace")
        assert "dev_broker_lost" in text, text[-3000:]
        assert "purgatory dev: the embedded broker exited (status -9)" in text, text[-3000:]
        assert "--broker kafka" in text
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()


def _wait_ready(
    url: str,
    *,
    dev: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    within_s: float | None = None,
) -> None:
    """``url``'s /readyz answers 200 within ``within_s`` (``bound(60)``: the broker, the topics
    and the service); a ``dev`` that exits meanwhile fails the wait at once, with its ``log``."""
    within_s = bound(60) if within_s is None else within_s
    exited: list[int] = []

    async def poll() -> None:
        with trio.move_on_after(within_s) as waited:
            async with httpx.AsyncClient() as http:
                while True:
                    try:
                        if (await http.get(f"{url}/readyz", timeout=1)).status_code == 200:
                            return
                    except httpx.HTTPError:
                        pass
                    if dev is not None and (status := dev.poll()) is not None:
                        exited.append(status)
                        return
                    await trio.sleep(0.2)
        if waited.cancelled_caught:
            raise AssertionError(
                f"purgatory dev at {url}: /readyz not 200 within {within_s:.0f} s"
                + (f": {_tail(log)}" if log is not None else "")
            )

    trio.run(poll)
    assert not exited, f"purgatory dev at {url} exited {exited[0]} before it was ready" + (
        f": {_tail(log)}" if log is not None else ""
    )
