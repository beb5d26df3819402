"""Child processes that die with their parent, and IPC addresses for the ZMQ sockets."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import tempfile
import threading
import time

_PR_SET_PDEATHSIG = 1


def name_process(name: str) -> None:
    """Name this process as `ps`, `top` and /proc/PID/comm show it (at most 15 characters; spawned
    children are otherwise all "python"), as upstream titles its processes."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def die_with_parent() -> None:
    """Ask the kernel to kill us when the parent exits; poll as a fallback where prctl is missing."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def ipc_addresses(names: list[str]) -> dict[str, str]:
    """Fresh ipc:// endpoints in a private temp directory."""
    root = tempfile.mkdtemp(prefix="sglang-inkling-")
    return {n: f"ipc://{os.path.join(root, n)}" for n in names}


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="[%(asctime)s %(processName)s] %(levelname)s %(name)s: %(message)s",
    )
