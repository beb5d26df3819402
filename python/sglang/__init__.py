"""sglang, as provided by sglang-inkling: the server, the offline Engine and (soon) the frontend language."""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: `import sglang` must stay cheap for the CLI and spawned children.
    if name == "Engine":
        from sgl_inkling.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'sglang' has no attribute {name!r}")


__all__ = ["Engine", "__version__"]
