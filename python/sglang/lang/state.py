"""ProgramState (the `s` a program writes to) and ProgramStateGroup (what `s.fork(n)` returns)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from sglang.lang.executor import ProgramError, StreamExecutor
from sglang.lang.ir import SglExpr, SglExprList, SglRoleBegin, SglRoleEnd, to_expr


class ProgramState:
    def __init__(self, stream_executor: StreamExecutor):
        self.stream_executor = stream_executor
        self.ret_value: Any = None

    # ---------------------------------------------------------------- writing

    def __iadd__(self, other: SglExpr | str) -> ProgramState:
        self.stream_executor.submit(to_expr(other))
        return self

    def _role(self, role: str, expr: SglExpr | str | None):
        if expr is not None:
            self.stream_executor.submit(SglExprList([SglRoleBegin(role), to_expr(expr), SglRoleEnd(role)]))
            return None
        return self._role_scope(role)

    @contextlib.contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self.stream_executor.submit(SglRoleBegin(role))
        yield
        self.stream_executor.submit(SglRoleEnd(role))

    def system(self, expr: SglExpr | str | None = None):
        """With content: append a system message. Without: `with s.system(): ...`."""
        return self._role("system", expr)

    def user(self, expr: SglExpr | str | None = None):
        return self._role("user", expr)

    def assistant(self, expr: SglExpr | str | None = None):
        return self._role("assistant", expr)

    # ---------------------------------------------------------------- reading

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.stream_executor.variables

    def get_var(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: str) -> dict[str, Any] | None:
        self.get_var(name)  # wait for it
        return self.stream_executor.meta_info.get(name)

    def text(self) -> str:
        """The whole prompt so far: plain text, or for chat programs the TMLv0 transcript."""
        self.sync()
        self.stream_executor.raise_if_failed()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, Any]]:
        """Finished chat messages, OpenAI style ({"role", "content"})."""
        self.sync()
        self.stream_executor.raise_if_failed()
        chat = self.stream_executor.chat
        return [dict(m) for m in chat.messages] if chat is not None else []

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> BaseException | None:
        return self.stream_executor.error_

    # ---------------------------------------------------------------- streaming

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """New text as it is generated (the whole text at once for a non-streaming run)."""
        exe = self.stream_executor
        if not exe.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        event = exe.stream_text_event if var_name is None else exe.stream_event(var_name)
        shown = 0
        while True:
            # A timeout, not a bare wait: a variable's event may be created after the program ended.
            event.wait(0.1)
            event.clear()
            # Read "done" before the text: everything written before it was set is then seen.
            done = (
                exe.is_finished
                or exe.error_ is not None
                or (var_name is not None and exe.is_var_done(var_name))
            )
            current = exe.text_ if var_name is None else str(exe.variables.get(var_name, ""))
            if len(current) > shown:
                yield current[shown:]
                shown = len(current)
            if done:
                break
        exe.raise_if_failed()

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        """`text_iter` for asyncio code: the blocking waits run in a worker thread."""
        it = self.text_iter(var_name)
        end = object()
        while True:
            chunk = await asyncio.to_thread(next, it, end)
            if chunk is end:
                return
            yield chunk

    # ---------------------------------------------------------------- fork

    def fork(self, size: int = 1, position_ids_offset: Sequence[int] | None = None) -> ProgramStateGroup:
        """`size` copies of this state that run independently (in parallel) until joined."""
        del position_ids_offset  # upstream's hint for a backend feature Inkling's server does not have
        return ProgramStateGroup([ProgramState(e) for e in self.stream_executor.fork(size)], self)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.stream_executor.end()

    def __repr__(self) -> str:
        return f"ProgramState({self.stream_executor.text_!r})"


class ProgramStateGroup:
    def __init__(self, states: list[ProgramState], src_state: ProgramState | None):
        self.states = states
        self.src_state = src_state

    def join(self, mode: str = "gather_variable") -> None:
        """Bring the branches back: collect their new variables as lists, or append their new text."""
        for s in self.states:
            s.sync()
            s.stream_executor.raise_if_failed()
        src = self.src_state
        if src is not None:
            src.sync()
            if mode == "gather_variable":
                self._gather_variables(src)
            elif mode == "concate_and_append":
                self._append_texts(src)
            else:
                raise ValueError(f"unknown join mode {mode!r}; use 'gather_variable' or 'concate_and_append'")
        for s in self.states:
            s.stream_executor.end()

    def _gather_variables(self, src: ProgramState) -> None:
        src_exe = src.stream_executor
        before = set(src_exe.variables)
        gathered: dict[str, list[Any]] = {}
        for s in self.states:
            for name, value in s.stream_executor.variables.items():
                if name not in before:
                    gathered.setdefault(name, []).append(value)
        for name, values in gathered.items():
            src_exe.set_var(name, values)

    def _append_texts(self, src: ProgramState) -> None:
        if any(s.stream_executor.chat is not None for s in self.states):
            raise ProgramError("join(mode='concate_and_append') works on plain-text programs only")
        src += "".join(s.text()[s.stream_executor.fork_start_text_pos :] for s in self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        # `forks[i] += x` assigns the (same) state back.
        if value is not self.states[i]:
            raise ValueError("a fork's state cannot be replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: SglExpr | str | Sequence[SglExpr | str]) -> ProgramStateGroup:
        """Append to every branch, or branch i gets other[i] when given one item per branch."""
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} items for {len(self.states)} branches")
            for s, item in zip(self.states, other):
                s += item
        else:
            for s in self.states:
                s += other
        return self
