"""The embedded broker: starts on loopback, serves, creates topics idempotently, leaves nothing.

Nothing either when its owner is SIGKILLed: the owner is then a real process (``purgatory dev``,
or a script holding a ``purgatory serve`` child), so those tests sleep for real, in bounded loops.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kafka import KafkaAdminClient

from purgatory._core import TransportError, UsageError
from purgatory.devtools.broker import EmbeddedBroker, free_port

pytestmark = pytest.mark.kafka


def _partitions(bootstrap_servers: str, topic: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        (described,) = admin.describe_topics([topic])
        return len(described["partitions"])
    finally:
        admin.close()


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _port_refuses(bootstrap_servers: str) -> bool:
    host, port = bootstrap_servers.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except OSError:
        return True


def test_start_serves_on_loopback_and_stop_leaves_no_process() -> None:
    broker = EmbeddedBroker()
    broker.start()
    pid, servers, log_path = broker.pid, broker.bootstrap_servers, broker.log_path
    assert pid is not None and log_path is not None
    assert servers.startswith("127.0.0.1:")
    assert not _process_gone(pid)
    assert b"listening on" in log_path.read_bytes()  # output went to the log, not the terminal
    broker.stop()
    assert _process_gone(pid)  # terminated and reaped
    assert _port_refuses(servers)
    assert not log_path.exists()
    broker.stop()  # idempotent
    with pytest.raises(UsageError, match="not running"):
        _ = broker.bootstrap_servers


def test_context_manager_stops_the_broker_on_error() -> None:
    pid = None
    with pytest.raises(RuntimeError, match="boom"), EmbeddedBroker() as broker:
        pid = broker.pid
        raise RuntimeError("boom")
    assert pid is not None and _process_gone(pid)


def test_missing_binary_is_a_transport_error_naming_it() -> None:
    with pytest.raises(TransportError, match="/nonexistent/tansu"):
        EmbeddedBroker(binary="/nonexistent/tansu").start()


# Tansu's alone, as is every test of this module: they test its launcher (test_kafka_broker.py
# tests Kafka's), here the answer "already exists" it gives for a topic that exists.
def test_create_topics_is_idempotent(tansu_broker: EmbeddedBroker) -> None:
    first, second = f"idem-{uuid.uuid4().hex}", f"idem-{uuid.uuid4().hex}"
    tansu_broker.create_topics({first: 3})
    tansu_broker.create_topics({first: 3})
    tansu_broker.create_topics({first: 5, second: 2})  # existing topics are left as they are
    assert _partitions(tansu_broker.bootstrap_servers, first) == 3
    assert _partitions(tansu_broker.bootstrap_servers, second) == 2


def test_create_topics_rejects_bad_arguments(tansu_broker: EmbeddedBroker) -> None:
    with pytest.raises(UsageError, match="partitions"):
        tansu_broker.create_topics({"bad": 0})


def test_die_with_parent_off_the_main_thread_is_a_usage_error() -> None:
    # A worker thread (trio's are recycled after a few idle seconds) would take the broker along.
    broker = EmbeddedBroker(die_with_parent=True)
    with ThreadPoolExecutor(1) as pool, pytest.raises(UsageError, match="main thread"):
        pool.submit(broker.start).result()
    assert broker.pid is None and broker.log_path is None  # nothing was started or created


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (which may hold spaces), or None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _dead(pid: int) -> bool:
    # A zombie is dead: a container's PID 1 may never reap the orphans it inherits.
    fields = _stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


def _children(pid: int, named: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == pid and named in cmdline:
                found.append(int(entry.name))
    return found


def _poll(done: Callable[[], bool], timeout_s: float) -> bool:
    for _ in range(int(timeout_s / 0.05)):
        if done():
            return True
        time.sleep(0.05)  # noqa: TID251 - real processes, a bounded wait
    return done()


def _kill_owner_and_check(owner: subprocess.Popen[bytes], children: list[int]) -> None:
    owner.send_signal(signal.SIGKILL)
    owner.wait(10)
    assert _poll(lambda: all(_dead(pid) for pid in children), 10.0), children


def _run_owner(argv: list[str], out: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")}
    with out.open("wb") as log:
        return subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )


def _cleanup(owner: subprocess.Popen[bytes], children: list[int]) -> None:
    if owner.poll() is None:
        owner.kill()
        owner.wait()
    for pid in children:
        if not _dead(pid):
            os.kill(pid, signal.SIGKILL)  # the test failed: leave no orphan behind it


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkill_of_purgatory_dev_takes_its_broker_down(tmp_path: Path) -> None:
    out = tmp_path / "dev.log"
    argv = [sys.executable, "-m", "purgatory.service.cli", "dev"]
    owner = _run_owner([*argv, "--host", "127.0.0.1", "--port", str(free_port())], out)
    brokers: list[int] = []
    try:
        started = _poll(lambda: b"delivery acknowledged" in out.read_bytes(), 30.0)
        assert started and owner.poll() is None, out.read_text(errors="replace")
        assert b"purgatory dev: broker" in out.read_bytes()  # and says what it delivers:
        assert b"at least once (after a crash, consumers drop repeats by id)" in out.read_bytes()
        brokers = _children(owner.pid, b"tansu")
        assert len(brokers) == 1 and not _dead(brokers[0])
        _kill_owner_and_check(owner, brokers)
    finally:
        _cleanup(owner, brokers)


_SERVICE_OWNER = """\
import signal, sys
from pathlib import Path
from purgatory.devtools.child import service_process
names = dict(arg.split("=", 1) for arg in sys.argv[3:])
with service_process(sys.argv[1], Path(sys.argv[2]), names, die_with_parent=True) as child:
    print("service pid", child.pid, flush=True)
    signal.pause()  # until killed
"""


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkill_of_the_demo_takes_its_service_child_down(
    tansu_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    # On Tansu alone: what must die with its owner is the service child; the broker it
    # connects to is beside the point (and is Tansu in the demo).
    tag = uuid.uuid4().hex[:6]
    names = {
        f"PURGATORY_TOPIC_{kind.upper()}": f"{kind}-{tag}"
        for kind in ("requests", "signals", "callbacks", "dead_letters", "changelog")
    }
    tansu_broker.create_topics({topic: 2 for topic in names.values()})
    out = tmp_path / "owner.log"
    args = [tansu_broker.bootstrap_servers, str(tmp_path / "service.log")]
    args += [f"{k}={v}" for k, v in {**names, "PURGATORY_KAFKA_GROUP_ID": tag}.items()]
    owner = _run_owner([sys.executable, "-c", _SERVICE_OWNER, *args], out)
    services: list[int] = []
    try:
        started = _poll(lambda: b"service pid" in out.read_bytes(), 30.0)
        assert started and owner.poll() is None, out.read_text(errors="replace")
        services = [int(out.read_text().split("service pid", 1)[1].split()[0])]
        assert _children(owner.pid, b"purgatory.service.cli") == services
        _kill_owner_and_check(owner, services)
    finally:
        _cleanup(owner, services)
