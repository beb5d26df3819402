"""serving_cpu_probe's readers: the server's processes found by the names they give themselves, their
threads' CPU seconds from /proc, and the latest `device wait` of a scheduler log."""

import multiprocessing as mp
import os
import time

import pytest

from benchmark.serving_cpu_probe import last_wait, server_pids, thread_cpu
from sgl_inkling.managers.subprocess_utils import name_process

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs /proc")


def _named(name: str, ready) -> None:
    name_process(name)
    ready.set()
    time.sleep(60)


def test_the_scheduler_and_detokenizer_are_found_by_name_with_their_parent():
    ctx = mp.get_context("spawn")
    events = [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=_named, args=(n, e), daemon=True)
             for n, e in zip(("sgl-sched-tp0", "sgl-detokenizer"), events)]  # fmt: skip
    for p in procs:
        p.start()
    try:
        assert all(e.wait(60) for e in events)
        found = server_pids(parent=os.getpid())  # not another test's server
        assert found == {"sgl-sched-tp0": procs[0].pid, "sgl-detokenizer": procs[1].pid, "http": os.getpid()}
        threads = thread_cpu(procs[0].pid)
        assert threads and all(k.rsplit("/", 1)[1].isdigit() for k in threads)  # "name/tid"
        assert any(k == f"sgl-sched-tp0/{procs[0].pid}" for k in threads)  # the main thread by its name
    finally:
        for p in procs:
            p.kill()


def test_the_latest_device_wait_of_the_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("Decode batch. #running-req: 64, device wait: 0.74\nPrefill batch. #new-seq: 1\n"
                   "Decode batch. #running-req: 64, device wait: 0.12\n")  # fmt: skip
    assert last_wait(log) == 0.12
    log.write_text("Prefill batch. #new-seq: 1\n")
    assert last_wait(log) is None
    assert last_wait(tmp_path / "missing.log") is None
