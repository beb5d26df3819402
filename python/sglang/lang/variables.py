"""A program state's variables, and the events that let readers wait for them from other threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class VariableStore:
    """Values by name. A value is final once its gen finished; while streaming it grows (partial)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.meta_info: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._done: dict[str, threading.Event] = {}  # set when the value is final
        self._updated: dict[str, threading.Event] = {}  # set on every change (streaming readers)

    def _event(self, table: dict[str, threading.Event], name: str) -> threading.Event:
        with self._lock:
            ev = table.get(name)
            if ev is None:
                ev = table[name] = threading.Event()
            return ev

    def updated_event(self, name: str) -> threading.Event:
        return self._event(self._updated, name)

    def is_done(self, name: str) -> bool:
        return self._event(self._done, name).is_set()

    def set(self, name: str, value: Any, final: bool = True) -> None:
        with self._lock:
            self.values[name] = value
        self.updated_event(name).set()
        if final:
            self._event(self._done, name).set()

    def wait(self, name: str, give_up: Callable[[], bool]) -> bool:
        """Wait until the value is final; False if `give_up()` turns true first (failure, program end)."""
        done = self._event(self._done, name)
        # Polled, because failure and the end of the program do not set this variable's event.
        while not done.wait(0.05):
            if give_up():
                return done.is_set()
        return True

    def wake_all(self) -> None:
        with self._lock:
            for ev in (*self._done.values(), *self._updated.values()):
                ev.set()
