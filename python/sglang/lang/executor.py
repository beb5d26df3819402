"""StreamExecutor: interprets one program state's expressions, in order, on its own worker thread.

`s += expr` only queues the expression, so the program's Python code runs ahead while the server
works; reading a variable (`s["x"]`) waits for it. Forked states get their own workers, which is
what makes `fork` parallel. With `use_thread=False` (run_batch, where a thread pool already gives
the parallelism) expressions run as they are submitted.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from sglang.lang.backend.base_backend import BaseBackend
from sglang.lang.chat import ChatProgramError, ChatTranscript
from sglang.lang.generate import gen_prompt, run_gen, run_select, select_prompts
from sglang.lang.ir import (
    SglConstantText,
    SglExpr,
    SglExprList,
    SglGen,
    SglMedia,
    SglRoleBegin,
    SglRoleEnd,
    SglSamplingParams,
    SglSelect,
)
from sglang.lang.media import PLACEHOLDER_TEXT, Media
from sglang.lang.variables import VariableStore


class ProgramError(RuntimeError):
    """An expression of the program failed; `__cause__` is the original error."""


class StreamExecutor:
    def __init__(
        self,
        backend: BaseBackend,
        arguments: dict[str, Any],
        default_sampling: SglSamplingParams,
        stream: bool = False,
        use_thread: bool = True,
    ):
        self.backend = backend
        self.arguments = dict(arguments)
        self.default_sampling = default_sampling
        self.stream = stream
        self.use_thread = use_thread
        self.vars = VariableStore()
        self.chat: ChatTranscript | None = None
        self.error_: BaseException | None = None
        self.is_finished = False
        self.fork_start_text_pos = 0
        self.stream_text_event = threading.Event()
        self._raw_text = ""
        self.media: list[Media] = []  # every image/clip so far, in prompt order
        self._lock = threading.RLock()  # guards text and chat against readers on other threads
        self._ended = False
        self._queue: queue.Queue | None = None
        if use_thread:
            self._queue = queue.Queue()
            threading.Thread(target=self._work, daemon=True, name="sgl-program").start()

    # ---------------------------------------------------------------- submission

    def submit(self, expr: SglExpr) -> None:
        if self._ended:
            raise ProgramError("this program state has finished; it accepts no more expressions")
        if self._queue is not None:
            self._queue.put(expr)
            return
        try:
            self._execute(expr)
        except BaseException as e:
            self.fail(e)
            raise

    def sync(self) -> None:
        if self._queue is not None:
            self._queue.join()

    def end(self) -> None:
        """No more expressions: the worker finishes what is queued, then marks the state finished."""
        if self._ended:
            return
        self._ended = True
        if self._queue is not None:
            self._queue.put(None)
        else:
            self._mark_finished()

    def _work(self) -> None:
        while True:
            expr = self._queue.get()
            try:
                if expr is not None and self.error_ is None:
                    self._execute(expr)
            except BaseException as e:  # recorded; reads of the state raise it
                self.fail(e)
            finally:
                if expr is None:
                    self._mark_finished()
                self._queue.task_done()
            if expr is None:
                return

    def _wake_all(self) -> None:
        self.vars.wake_all()
        self.stream_text_event.set()

    def fail(self, e: BaseException) -> None:
        self.error_ = e
        self._wake_all()

    def _mark_finished(self) -> None:
        self.is_finished = True
        self._wake_all()

    # ---------------------------------------------------------------- variables

    @property
    def variables(self) -> dict[str, Any]:
        return self.vars.values

    @property
    def meta_info(self) -> dict[str, dict[str, Any]]:
        return self.vars.meta_info

    def stream_event(self, name: str) -> threading.Event:
        return self.vars.updated_event(name)

    def is_var_done(self, name: str) -> bool:
        return self.vars.is_done(name)

    def set_var(self, name: str, value: Any, final: bool = True) -> None:
        self.vars.set(name, value, final)

    def get_var(self, name: str) -> Any:
        if self._queue is not None:
            self.vars.wait(name, lambda: self.error_ is not None or self.is_finished)
        if self.vars.is_done(name) and name in self.variables:
            return self.variables[name]
        self.raise_if_failed()
        raise KeyError(f"the program has no variable {name!r}")

    def raise_if_failed(self) -> None:
        if self.error_ is not None:
            raise ProgramError(f"the program failed: {self.error_}") from self.error_

    # ---------------------------------------------------------------- text

    @property
    def text_(self) -> str:
        with self._lock:
            return self._raw_text if self.chat is None else self.chat.text()

    def _append_text(self, text: str) -> None:
        with self._lock:
            if self.chat is None:
                self._raw_text += text
            else:
                self.chat.append(text)
        self.stream_text_event.set()

    # ---------------------------------------------------------------- interpretation

    def _execute(self, expr: SglExpr) -> None:
        if isinstance(expr, SglExprList):
            for e in expr.exprs:
                self._execute(e)
        elif isinstance(expr, SglConstantText):
            self._append_text(expr.value)
        elif isinstance(expr, SglRoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, SglRoleEnd):
            with self._lock:
                if self.chat is None:
                    raise ChatProgramError(f"{expr.role}_end() without {expr.role}_begin()")
                self.chat.end(expr.role)
            self.stream_text_event.set()
        elif isinstance(expr, SglMedia):
            self._media(Media(expr.kind, expr.url))
        elif isinstance(expr, SglGen):
            self._gen(expr)
        elif isinstance(expr, SglSelect):
            self._select(expr)
        else:
            raise TypeError(f"unsupported expression {expr!r}")

    def _role_begin(self, role: str) -> None:
        with self._lock:
            if self.chat is None:
                if self._raw_text:
                    raise ChatProgramError(
                        "a chat role after plain text: TMLv0 has no place for text outside a message; "
                        "put the text inside sgl.system/user/assistant(...)"
                    )
                self.chat = ChatTranscript(reasoning_effort=getattr(self.backend, "reasoning_effort", None))
            self.chat.begin(role)
        self.stream_text_event.set()

    def _media(self, item: Media) -> None:
        with self._lock:
            if self.chat is None:
                self._raw_text += PLACEHOLDER_TEXT[item.kind]
            else:
                self.chat.add_media(item)
            self.media.append(item)
        self.stream_text_event.set()

    def _gen(self, expr: SglGen) -> None:
        params = expr.sampling.merged_over(self.default_sampling)
        prompt = gen_prompt(self.chat, self._raw_text, self.media)
        base = self._raw_text if self.chat is None else self.chat.content

        def show(partial: str) -> None:
            with self._lock:
                if self.chat is None:
                    self._raw_text = base + partial
                else:
                    self.chat.content = base + partial
            if expr.name:
                self.set_var(expr.name, partial, final=False)
            self.stream_text_event.set()

        result = run_gen(
            self.backend, prompt, params, stream=self.stream, on_text=show if self.stream else None
        )
        with self._lock:
            if self.chat is None:
                self._raw_text = base + result.text
            else:
                self.chat.content = base + result.text
            if expr.name:
                self.meta_info[expr.name] = result.meta_info
        if expr.name:
            self.set_var(expr.name, result.text)
        self.stream_text_event.set()

    def _select(self, expr: SglSelect) -> None:
        prompt_ids, full = select_prompts(self.chat, self._raw_text, expr.choices, bool(self.media))
        decision = run_select(
            self.backend, prompt_ids, full, expr.choices, expr.choices_method, self.media
        )
        self._append_text(decision.decision)
        if expr.name:
            with self._lock:
                self.meta_info[expr.name] = decision.meta_info
            self.set_var(expr.name, decision.decision)

    # ---------------------------------------------------------------- fork

    def fork(self, size: int) -> list[StreamExecutor]:
        """Copies of this state as it is once everything queued so far has run."""
        self.sync()
        self.raise_if_failed()
        children = []
        for _ in range(size):
            child = StreamExecutor(self.backend, self.arguments, self.default_sampling, self.stream, True)
            with self._lock:
                child._raw_text = self._raw_text
                child.media = list(self.media)
                child.chat = self.chat.copy() if self.chat is not None else None
                child.meta_info.update(self.meta_info)
                variables = dict(self.variables)
            for name, value in variables.items():
                child.set_var(name, value)
            child.fork_start_text_pos = len(child._raw_text)
            children.append(child)
        return children
