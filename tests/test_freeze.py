"""``freeze`` returns once every thread of a real process is stopped, and not before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.freeze import freeze, frozen

#: A process whose threads spin on a core each until stopped.
_SPINNERS = """
import threading
def spin():
    while True:
        pass
for _ in range(3):
    threading.Thread(target=spin, daemon=True).start()
print("spinning", flush=True)
spin()
"""


def test_a_process_of_spinning_threads_is_frozen_whole_then_continued() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _SPINNERS], stdout=subprocess.PIPE, process_group=0
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"spinning\n"
        assert not frozen(child.pid)
        assert len(os.listdir(f"/proc/{child.pid}/task")) == 4
        freeze(child.pid)
        assert frozen(child.pid)
        os.kill(child.pid, signal.SIGCONT)
        assert not frozen(child.pid)  # SIGCONT resumes every thread before kill() returns
        freeze(child.pid, group=True)
        assert frozen(child.pid, group=True)
    finally:
        child.kill()
        child.wait()
