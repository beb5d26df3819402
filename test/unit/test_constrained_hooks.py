"""The scheduler hooks on stand-in requests: masks in a mixed batch, finishing and failing requests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import xgrammar as xgr

from sgl_inkling.chat.tokenizer import get_tokenizer
from sgl_inkling.constrained import GrammarSpec, native_grammar
from sgl_inkling.constrained import scheduler_hooks as hooks
from sgl_inkling.constrained.mask import GrammarMasker, unpack_bitmask
from sgl_inkling.sampling.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


@pytest.fixture(scope="module")
def backend(tok):
    return hooks.create_backend(SimpleNamespace(), tok, tok.vocab_size)


def new_req(backend, spec):
    req = SimpleNamespace(output_ids=[], finished_reason=None)
    hooks.on_new_request(backend, req, SimpleNamespace(grammar=spec))
    return req


def sample(req, logits_row, tok_id=None):
    """What the scheduler does after sampling: append, check_finished (stand-in), after_token."""
    t = int(logits_row.argmax()) if tok_id is None else tok_id
    req.output_ids.append(t)
    hooks.after_token(req, t)
    return t


def regex_spec(tok, pattern):
    return native_grammar(tok, SamplingParams(regex=pattern), tok.encode("x"))


def test_create_backend_choices(tok):
    assert hooks.create_backend(SimpleNamespace(grammar_backend="none"), tok, tok.vocab_size) is None
    with pytest.raises(ValueError, match="grammar-backend"):
        hooks.create_backend(SimpleNamespace(grammar_backend="outlines"), tok, tok.vocab_size)


def test_mixed_batch_masks_only_constrained_rows(tok, backend):
    reqs = [new_req(backend, regex_spec(tok, "[0-9]{2}")), new_req(backend, None)]
    logits = torch.randn(2, tok.vocab_size)
    before = logits.clone()
    hooks.apply_grammar_masks(backend, reqs, logits)
    assert torch.equal(logits[1], before[1])  # the unconstrained row is untouched
    bitmask = torch.empty(1, (tok.vocab_size + 31) // 32, dtype=torch.int32)
    reqs[0].grammar.fill(bitmask, 0)
    allowed = unpack_bitmask(bitmask, tok.vocab_size)[0]
    assert torch.equal(torch.isfinite(logits[0]), allowed)
    assert torch.equal(logits[0][allowed], before[0][allowed])


def test_requests_finish_when_their_grammar_ends(tok, backend):
    req = new_req(backend, regex_spec(tok, "[0-9]{2}"))
    for _ in range(4):
        logits = torch.randn(1, tok.vocab_size)
        hooks.apply_grammar_masks(backend, [req], logits)
        sample(req, logits[0])
        if req.finished_reason:
            break
    assert req.finished_reason == {"type": "stop", "matched": req.output_ids[-1]}
    assert req.output_ids[-1] in tok.eos_token_ids
    assert tok.decode(req.output_ids, skip_special_tokens=True).isdigit()
    # A finish the scheduler already decided (a stop token, the length) is kept.
    other = new_req(backend, regex_spec(tok, "a"))
    other.finished_reason = {"type": "length", "length": 1}
    sample(other, None, tok.encode("a")[0])
    assert other.finished_reason["type"] == "length"


def test_compile_failure_and_rejected_token_abort_with_400(tok, backend):
    broken = new_req(backend, GrammarSpec('{"type": "structural_tag", "format": {"type": "nope"}}', "ebnf"))
    logits = torch.randn(1, tok.vocab_size)
    hooks.apply_grammar_masks(backend, [broken], logits)  # unmaskable: left as is, then aborted
    sample(broken, logits[0])
    assert broken.finished_reason["type"] == "abort" and broken.finished_reason["status_code"] == 400
    assert "could not be compiled" in broken.finished_reason["message"]

    req = new_req(backend, regex_spec(tok, "[0-9]"))
    sample(req, None, tok.encode("z")[0])  # as if the mask had been bypassed
    assert req.finished_reason["type"] == "abort" and "does not fit" in req.finished_reason["message"]


def test_no_backend_refuses_grammar_requests(tok):
    req = new_req(None, regex_spec(tok, "a"))
    hooks.apply_grammar_masks(None, [req], torch.zeros(1, 4))
    sample(req, None, 0)
    assert "--grammar-backend none" in req.finished_reason["message"]
    plain = new_req(None, None)
    sample(plain, None, 0)
    assert plain.finished_reason is None and hooks.grammar_stats(None) == {}


def test_cpu_mask_matches_xgrammars_kernel():
    vocab = 1000
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, (vocab + 31) // 32), dtype=torch.int32)
    bitmask[1] = 0
    for rows in ([0, 1, 2, 3], [1, 3]):
        ours, ref = torch.randn(4, vocab), None
        ref = ours.clone()
        GrammarMasker(vocab)._apply_kernel(ours, bitmask, rows)
        xgr.apply_token_bitmask_inplace(ref, bitmask, vocab_size=vocab, indices=rows, backend="cpu")
        assert torch.equal(ours, ref)
