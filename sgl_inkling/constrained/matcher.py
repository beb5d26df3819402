"""One request's grammar state: an xgrammar matcher behind the future of its compiled grammar."""

from __future__ import annotations

import logging
from concurrent.futures import Future

import torch
import xgrammar as xgr

from sgl_inkling.constrained.spec import GrammarSpec

logger = logging.getLogger(__name__)


class RequestGrammar:
    """Follows the tokens a request generates; fills its row of the batch bitmask.

    The grammar compiles in the background while the prompt is prefilled; the first call that needs
    the matcher waits for it. A grammar that failed to compile, or a token the grammar rejects,
    puts the request in `error` (the scheduler then aborts it with that message).
    """

    def __init__(self, spec: GrammarSpec, compiled: Future) -> None:
        self.spec = spec
        self._compiled = compiled
        self._matcher: xgr.GrammarMatcher | None = None
        self.error: str | None = None
        self.num_accepted = 0  # tokens accepted since the start (rollback bound)

    def matcher(self) -> xgr.GrammarMatcher | None:
        if self._matcher is None and self.error is None:
            try:
                self._matcher = xgr.GrammarMatcher(self._compiled.result())
            except Exception as e:  # compile failures reach the client as an abort message
                self.error = f"the {self.spec.kind} grammar could not be compiled: {e}"
                logger.warning("grammar compile failed: %s", e)
        return self._matcher

    @property
    def active(self) -> bool:
        """Whether this request's next token must be masked."""
        m = self.matcher()
        return m is not None and not m.is_terminated()

    @property
    def terminated(self) -> bool:
        m = self._matcher
        return m is not None and m.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        m = self.matcher()
        assert m is not None
        m.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        m = self.matcher()
        if m is None:
            return False
        if not m.accept_token(int(token_id)):
            self.error = f"the sampled token {token_id} does not fit the {self.spec.kind} grammar"
            return False
        self.num_accepted += 1
        return True

    def accept_many(self, token_ids: list[int]) -> int:
        """Accept tokens in order until one is rejected; how many were accepted (draft verification)."""
        m = self.matcher()
        n = 0
        for t in token_ids:
            if m is None or m.is_terminated() or not m.accept_token(int(t)):
                break
            n += 1
        self.num_accepted += n
        return n

    def rollback(self, num_tokens: int) -> None:
        """Forget the last num_tokens accepted tokens (rejected speculative drafts)."""
        if num_tokens <= 0:
            return
        if num_tokens > self.num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} tokens; only {self.num_accepted} were accepted")
        m = self.matcher()
        assert m is not None
        m.rollback(num_tokens)
        self.num_accepted -= num_tokens
