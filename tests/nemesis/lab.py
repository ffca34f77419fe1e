"""The nemesis's network: a lab of Linux network namespaces joined by one bridge, and its cuts.

A lab is a "switch" namespace holding a bridge, and one namespace per host (``broker``, ``r0``,
``r1``, ``r2``, ``client``), each joined to the bridge by a veth pair: the host's end is
``eth0`` with an address in 10.77.0.0/24, the switch's end ``p-<host>`` is a bridge port. Nothing
is created in the root namespace, so two labs (two pytest-xdist workers) may use the same
subnet without meeting. Every name starts with the lab's prefix, ``pn<6 hex>p<pid>-``: the pid
of the process that made it, so that a later lab removes the leftovers of one whose maker died
(and only those) before it starts.

The faults are bridge and qdisc settings, each with its heal (``Net``): a port ``isolated``
cannot talk to another isolated port but still talks to the others; a port down cuts its host
from everything; a token bucket with a short queue (``tbf``) on both directions of a host's
link makes it slow and lossy. ``Net`` only runs ``ip -n``, ``bridge -n`` and ``tc -n``, which
work from any namespace, so the orchestration inside the lab's client namespace injects them.
Every command has a timeout.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

__all__ = [
    "ADDRESSES",
    "HOSTS",
    "REPLICAS",
    "Lab",
    "LabError",
    "Net",
    "lab_namespaces",
    "lab_problems",
    "namespaces",
    "remove_stale",
]

REPLICAS = ("r0", "r1", "r2")
HOSTS = ("broker", *REPLICAS, "client")
ADDRESSES = {
    "broker": "10.77.0.2",
    "r0": "10.77.0.10",
    "r1": "10.77.0.11",
    "r2": "10.77.0.12",
    "client": "10.77.0.100",
}
_PREFIX_LEN = 24
_NAME = re.compile(r"^pn([0-9a-f]{6})p([0-9]+)-")
_BRIDGE = "br0"
_COMMAND_TIMEOUT_S = 15.0
# A slow, lossy link: 96 kbit/s with a queue of 20 ms drops what a restore or a burst sends.
_TBF = ("rate", "96kbit", "burst", "4kb", "latency", "20ms")


class LabError(RuntimeError):
    """A lab command failed (its command line and output in the message)."""


def lab_problems() -> list[str]:
    """What this machine lacks to make a lab (empty: nothing)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the nemesis makes network namespaces and a bridge: run it as root")
    for tool in ("ip", "bridge", "tc"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is missing (Debian: apt-get install iproute2)")
    return problems


def _run(argv: Sequence[str], *, check: bool = True) -> str:
    try:
        done = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        output = (done.stderr or done.stdout).decode(errors="replace").strip()
        raise LabError(f"{' '.join(argv)} exited {done.returncode}: {output}")
    return done.stdout.decode(errors="replace")


def namespaces() -> list[str]:
    """Every network namespace ``ip netns`` lists."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]


def lab_namespaces(prefix: str) -> list[str]:
    """The namespaces of the lab whose names start with ``prefix``."""
    return [name for name in namespaces() if name.startswith(prefix)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_namespace(name: str) -> None:
    """Kill what still runs in ``name`` (a lab's own processes), then delete it."""
    with contextlib.suppress(LabError):
        for pid in _run(["ip", "netns", "pids", name], check=False).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    _run(["ip", "netns", "del", name], check=False)


def remove_stale() -> list[str]:
    """Remove the namespaces of labs whose maker is dead; the names removed."""
    removed = []
    for name in namespaces():
        match = _NAME.match(name)
        if match is not None and not _alive(int(match.group(2))):
            _remove_namespace(name)
            removed.append(name)
    return removed


@dataclass(frozen=True, slots=True)
class Net:
    """The names of one lab, and the faults set on it (each with its heal).

    Attributes:
        prefix: every namespace of the lab starts with it.
    """

    prefix: str

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"

    def ns(self, host: str) -> str:
        """The namespace of ``host`` (one of :data:`HOSTS`)."""
        assert host in HOSTS, host
        return f"{self.prefix}{host}"

    @staticmethod
    def port(host: str) -> str:
        """The bridge port of ``host`` in the switch namespace."""
        return f"p-{host}"

    def exec_prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program in ``host``'s namespace."""
        return ["ip", "netns", "exec", self.ns(host)]

    def isolate(self, hosts: Sequence[str], on: bool) -> None:
        """Set (or clear) bridge port isolation on ``hosts``' ports."""
        for host in hosts:
            state = "on" if on else "off"
            _run(["bridge", "-n", self.switch, "link", "set", "dev", self.port(host),
                  "isolated", state])  # fmt: skip

    def link(self, host: str, up: bool) -> None:
        """Bring ``host``'s switch port up or down (down: cut from everything)."""
        _run(["ip", "-n", self.switch, "link", "set", "dev", self.port(host),
              "up" if up else "down"])  # fmt: skip

    def shape(self, host: str, on: bool) -> None:
        """Put (or take off) a slow lossy token bucket on both directions of ``host``'s link:
        the host's ``eth0`` egress and its switch port's egress."""
        for ns, dev in ((self.ns(host), "eth0"), (self.switch, self.port(host))):
            if on:
                _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", *_TBF])
            else:
                _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)

    def drops(self, host: str) -> int:
        """Packets the token buckets of ``host``'s link dropped so far (0 without them)."""
        total = 0
        for ns, dev in ((self.ns(host), "eth0"), (self.switch, self.port(host))):
            text = _run(["tc", "-s", "-n", ns, "qdisc", "show", "dev", dev], check=False)
            total += sum(int(n) for n in re.findall(r"dropped (\d+)", text))
        return total

    def heal(self) -> None:
        """Every port up and not isolated, no token bucket: the lab as it was made."""
        for host in HOSTS:
            self.link(host, True)
            self.isolate([host], False)
            self.shape(host, False)


class Lab:
    """A lab's namespaces, made on entry and all removed on exit, whatever happened inside.

    Args:
        prefix: the names' prefix; a fresh ``pn<6 hex>p<this pid>-`` when omitted.
    """

    def __init__(self, prefix: str | None = None) -> None:
        self.net = Net(prefix or f"pn{secrets.token_hex(3)}p{os.getpid()}-")
        assert len(self.net.prefix) <= _PREFIX_LEN, self.net.prefix

    def __enter__(self) -> Lab:
        remove_stale()
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()

    def _create(self) -> None:
        net = self.net
        _run(["ip", "netns", "add", net.switch])
        _run(["ip", "-n", net.switch, "link", "add", _BRIDGE, "type", "bridge"])
        _run(["ip", "-n", net.switch, "link", "set", "dev", _BRIDGE, "up"])
        _run(["ip", "-n", net.switch, "link", "set", "dev", "lo", "up"])
        for host in HOSTS:
            ns, port = net.ns(host), net.port(host)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth",
                  "peer", "name", port, "netns", net.switch])  # fmt: skip
            _run(["ip", "-n", net.switch, "link", "set", "dev", port, "master", _BRIDGE])
            _run(["ip", "-n", net.switch, "link", "set", "dev", port, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{ADDRESSES[host]}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "dev", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "dev", "lo", "up"])

    def remove(self) -> None:
        """Kill what runs in the lab's namespaces and delete them (hosts first); idempotent."""
        names = lab_namespaces(self.net.prefix)
        for name in sorted(names, key=lambda n: n == self.net.switch):
            _remove_namespace(name)
        left = lab_namespaces(self.net.prefix)
        if left:
            print(f"nemesis: namespaces left behind: {left}", file=sys.stderr)

    def processes(self) -> Iterator[int]:
        """The pids running in the lab's namespaces now."""
        for name in lab_namespaces(self.net.prefix):
            for pid in _run(["ip", "netns", "pids", name], check=False).split():
                yield int(pid)
