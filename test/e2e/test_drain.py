"""Issue 18 item 9: SIGTERM drains. Requests that finish within --graceful-shutdown-timeout finish
normally; a stream still running then ends with an error event and [DONE] (never a cut connection);
new requests meanwhile get 503; the server and all its children exit."""

from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time

import requests

from .bystander import body
from .server import ServerProcess

GRACE = 6.0
SHORT = 16  # tokens: done well inside the grace period even on a loaded CPU


def children(pid: int) -> list[int]:
    """Direct child processes of pid, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_drains_then_aborts_what_is_left(tiny_path, tmp_path):
    # A temp directory of its own: the server's ZMQ socket files are found there, apart from any
    # other server's.
    s = ServerProcess("--skip-server-warmup", "--graceful-shutdown-timeout", str(GRACE),
                      env={"TMPDIR": str(tmp_path)})  # fmt: skip
    try:
        ours = glob.glob(str(tmp_path / "sglang-inkling-*"))
        assert ours, "no IPC directory for the server's sockets?"
        kids = children(s.proc.pid)
        assert kids, "the server has no child processes?"
        short_expected = s.generate(**body(31, SHORT))["output_ids"]
        stream, short = {}, {}

        def run_stream():
            with requests.post(s.base_url + "/generate", json={**body(32, 3000), "stream": True}, stream=True,
                               timeout=120) as r:  # fmt: skip
                stream["status"] = r.status_code
                stream["events"] = [line[6:] for line in r.iter_lines() if line.startswith(b"data: ")]

        def run_short():
            r = requests.post(s.base_url + "/generate", json=body(31, SHORT), timeout=120)
            short["status"], short["json"] = r.status_code, r.json()

        threads = [threading.Thread(target=run_stream), threading.Thread(target=run_short)]
        threads[0].start()
        deadline = time.time() + 30
        while s.internal_state()["num_running_reqs"] < 1:  # the stream runs
            assert time.time() < deadline
            time.sleep(0.02)
        threads[1].start()
        time.sleep(0.2)  # the short request has arrived: in flight when the signal comes
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        late = requests.post(s.base_url + "/generate", json=body(33, 4), timeout=30)
        assert late.status_code == 503 and "shutting down" in late.json()["message"], late.text
        assert requests.get(s.base_url + "/health", timeout=30).status_code == 503
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a request hangs through the shutdown"
        assert short["status"] == 200 and short["json"]["output_ids"] == short_expected
        events = stream["events"]
        assert stream["status"] == 200 and events[-1] == b"[DONE]", events[-3:]
        err = json.loads(events[-2])["error"]
        assert err["code"] == 503 and "shutting down" in err["message"]
        assert len(events) > 3  # it streamed tokens until the grace period ended
        assert s.proc.wait(timeout=30) == 0
        assert time.time() - t0 >= GRACE - 0.5  # the stream got its grace period
        deadline = time.time() + 15
        while any(alive(k) for k in kids) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(alive(k) for k in kids), "child processes outlived the server"
        assert not any(os.path.exists(d) for d in ours), "the socket files outlived the server"
    finally:
        s.stop()
