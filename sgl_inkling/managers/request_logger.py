"""--log-requests: one log line when a request is received and one when it finishes.

The verbosity follows upstream's --log-requests-level: 0 metadata only, 1 and the sampling params,
2 and the first 2048 characters of the input and output, 3 all of them.
"""

from __future__ import annotations

import dataclasses
import logging

logger = logging.getLogger("sglang.requests")
_PARTIAL = 2048


class RequestLogger:
    def __init__(self, level: int):
        self.level = level
        logger.setLevel(logging.INFO)  # the flag asks for these lines whatever --log-level says

    def _clip(self, value) -> str:
        text = value if isinstance(value, str) else repr(value)
        if self.level == 2 and len(text) > _PARTIAL:
            return text[:_PARTIAL] + f"... ({len(text) - _PARTIAL} more characters)"
        return text

    def received(self, tok, obj, st) -> None:
        parts = [f"rid={tok.rid}", f"prompt_tokens={len(tok.input_ids)}", f"stream={tok.stream}"]
        if self.level >= 1:
            sp = tok.sampling_params
            params = dataclasses.asdict(sp) if dataclasses.is_dataclass(sp) else sp
            parts.append(f"sampling_params={params}")
        if self.level >= 2:
            prompt = obj.text if isinstance(obj.text, str) else tok.input_ids
            parts.append(f"input={self._clip(prompt)}")
        logger.info("Receive: %s", " ".join(parts))

    def output(self, rid: str, st, n_new: int) -> None:
        pass  # one line per request at each end, none per chunk

    def finished(self, rid: str, st, result: dict) -> None:
        meta = result["meta_info"]
        parts = [
            f"rid={rid}",
            f"finish_reason={meta.get('finish_reason')}",
            f"prompt_tokens={meta['prompt_tokens']}",
            f"completion_tokens={meta['completion_tokens']}",
            f"cached_tokens={meta['cached_tokens']}",
            f"e2e_latency={meta['e2e_latency']:.3f}",
        ]
        if self.level >= 2:
            parts.append(f"output={self._clip(result['text'])}")
        logger.info("Finish: %s", " ".join(parts))
