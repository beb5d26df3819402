"""`sglang.Engine`: the runtime without HTTP, for offline use from Python (sync and async)."""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from sgl_inkling.entrypoints.subprocesses import start_backend
from sgl_inkling.managers.io_struct import GenerateReqInput
from sgl_inkling.managers.tokenizer_manager import TokenizerManager
from sgl_inkling.model_resolution import resolve_model_path
from sgl_inkling.models.inkling.quant_config import check_quantization
from sgl_inkling.server_args import ServerArgs


class Engine:
    """Start the scheduler and detokenizer processes; the tokenizer manager runs on a private loop."""

    def __init__(self, **kwargs: Any):
        if "model" in kwargs and "model_path" not in kwargs:
            kwargs["model_path"] = kwargs.pop("model")
        kwargs.setdefault("log_level", "error")
        self.server_args = ServerArgs(**kwargs)
        self.server_args.check()
        a = self.server_args
        model_path = resolve_model_path(a.model_path, a.revision, a.download_dir)
        check_quantization(a.quantization, model_path, a.load_format)
        self.backend = start_backend(self.server_args, str(model_path))
        self.backend.info["model_path"] = str(model_path)
        self.tm = TokenizerManager(
            self.server_args,
            self.backend.info,
            self.backend.addrs["scheduler"],
            self.backend.addrs["tokenizer"],
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="engine-loop")
        self._thread.start()
        self._call(self.tm.start())
        atexit.register(self.shutdown)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @staticmethod
    def _request(prompt, sampling_params, input_ids, **kw) -> GenerateReqInput:
        return GenerateReqInput(text=prompt, input_ids=input_ids, sampling_params=sampling_params, **kw)

    async def _collect(self, obj: GenerateReqInput):
        async for out in self.tm.generate_request(obj):
            return out

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> dict | list[dict] | Iterator[dict]:
        obj = self._request(prompt, sampling_params, input_ids, stream=stream, **kwargs)
        if not stream:
            return self._call(self._collect(obj))
        return self._stream_sync(obj)

    def _stream_sync(self, obj: GenerateReqInput) -> Iterator[dict]:
        agen = self.tm.generate_request(obj, incremental=self.server_args.incremental_streaming_output)
        while True:
            try:
                yield self._call(anext(agen))
            except StopAsyncIteration:
                return

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> dict | list[dict] | AsyncIterator[dict]:
        """Awaitable from any event loop: the work runs on the engine's own loop."""
        obj = self._request(prompt, sampling_params, input_ids, stream=stream, **kwargs)
        if not stream:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._collect(obj), self._loop))
        return self._stream_async(obj)

    async def _stream_async(self, obj: GenerateReqInput) -> AsyncIterator[dict]:
        agen = self.tm.generate_request(obj, incremental=self.server_args.incremental_streaming_output)
        while True:
            fut = asyncio.run_coroutine_threadsafe(anext(agen), self._loop)
            try:
                yield await asyncio.wrap_future(fut)
            except StopAsyncIteration:
                return

    def get_server_info(self) -> dict:
        return {**self.backend.info, "internal_states": [self._call(self.tm.get_internal_state())]}

    def shutdown(self) -> None:
        if getattr(self, "backend", None) is not None:
            self.backend.shutdown()
            self.backend = None
            self._call(self.tm.stop())
            self._loop.call_soon_threadsafe(self._loop.stop)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
