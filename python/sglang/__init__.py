"""sglang, as provided by sglang-inkling: the server, the offline Engine and the frontend language."""

from __future__ import annotations

import importlib

from sglang.lang.exports import API_NAMES

__version__ = "0.1.0"

# Public name -> module that defines it. Lazy: `import sglang` must stay cheap for the CLI and
# spawned children, and the frontend's chat rendering pulls in torch through tml-renderers.
_EXPORTS: dict[str, str] = {
    "Engine": "sgl_inkling.entrypoints.engine",
    "Runtime": "sglang.lang.backend.runtime",
    "RuntimeEndpoint": "sglang.lang.backend.runtime_endpoint",
    "ProgramState": "sglang.lang.state",
    "SglFunction": "sglang.lang.function",
    "global_config": "sglang.lang.global_config",
    **dict.fromkeys(API_NAMES, "sglang.lang.api"),
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sglang' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = ["__version__", *_EXPORTS]
