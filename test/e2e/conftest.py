"""One shared inkling-tiny server for the end-to-end tests (starting one costs ~15 s on CPU)."""

from __future__ import annotations

import pytest

from .server import ServerProcess


@pytest.fixture(scope="session")
def server(tiny_path):
    s = ServerProcess("--skip-server-warmup")
    yield s
    s.stop()
