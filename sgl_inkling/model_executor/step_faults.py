"""Failures of the model step itself, and a test-only hook that injects them.

A ModelStepError means the forward (or an MTP draft or verify step) raised: the requests of that
step are lost and the server reports itself unhealthy until a generation succeeds again. Anything
else the scheduler catches is a bug in handling particular requests and costs only those.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# Test-only: "N" makes the Nth model step of this process raise, "N+" every step from the Nth on
# (a dead device), "@PATH" every step while the file PATH exists (a test turns the fault on and off).
# Read once at start; never set it in production.
FAULT_ENV = "SGL_INKLING_TEST_FAIL_FORWARD"


class ModelStepError(RuntimeError):
    """The model step raised (the message names the original exception)."""


class InjectedFault(RuntimeError):
    """Raised by the test-only hook in place of a real device failure."""


class FaultInjector:
    def __init__(self, spec: str | None = None):
        spec = (os.environ.get(FAULT_ENV, "") if spec is None else spec).strip()
        self.calls = 0
        self.path = spec[1:] if spec.startswith("@") else None
        try:
            self.at = int(spec.rstrip("+")) if spec and self.path is None else 0
        except ValueError:
            self.at = -1
        self.sticky = spec.endswith("+")
        if self.at < 0 or (spec and self.path is None and self.at < 1) or self.path == "":
            raise ValueError(f"{FAULT_ENV} must be N, N+ (N >= 1) or @PATH, got {spec!r}")

    def tick(self) -> None:
        self.calls += 1
        due = self.at and (self.calls == self.at or (self.sticky and self.calls > self.at))
        if due or (self.path is not None and os.path.exists(self.path)):
            raise InjectedFault(f"injected model-step failure at call {self.calls} ({FAULT_ENV})")


@contextmanager
def model_step() -> Iterator[None]:
    """Re-raise whatever fails inside as a ModelStepError (kept as is when it already is one)."""
    try:
        yield
    except ModelStepError:
        raise
    except Exception as e:
        raise ModelStepError(f"model step failed: {type(e).__name__}: {e}") from e
