"""Process-wide frontend settings (upstream keeps the default backend here too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GlobalConfig:
    default_backend: Any = None  # a backend, or a Runtime (its endpoint is used)


global_config = GlobalConfig()
