"""The detokenizer process: turns each request's new token ids into new text, incrementally."""

from __future__ import annotations

import zmq

from sgl_inkling.chat.tokenizer import IncrementalDetokenizer, get_tokenizer
from sgl_inkling.managers import io_struct as io


class DetokenizerManager:
    def __init__(self, tokenizer_path: str | None, recv_addr: str, send_addr: str):
        self.tokenizer = get_tokenizer(tokenizer_path)
        ctx = zmq.Context.instance()
        self.recv_sock = ctx.socket(zmq.PULL)
        self.recv_sock.bind(recv_addr)
        self.send_sock = ctx.socket(zmq.PUSH)
        self.send_sock.connect(send_addr)
        self.states: dict[str, IncrementalDetokenizer] = {}

    def event_loop(self) -> None:
        while True:
            msg = self.recv_sock.recv_pyobj()
            if isinstance(msg, io.BatchTokenOut):
                msg = io.BatchStrOut(tokens=msg, new_texts=self.detokenize(msg))
            # Control replies (internal state, flush) pass through unchanged.
            self.send_sock.send_pyobj(msg)

    def detokenize(self, out: io.BatchTokenOut) -> list[str]:
        texts = []
        for rid, ids, reason, skip in zip(
            out.rids, out.new_token_ids, out.finished_reasons, out.skip_special_tokens
        ):
            state = self.states.get(rid)
            if state is None:
                state = self.states[rid] = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=skip)
            text = state.feed(ids)
            if reason is not None:
                text += state.finish()
                del self.states[rid]
            texts.append(text)
        return texts
