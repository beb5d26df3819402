"""--watchdog-timeout: a step over the limit is reported as a hang; short steps and idle time never are."""

from __future__ import annotations

import time

from sgl_inkling.managers.watchdog import Watchdog


def _watch(timeout: float) -> tuple[Watchdog, list[float]]:
    hangs: list[float] = []
    return Watchdog(timeout, hangs.append, poll=0.01), hangs


def test_long_step_is_a_hang():
    wd, hangs = _watch(0.1)
    with wd.step():
        time.sleep(0.4)
    assert len(hangs) == 1 and 0.1 < hangs[0] < 0.4
    wd.close()


def test_short_steps_and_idle_time_are_not():
    wd, hangs = _watch(0.1)
    for _ in range(10):
        with wd.step():
            time.sleep(0.02)
        time.sleep(0.05)  # waiting for requests between steps: 0.5 s in all, never counted
    time.sleep(0.2)
    assert hangs == []
    wd.close()
