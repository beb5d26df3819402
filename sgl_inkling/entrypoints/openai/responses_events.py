"""Responses API streaming events from chat stream deltas.

An output item opens with its first delta (output_item.added, content_part.added), grows by delta
events, and closes (the *.done events, output_item.done) when a delta of another item starts or the
stream ends; every event carries the next sequence_number.
"""

from __future__ import annotations

from typing import Any

from sgl_inkling.entrypoints.openai.protocol import ChatCompletionStreamChoice, random_id
from sgl_inkling.entrypoints.openai.serving_base import sse

_TEXT = {  # item kind -> (id prefix, content part type, delta/done event prefix)
    "reasoning": ("rs_", "reasoning_text", "response.reasoning_text"),
    "message": ("msg_", "output_text", "response.output_text"),
}


class EventWriter:
    def __init__(self) -> None:
        self.seq = 0
        self.index = -1  # output_index of the open item
        self.open: dict[str, Any] | None = None  # the open item, as output_item.added announced it
        self.text = ""  # the open item's text or arguments so far
        self.ids: dict[str, str] = {}  # "reasoning" / "message" / a tool call id -> its item id
        self.call_ids: list[str] = []  # the streamed tool calls' ids, in order

    def emit(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **fields})

    def delta(self, part: ChatCompletionStreamChoice) -> list[str]:
        d, out = part.delta, []
        if d.reasoning_content:
            out += self._text("reasoning", d.reasoning_content)
        if d.content:
            out += self._text("message", d.content)
        for tc in d.tool_calls or []:
            if tc.id is not None:
                out += self._open_call(tc.id, tc.function.name or "")
            if tc.function.arguments and self.open is not None and self.open["type"] == "function_call":
                self.text += tc.function.arguments
                out.append(self.emit("response.function_call_arguments.delta", item_id=self.open["id"],
                                     output_index=self.index, delta=tc.function.arguments))  # fmt: skip
        return out

    def _start(self, item: dict[str, Any]) -> list[str]:
        out = self.close_all()
        self.index += 1
        self.open, self.text = item, ""
        return out + [self.emit("response.output_item.added", output_index=self.index, item=dict(item))]

    def _text(self, kind: str, text: str) -> list[str]:
        prefix, part, event = _TEXT[kind]
        out = []
        if self.open is None or self.open["type"] != kind:
            self.ids[kind] = item_id = random_id(prefix)
            item = {"type": kind, "id": item_id, "status": "in_progress", "content": []}
            item.update({"summary": []} if kind == "reasoning" else {"role": "assistant"})
            out += self._start(item)
            out.append(self.emit("response.content_part.added", item_id=item_id, output_index=self.index,
                                 content_index=0, part=self._part(part, "")))  # fmt: skip
        self.text += text
        extra = {"logprobs": []} if kind == "message" else {}
        out.append(self.emit(f"{event}.delta", item_id=self.open["id"], output_index=self.index, content_index=0,
                             delta=text, **extra))  # fmt: skip
        return out

    def _open_call(self, call_id: str, name: str) -> list[str]:
        self.ids[call_id] = item_id = random_id("fc_")
        self.call_ids.append(call_id)
        item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": "",
                "status": "in_progress"}  # fmt: skip
        return self._start(item)

    @staticmethod
    def _part(kind: str, text: str) -> dict[str, Any]:
        return {"type": kind, "text": text, **({"annotations": [], "logprobs": []} if kind == "output_text" else {})}

    def close_all(self) -> list[str]:
        item, text = self.open, self.text
        if item is None:
            return []
        self.open, out = None, []
        done = {**item, "status": "completed"}
        if item["type"] == "function_call":
            done["arguments"] = text
            out.append(self.emit("response.function_call_arguments.done", item_id=item["id"],
                                 output_index=self.index, name=item["name"], arguments=text))  # fmt: skip
        else:
            _, part, event = _TEXT[item["type"]]
            extra = {"logprobs": []} if item["type"] == "message" else {}
            out.append(self.emit(f"{event}.done", item_id=item["id"], output_index=self.index, content_index=0,
                                 text=text, **extra))  # fmt: skip
            out.append(self.emit("response.content_part.done", item_id=item["id"], output_index=self.index,
                                 content_index=0, part=self._part(part, text)))  # fmt: skip
            done["content"] = [self._part(part, text)]
        out.append(self.emit("response.output_item.done", output_index=self.index, item=done))
        return out
