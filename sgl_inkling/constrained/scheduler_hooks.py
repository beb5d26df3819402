"""The calls the scheduler makes into the grammar layer, and nothing else of it.

Wiring (scheduler.py):
- `__init__`: `self.grammar = create_backend(server_args, self.tokenizer, self.vocab)`
- `handle`: `on_new_request(self.grammar, req, msg)` for each new TokenizedGenerateReq
- `sample_and_advance`: `apply_grammar_masks(self.grammar, reqs, logits)` on the float logits before
  sampling, and `after_token(req, tok)` right after `req.check_finished(...)`
- `internal_state`: `**grammar_stats(self.grammar)`

A request's grammar lives on `req.grammar` (None when unconstrained); retraction keeps it, since the
request keeps its output tokens and the matcher has accepted exactly those.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch

from sgl_inkling.constrained.backend import XGrammarBackend
from sgl_inkling.constrained.matcher import RequestGrammar

GRAMMAR_BACKENDS = ("xgrammar", "none")


def create_backend(server_args: Any, tokenizer: Any, vocab_size: int) -> XGrammarBackend | None:
    """The backend `--grammar-backend` names (xgrammar unless set to "none")."""
    name = getattr(server_args, "grammar_backend", None) or "xgrammar"
    if name == "none":
        return None
    if name != "xgrammar":
        raise ValueError(f"--grammar-backend: {name!r} is not one of {', '.join(GRAMMAR_BACKENDS)}")
    return XGrammarBackend(tokenizer, vocab_size)


def on_new_request(backend: XGrammarBackend | None, req: Any, msg: Any) -> None:
    """Attach the request's grammar and start compiling it (it compiles while the prompt prefills)."""
    spec = getattr(msg, "grammar", None)
    if spec is None:
        req.grammar = None
    elif backend is None:
        refused: Future = Future()
        refused.set_exception(RuntimeError("this server runs with --grammar-backend none"))
        req.grammar = RequestGrammar(spec, refused)
    else:
        req.grammar = backend.new_request(spec)


def apply_grammar_masks(backend: XGrammarBackend | None, reqs: list[Any], logits: torch.Tensor) -> None:
    """Set the logits of every token the requests' grammars forbid to -inf, in place ([B, V])."""
    if backend is not None:
        backend.masker.apply([getattr(r, "grammar", None) for r in reqs], logits)


def after_token(req: Any, token_id: int) -> None:
    """Advance the request's grammar by its new token; finish the request when the grammar has ended
    (a stop token closed it) or failed (abort with the reason, which the client gets as a 400)."""
    grammar: RequestGrammar | None = getattr(req, "grammar", None)
    if grammar is None:
        return
    if grammar.error is None and not grammar.terminated:
        grammar.accept(token_id)
    if grammar.error is not None:
        req.finished_reason = {"type": "abort", "message": grammar.error, "status_code": 400}
    elif grammar.terminated and req.finished_reason is None:
        req.finished_reason = {"type": "stop", "matched": token_id}


def grammar_stats(backend: XGrammarBackend | None) -> dict[str, int]:
    return backend.stats() if backend is not None else {}
