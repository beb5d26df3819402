"""One shared inkling-tiny server for the end-to-end tests (starting one costs ~15 s on CPU)."""

from __future__ import annotations

import pytest

from .server import ServerProcess


@pytest.fixture(scope="session")
def server(tiny_path):
    s = ServerProcess("--skip-server-warmup")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def draftable():
    """inkling-tiny-draftable (MTP tests): drafts are right often, not always."""
    from sgl_inkling.models.inkling.tiny_draftable import ensure_draftable_checkpoint

    return str(ensure_draftable_checkpoint())
