"""Upstream's older import path for the frontend API (`from sglang.api import gen, ...`)."""

from sglang.lang.api import *  # noqa: F403
from sglang.lang.api import __all__ as _lang_all
from sglang.lang.backend.runtime import Runtime
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

__all__ = [*_lang_all, "Runtime", "RuntimeEndpoint"]
