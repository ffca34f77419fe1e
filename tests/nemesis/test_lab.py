"""The nemesis's lab on this machine's kernel: made and removed whole, leaving the root namespace
as it was, cutting exactly what each fault says, and cleaning up after a dead maker's lab.

These need root, ``ip`` and ``bridge`` (CI runs as root): without them they fail and say so.
Each probe is a bounded TCP connection from one namespace to a listener in another.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.nemesis.lab import (
    ADDRESSES,
    HOSTS,
    Lab,
    Net,
    lab_namespaces,
    lab_problems,
    remove_stale,
)

pytestmark = pytest.mark.nemesis

_LISTEN = """\
import socket, sys
server = socket.create_server((sys.argv[1], 9000))
print("listening", flush=True)
while True:
    server.accept()[0].close()
"""
_CONNECT = """\
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9000), timeout=float(sys.argv[2])).close()
except OSError:
    sys.exit(1)
"""


@pytest.fixture(autouse=True)
def _root() -> None:
    problems = lab_problems()
    if problems:
        pytest.fail("the nemesis lab cannot be made here: " + "; ".join(problems))


def _root_links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def _reaches(net: Net, source: str, target: str, timeout_s: float = 1.5) -> bool:
    """Whether a TCP connection from ``source`` to ``target`` succeeds within ``timeout_s``
    (a healed port first resolves its neighbours again: a SYN may be retried after 1 s)."""
    argv = [*net.exec_prefix(source), sys.executable, "-c", _CONNECT, ADDRESSES[target]]
    argv.append(str(timeout_s))
    return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0


@contextlib.contextmanager
def _listening(net: Net, host: str) -> Iterator[subprocess.Popen[bytes]]:
    argv = [*net.exec_prefix(host), sys.executable, "-c", _LISTEN, ADDRESSES[host]]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"listening\n"
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_a_lab_is_made_whole_and_removed_whole_even_after_an_exception() -> None:
    before = _root_links()
    with pytest.raises(RuntimeError, match="inside the lab"), Lab() as lab:
        prefix = lab.net.prefix
        assert sorted(lab_namespaces(prefix)) == sorted([lab.net.switch, *map(lab.net.ns, HOSTS)])
        assert _root_links() == before  # nothing in the root namespace
        sleeper = subprocess.Popen([*lab.net.exec_prefix("r1"), "sleep", "60"])
        assert list(lab.processes()) == [sleeper.pid]
        raise RuntimeError("inside the lab")
    assert lab_namespaces(prefix) == []
    assert sleeper.wait(10) == -9  # what ran in the lab was killed with it
    assert _root_links() == before


def test_each_cut_cuts_what_it_says_and_heals() -> None:
    with Lab() as lab, _listening(lab.net, "broker"), _listening(lab.net, "r1"):
        net = lab.net
        assert _reaches(net, "r0", "broker") and _reaches(net, "client", "r1")
        net.isolate(["r0", "broker"], True)  # a replica cut from the broker
        assert not _reaches(net, "r0", "broker")
        assert _reaches(net, "r0", "r1") and _reaches(net, "r2", "broker")
        net.isolate(["r0", "broker"], False)
        net.isolate(["r0", "r1", "r2"], True)  # replicas apart, each still with the broker
        assert not _reaches(net, "r0", "r1")
        assert _reaches(net, "r0", "broker") and _reaches(net, "client", "r1")
        net.heal()
        net.link("broker", False)  # the broker cut from all
        assert not _reaches(net, "client", "broker") and not _reaches(net, "r0", "broker")
        assert _reaches(net, "r0", "r1")
        net.shape("r1", True)  # slow, but a connection still goes through
        assert _reaches(net, "client", "r1")
        net.heal()
        assert _reaches(net, "client", "broker", 5) and _reaches(net, "r0", "broker", 5)
        assert net.drops("r1") == 0  # the token buckets are gone


def test_leftovers_of_a_dead_maker_are_removed_and_a_live_makers_kept() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(10)
    stale = f"pn{secrets.token_hex(3)}p{dead.pid}-sw"
    live = f"pn{secrets.token_hex(3)}p{os.getpid()}-sw"
    try:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
        removed = remove_stale()
        assert stale in removed and live not in removed
        assert lab_namespaces(stale) == [] and lab_namespaces(live) == [live]
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
