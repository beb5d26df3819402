"""SIGTERM drain: stop taking requests, give those in flight --graceful-shutdown-timeout seconds,
then finish the rest with an explicit abort so every client learns how its request ended (a 503, or
an SSE error event and [DONE]) before the server closes its connections and stops its children.

A second SIGTERM, or SIGINT, exits at once (uvicorn's own handling).
"""

from __future__ import annotations

import asyncio
import logging
import signal

import uvicorn

logger = logging.getLogger(__name__)

SHUTDOWN_MESSAGE = "the server is shutting down (--graceful-shutdown-timeout passed)"
FLUSH_SECONDS = 5.0  # for the aborted requests' last events to reach their clients


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, tm, timeout: float):
        super().__init__(config)
        self.tm, self.timeout = tm, timeout
        self.loop: asyncio.AbstractEventLoop | None = None
        self.drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if sig == signal.SIGTERM and self.drain_task is None and not self.should_exit and self.loop is not None:
            self.loop.call_soon_threadsafe(self._start_drain)  # a signal handler is no place for asyncio work
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        if self.drain_task is None:
            self.drain_task = self.loop.create_task(self.drain())

    async def drain(self) -> None:
        tm = self.tm
        tm.draining = True  # new requests get 503 from here on
        logger.info("SIGTERM: draining %d request(s) for up to %.1f s", len(tm.rid_to_state), self.timeout)
        await self._wait_idle(self.timeout)
        if tm.rid_to_state:
            logger.warning("SIGTERM: aborting %d request(s) still running", len(tm.rid_to_state))
            tm.finish_all(SHUTDOWN_MESSAGE, 503)
            await self._wait_idle(FLUSH_SECONDS)
        self.should_exit = True

    async def _wait_idle(self, seconds: float) -> None:
        deadline = self.loop.time() + seconds
        while self.tm.rid_to_state and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
