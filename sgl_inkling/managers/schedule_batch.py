"""A request as the scheduler tracks it between arrival and finish."""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from typing import Any

from sgl_inkling.managers.io_struct import TokenizedGenerateReq

try:
    import re._parser as re_parser
except ImportError:  # Python 3.10
    import sre_parse as re_parser


@dataclass(eq=False)  # identity semantics: requests are hashed and compared by object
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: Any
    stop_token_ids: set[int]
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    output_ids: list[int] = field(default_factory=list)
    row: int | None = None  # req-to-token row and short-conv slot while it holds memory
    kv_len: int = 0  # tokens of fill_ids whose KV and conv state are in the caches
    swa_released: int = 0  # sliding-window slots of positions below this were freed
    cached_tokens: int = 0
    finished_reason: dict | None = None
    stop_str: str | None = None
    # Pending output for the next BatchTokenOut.
    new_tokens: list[int] = field(default_factory=list)
    new_logprobs: list[tuple[float, int]] = field(default_factory=list)
    new_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[tuple[float | None, int]] | None = None
    input_lp_partial: list[tuple[float | None, int]] = field(default_factory=list)  # across chunks
    num_retractions: int = 0
    # Prefix cache: [0, owned) of the tables belongs to the radix tree (locked at last_node).
    owned: int = 0
    last_node: Any = None
    divergence: int | None = None  # longest cached match when it had no checkpoint: snapshot there
    resume_point: int = -1  # where a repeat resumes (len - 1 of its cache key): snapshot there
    wait_seq: int = 0  # arrival order (the prefix cache keeps the earliest waiters' prefixes longest)
    pending_ckpts: dict[int, int] = field(default_factory=dict)  # position -> snapshot slot, not yet cached
    admitted_once: bool = False
    arrival: float = field(default_factory=time.monotonic)
    queue_time: float | None = None  # arrival to first admission, seconds (sglang:queue_time_seconds)
    stream: bool = False  # streamed outputs go out every --stream-interval tokens, others when done
    grammar: Any = None  # RequestGrammar when the output is constrained
    # MTP speculative decoding (speculative/mtp_worker.py).
    kv_reserved: int = 0  # KV slots held past kv_len for the next verify's tokens
    draft_masks: Any = None  # grammar bitmask per verify row, for constrained requests
    draft_limit: int = 0  # most drafts this request may accept in the next verify
    draft_count: int = 0  # drafts in its draft_buf row for the next verify (the k chosen when drafted)
    draft_open: bool = False  # the grammar still constrains the next draft
    draft_tentative: int = 0  # drafts the grammar accepted tentatively (rolled back after drafting)
    # MTP (speculative/lagging.py): the last depth_lag committed tokens are not yet consumed by depths
    # lag_from.. (0: all of them, after plain decode steps; k: the ones past a step's k drafting depths)
    depth_lag: int = 0
    lag_from: int = 0
    spec_verify_ct: int = 0
    spec_accepted_drafts: int = 0
    mm_items: list | None = None  # sgl_inkling.multimodal.MediaItem, by prompt position
    mm_embeds: dict = field(default_factory=dict)  # item index -> tower output, while prefill needs it
    _mm_key: list[int] | None = None

    @classmethod
    def from_tokenized(cls, r: TokenizedGenerateReq) -> Req:
        return cls(
            rid=r.rid,
            origin_input_ids=list(r.input_ids),
            sampling_params=r.sampling_params,
            stop_token_ids=set(r.stop_token_ids),
            return_logprob=r.return_logprob,
            logprob_start_len=r.logprob_start_len,
            top_logprobs_num=r.top_logprobs_num,
            mm_items=r.mm_items,
            stream=r.stream,
        )

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def cache_key(self) -> list[int]:
        """fill_ids as the radix tree keys them: media placeholders carry their content's hash."""
        if not self.mm_items:
            return self.fill_ids
        if self._mm_key is None:
            from sgl_inkling.multimodal.items import cache_key

            self._mm_key = cache_key(self.origin_input_ids, self.mm_items)
        return self._mm_key + self.output_ids

    @property
    def queued(self) -> bool:
        """Waiting for admission (arrived or retracted, holding no memory, not finished)."""
        return self.row is None and self.finished_reason is None

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0 and self.input_logprobs is None

    def check_finished(self, tokenizer) -> None:
        """Set finished_reason after a new token: stop ids, length, stop strings."""
        sp = self.sampling_params
        last = self.output_ids[-1]
        if not sp.ignore_eos and last in self.stop_token_ids:
            self.finished_reason = {"type": "stop", "matched": last}
        elif sp.stop_token_ids and last in sp.stop_token_ids:
            self.finished_reason = {"type": "stop", "matched": last}
        elif len(self.output_ids) >= sp.max_new_tokens:
            self.finished_reason = {"type": "length", "length": sp.max_new_tokens}
        else:
            self._check_stop_text(tokenizer)

    def _check_stop_text(self, tokenizer) -> None:
        """Stop strings, then stop patterns, over the decoded tail of the output (as SGLang).

        `stop_str` is what the tokenizer manager cuts the text at, at its first occurrence: the stop
        string, or, as SGLang reports it, a pattern's own source (so a match stays in the text unless
        the pattern is literal text that occurs in it).
        """
        sp = self.sampling_params
        stops = [s for s in sp.stop_strs if s]
        if stops:
            # A stop string spans at most its length in tokens; decode that tail only.
            tail = tokenizer.decode(self.output_ids[-(max(len(s) for s in stops) + 8) :])
            for s in stops:
                if s in tail:
                    self.finished_reason = {"type": "stop", "matched": s}
                    self.stop_str = s
                    return
        patterns = sp.stop_regexes
        if patterns:
            tail = tokenizer.decode(self.output_ids[-stop_regex_tail(patterns) :])
            for pattern in patterns:
                if re.search(pattern, tail):
                    self.finished_reason = {"type": "stop", "matched": pattern}
                    self.stop_str = pattern
                    return


@functools.lru_cache(maxsize=1024)
def _regex_width(pattern: str) -> int:
    return re_parser.parse(pattern).getwidth()[1]


def stop_regex_tail(patterns: list[str]) -> int:
    """Output tokens to decode so that any match of the patterns ending at the last token is seen:
    a character takes at most 4 tokens (one per UTF-8 byte); an unbounded pattern needs everything."""
    width = max(_regex_width(p) for p in patterns)
    return 0 if width > 1 << 20 else 4 * width + 8  # [-0:] is the whole output
