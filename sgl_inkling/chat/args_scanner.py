"""Incremental scanner for a TMLv0 tool-call payload `{"name": "NAME", "args": {...}}`.

Streaming clients want the OpenAI `arguments` string as it is generated, long before the JSON is
complete enough to parse. This scanner follows the top-level object character by character and
hands back the raw text of the "args" object as it arrives. It never raises: on anything that is
not JSON it stops producing fragments (`broken`), and the complete block is judged later by
tml-renderers' parser.
"""

from __future__ import annotations

import json

_WS = " \t\r\n"


class ArgsScanner:
    def __init__(self) -> None:
        self._state = "start"
        self._key_chars: list[str] = []
        self._key = ""
        self._capture: str | None = None  # "args" | "name" | None: where the current value goes
        self._kind = ""  # current value: "container" | "string" | "scalar"
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._name_chars: list[str] = []
        self._args_chars: list[str] = []
        self._args_seen = False
        self.args_complete = False  # the "args" object has closed
        self.json_name: str | None = None  # the "name" value, once complete
        self.broken = False

    @property
    def closed(self) -> bool:
        """True once nothing more can change the outcome (object closed, or not JSON)."""
        return self.broken or self._state == "done"

    @property
    def args_text(self) -> str:
        return "".join(self._args_chars)

    def feed(self, text: str) -> str:
        """Consume more payload text; return the newly seen part of the raw "args" object."""
        before = len(self._args_chars)
        for c in text:
            if self.broken:
                break
            self._step(c)
        return "".join(self._args_chars[before:])

    def _step(self, c: str) -> None:
        state = self._state
        if state == "value":
            if self._value_char(c):
                return
            state = self._state  # a scalar ended on a delimiter: reprocess it below
        if c in _WS and state != "key":
            return
        if state == "start":
            self._expect(c == "{", "key_or_end")
        elif state == "key_or_end":
            if c == "}":
                self._state = "done"
            else:
                self._expect(c == '"', "key")
                self._key_chars = []
        elif state == "key":
            self._key_char(c)
        elif state == "colon":
            self._expect(c == ":", "value_start")
        elif state == "value_start":
            self._start_value(c)
        elif state == "after_value":
            if c == "}":
                self._state = "done"
            else:
                self._expect(c == ",", "key_or_end")
        else:  # "done": only whitespace may follow
            self.broken = True

    def _expect(self, ok: bool, next_state: str) -> None:
        if ok:
            self._state = next_state
        else:
            self.broken = True

    def _key_char(self, c: str) -> None:
        if self._escape:
            self._escape = False
        elif c == "\\":
            self._escape = True
        elif c == '"':
            try:
                self._key = json.loads('"' + "".join(self._key_chars) + '"')
            except ValueError:
                self.broken = True
                return
            self._state = "colon"
            return
        self._key_chars.append(c)

    def _start_value(self, c: str) -> None:
        self._capture = None
        if self._key == "args" and not self._args_seen and c == "{":
            self._capture = "args"
            self._args_seen = True
        elif self._key == "name" and c == '"':
            self._capture = "name"
            self._name_chars = []
        if c in "{[":
            self._kind, self._depth = "container", 1
        elif c == '"':
            self._kind, self._in_string = "string", True
        elif c in "-0123456789tfn":
            self._kind = "scalar"
        else:
            self.broken = True
            return
        self._escape = False
        self._record(c)
        self._state = "value"

    def _value_char(self, c: str) -> bool:
        """Advance inside a value; False when `c` is not part of it (a scalar's delimiter)."""
        if self._kind == "scalar" and (c in _WS or c in ",}]"):
            self._end_value()
            return False
        self._record(c)
        if self._in_string:
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
                if self._kind == "string":
                    self._end_value()
        elif self._kind == "container":
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._end_value()
        return True

    def _record(self, c: str) -> None:
        if self._capture == "args":
            self._args_chars.append(c)
        elif self._capture == "name":
            self._name_chars.append(c)

    def _end_value(self) -> None:
        if self._capture == "args":
            self.args_complete = True
        elif self._capture == "name":
            try:
                name = json.loads("".join(self._name_chars))
            except ValueError:
                name = None
            self.json_name = name if isinstance(name, str) else None
        self._capture = None
        self._state = "after_value"
