"""--watchdog-timeout: a scheduler step running longer than this is a hang, and the server exits.

As upstream: a hung forward (a collective waiting on a dead rank, a kernel that never returns) would
otherwise leave a server that accepts requests and answers none. A thread watches the step clock;
idle waiting for requests is not a step and never trips it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)


class Watchdog:
    def __init__(self, timeout: float, on_hang: Callable[[float], None], poll: float | None = None):
        self.timeout = timeout
        self.on_hang = on_hang
        self._poll = poll if poll is not None else min(timeout / 4, 5.0)
        self._started: float | None = None  # monotonic start of the step in progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="scheduler-watchdog", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        self._started = time.monotonic()
        try:
            yield
        finally:
            self._started = None

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll):
            started = self._started
            if started is None:
                continue
            elapsed = time.monotonic() - started
            if elapsed > self.timeout:
                self.on_hang(elapsed)
                return


def exit_on_hang(elapsed: float) -> None:
    """Log where every thread is, then kill the server (the parent process; the other children die
    with it). Not a graceful stop: that would wait for requests the hung step will never answer."""
    logger.error("scheduler watchdog: a step has run %.3f s, over --watchdog-timeout; killing the server",
                 elapsed)  # fmt: skip
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os.kill(os.getppid(), signal.SIGKILL)
    os._exit(1)
