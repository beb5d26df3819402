"""Scheduler fault isolation in-process (issue 18 item 2): a step that raises fails the requests of
that step only, returns every slot they held (also those allocated for the forward that failed),
and a request the scheduler cannot run is refused alone on arrival."""

from __future__ import annotations

import pytest

from sgl_inkling.constrained import GrammarSpec
from sgl_inkling.managers.io_struct import TokenizedGenerateReq
from sgl_inkling.managers.scheduler import Scheduler
from sgl_inkling.model_executor.step_faults import FaultInjector, InjectedFault, ModelStepError
from sgl_inkling.sampling.sampling_params import SamplingParams
from sgl_inkling.server_args import ServerArgs

from .helpers import in_process_scheduler, random_prompt


@pytest.fixture(scope="module")
def sched(tiny_path, tmp_path_factory):
    args = ServerArgs(model_path=str(tiny_path), device="cpu", disable_radix_cache=True)
    with in_process_scheduler(args, tmp_path_factory) as s:
        yield s


def submit(s: Scheduler, rid: str, ids: list[int], grammar=None, **params) -> None:
    sp = SamplingParams.from_dict({"ignore_eos": True, "temperature": 0, **params})
    s.handle(TokenizedGenerateReq(rid=rid, input_ids=list(ids), sampling_params=sp, grammar=grammar))


def run_step(s: Scheduler) -> list:
    """One event-loop iteration without the sockets; the requests it sent out."""
    try:
        s.step()
    except Exception as e:
        s.fail_step(e)
    out = list(dict.fromkeys(s.outbox))
    s.outbox.clear()
    for r in out:
        r.new_tokens = []
    return out


def idle(s: Scheduler) -> bool:
    st = s.kv.stats()
    return all(st[f"{k}_available"] == st[f"{k}_total"] for k in ("full_kv", "swa_kv", "req_slots"))


def test_failing_prefill_batch_fails_only_its_requests(sched, monkeypatch):
    s = sched
    submit(s, "a", random_prompt(30, seed=1), max_new_tokens=12)
    run_step(s)
    a = s.running[0]
    submit(s, "b", random_prompt(40, seed=2), max_new_tokens=4)

    real = s.runner.forward

    def forward(fb):  # the prefill of b raises; a's decode steps run
        if len(fb.input_ids) > 1:
            raise ModelStepError("model step failed: RuntimeError: boom")
        return real(fb)

    monkeypatch.setattr(s.runner, "forward", forward)
    out = run_step(s)
    b = next(r for r in out if r.rid == "b")
    assert b.finished_reason["status_code"] == 500 and b.finished_reason["fault"] == "model_step"
    assert b.row is None and not s.waiting and s.running == [a]
    monkeypatch.setattr(s.runner, "forward", real)
    while not a.finished:
        run_step(s)
    assert a.finished_reason["type"] == "length" and len(a.output_ids) == 12
    assert idle(s)


def test_failing_decode_returns_the_slots_of_the_failed_forward(sched, monkeypatch):
    s = sched
    submit(s, "c", random_prompt(20, seed=3), max_new_tokens=50)
    submit(s, "d", random_prompt(25, seed=4), max_new_tokens=50)
    run_step(s)
    assert len(s.running) == 2
    monkeypatch.setattr(s, "launch_sampling", lambda *a: (_ for _ in ()).throw(ValueError("bad sampling")))
    out = run_step(s)  # a bug after the forward: slots allocated and committed for both
    assert {r.rid for r in out} == {"c", "d"}
    assert all(r.finished_reason["status_code"] == 500 and "fault" not in r.finished_reason for r in out)
    assert not s.running and idle(s)


def test_injected_fault_before_the_forward_frees_its_allocations(sched):
    s = sched
    submit(s, "e", random_prompt(40, seed=5), max_new_tokens=5)
    s.runner.faults = FaultInjector("1")  # the next forward raises
    try:
        out = run_step(s)
    finally:
        s.runner.faults = FaultInjector("")
    (e,) = out
    assert "injected" in e.finished_reason["message"] and idle(s)


def test_unrunnable_requests_are_refused_alone_on_arrival(sched):
    s = sched
    submit(s, "f", random_prompt(10, seed=6), max_new_tokens=3)
    submit(s, "g", [1, 2, 3], logit_bias={"999999": 1.0})
    submit(s, "h", [1, 2, 3], grammar=GrammarSpec(structural_tag="{}", kind="regex"), min_new_tokens=4)
    refused = {r.rid: r.finished_reason for r in s.outbox}
    s.outbox.clear()
    assert refused["g"]["status_code"] == 400 and "999999" in refused["g"]["message"]
    assert refused["h"]["status_code"] == 400 and "min_new_tokens" in refused["h"]["message"]
    assert [r.rid for r in s.waiting] == ["f"]
    while s.waiting or s.running:
        run_step(s)
    assert idle(s)


def test_fault_injector_spec():
    f = FaultInjector("3")
    f.tick(), f.tick()
    with pytest.raises(InjectedFault):
        f.tick()
    f.tick()  # only the third
    g = FaultInjector("2+")
    g.tick()
    for _ in range(3):
        with pytest.raises(InjectedFault):
            g.tick()
    for bad in ("0", "x", "@"):
        with pytest.raises(ValueError):
            FaultInjector(bad)
