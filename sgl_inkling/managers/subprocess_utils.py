"""Child processes that die with their parent, and IPC addresses for the ZMQ sockets."""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import shutil
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
    """Fresh ipc:// endpoints in a private temp directory, removed when this process exits (the
    socket files outlive their sockets: every server start would otherwise leave one behind)."""
    root = tempfile.mkdtemp(prefix="sglang-inkling-")
    atexit.register(remove_ipc_dir, root)
    return {n: f"ipc://{os.path.join(root, n)}" for n in names}


def remove_ipc_dir(root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)


def ipc_dir(addr: str) -> str:
    """The directory ipc_addresses made this endpoint in."""
    return os.path.dirname(addr.removeprefix("ipc://"))


def limit_host_threads(device: str) -> int | None:
    """On a GPU, run this process's torch CPU ops on one thread unless OMP_NUM_THREADS says otherwise
    (as vLLM does for its GPU workers). Returns the thread count set, None where nothing changed.

    The scheduler's CPU work is bookkeeping on tensors of a batch's size, yet some of those ops
    (repeat_interleave: parallel with grain 1) wake the whole OpenMP team every step. Beside the
    HTTP, detokenizer and client processes, a team as wide as the machine spins at each barrier for a
    thread the OS has not run: served at concurrency 64 on the 16-core H200 host, once the requests'
    windows began to slide over their own tokens (release_windows), the scheduler took 14 cores, the
    host blocked on the device for 12% of a step instead of 75%, and steps went from 10.4 to 12.5 ms
    (benchmark/results/diagnostics/host_threads_ddeba54). On the CPU the model runs on these threads,
    so they are left alone there."""
    if device != "cuda" or os.environ.get("OMP_NUM_THREADS"):
        return None
    import torch

    torch.set_num_threads(1)
    return 1


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="[%(asctime)s %(processName)s] %(levelname)s %(name)s: %(message)s",
    )
