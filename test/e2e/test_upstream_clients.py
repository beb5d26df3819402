"""Upstream SGLang 0.5.23's own clients, unmodified, against this server: its frontend language
(`sgl.RuntimeEndpoint`), `python -m sglang.bench_serving --backend sglang`, and every field of its
GenerateReqInput / SamplingParams at the default value. References are this server's /generate
answers to the same requests, sent directly."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from .upstream_env import IndexUnreachable, build_upstream_env, run_upstream

FRONTEND = r'''
import json, sys
import sglang as sgl

assert "site-packages" in sgl.__file__, sgl.__file__  # upstream's package, not this project's
sgl.set_default_backend(sgl.RuntimeEndpoint(sys.argv[1]))


@sgl.function
def program(s, question):
    s += question
    s += sgl.gen("line", max_tokens=10, stop=["a", "e"], temperature=0)
    s += "\nNumber: " + sgl.gen("num", max_tokens=8, regex=r"[0-9]{1,4}", temperature=0)
    s += "\nUntil: " + sgl.gen("upto", max_tokens=12, stop_regex=r"[a-z]{3}", temperature=0)
    s += "\nColour: " + sgl.select("pick", choices=["red", "green", "blue"])
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f" Branch {i}:" + sgl.gen("branch", max_tokens=5, temperature=0)
    s.set_var("branches", [f["branch"] for f in forks])


def fields(state):
    return {k: state[k] for k in ("line", "num", "upto", "pick", "branches")} | {"text": state.text()}


one = program.run(question="Q: where is the cat?\nA:")
batch = program.run_batch([{"question": "Hello"}, {"question": "Q: where is the cat?\nA:"}])
streamed = program.run(question="Hello", stream=True)
chunks = list(streamed.text_iter())
print(json.dumps({"one": fields(one), "batch": [fields(b) for b in batch], "stream_text": "".join(chunks),
                  "stream_state": fields(streamed)}))
'''


@pytest.fixture(scope="session")
def upstream_python(tmp_path_factory) -> Path:
    try:
        return build_upstream_env(tmp_path_factory.mktemp("upstream-sglang"))
    except IndexUnreachable as e:
        pytest.skip(f"the package index is unreachable, so upstream's client cannot be installed: {e}")


def _gen(server, text: str, **sp) -> str:
    return server.generate(text=text, sampling_params={"temperature": 0, **sp})["text"]


def test_frontend_programs(server, upstream_python):
    proc = run_upstream(upstream_python, "-c", FRONTEND, server.base_url)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for state in [got["one"], got["batch"][1]]:
        q = "Q: where is the cat?\nA:"
        assert state["line"] == _gen(server, q, max_new_tokens=10, stop=["a", "e"])
        assert re.fullmatch(r"[0-9]{1,4}", state["num"]), state["num"]
        before = q + state["line"] + "\nNumber: " + state["num"] + "\nUntil: "
        upto = server.generate(text=before, sampling_params={"temperature": 0, "max_new_tokens": 12,
                                                             "stop_regex": r"[a-z]{3}"})  # fmt: skip
        assert state["upto"] == upto["text"] and re.search("[a-z]{3}", upto["text"])
        assert upto["meta_info"]["finish_reason"] == {"type": "stop", "matched": "[a-z]{3}"}
        assert state["pick"] in ("red", "green", "blue")
        after = before + state["upto"] + "\nColour: " + state["pick"]
        for i, branch in enumerate(state["branches"]):
            assert branch == _gen(server, after + f" Branch {i}:", max_new_tokens=5)
        assert state["text"] == after
    assert got["batch"][1] == got["one"]  # run_batch runs the same program
    assert got["stream_state"] == got["batch"][0]  # streaming ends where the non-streamed run does
    assert got["stream_text"] == got["batch"][0]["text"]
    server.wait_idle_baseline()


def test_bench_serving_unmodified(server, upstream_python, tmp_path):
    # A small ShareGPT-format file: bench_serving's random dataset draws its token ids from it.
    convs = [{"conversations": [{"from": "human", "value": f"Tell me about topic {i}, please, in detail."},
                                {"from": "gpt", "value": "Sure. " * (i + 3)}]} for i in range(12)]  # fmt: skip
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(convs))
    out = tmp_path / "bench.jsonl"
    args = ["-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", server.base_url,
            "--dataset-name", "random", "--dataset-path", str(data), "--num-prompts", "6",
            "--random-input-len", "24", "--random-output-len", "6", "--random-range-ratio", "1",
            "--max-concurrency", "3", "--output-file", str(out), "--seed", "3", "--warmup-requests", "1"]  # fmt: skip
    before = server.internal_state()["num_finished_reqs"]
    proc = run_upstream(upstream_python, *args)
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == 6, log
    assert result["total_output_tokens"] == 6 * 6 and result["total_input_tokens"] == 6 * 24, result
    assert result["mean_ttft_ms"] > 0 and result["mean_e2e_latency_ms"] >= result["mean_ttft_ms"]
    assert server.internal_state()["num_finished_reqs"] - before == 6 + 1  # and the warm-up request
    server.wait_idle_baseline()


def _api_defaults(path: Path, cls: str, stop_at: str | None = None) -> dict:
    """Field -> default of an upstream dataclass/struct, read from its source (no import needed)."""
    source = path.read_text()
    tree = ast.parse(source)
    consts: dict = {}  # module-level constants a default may name (SamplingParams: TOP_K_ALL = 1 << 30)
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                consts[stmt.targets[0].id] = _eval(stmt.value, consts)
            except (NameError, TypeError, ValueError, AttributeError):
                pass
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    end = None
    if stop_at is not None:  # SamplingParams: the API fields come before its internal ones
        end = next(i for i, line in enumerate(source.splitlines(), 1) if stop_at in line and i > node.lineno)
    out = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and (end is None or stmt.lineno < end):
            value = stmt.value
            if isinstance(value, ast.Call):  # field(default=..., kw_only=True)
                value = next(k.value for k in value.keywords if k.arg == "default")
            out[stmt.target.id] = _eval(value, consts) if value is not None else None
    return out


def _eval(expr: ast.expr, names: dict):
    return eval(compile(ast.Expression(expr), "<default>", "eval"), {"__builtins__": {}}, dict(names))


def test_every_upstream_field_at_its_default_is_served(server, upstream_python):
    root = run_upstream(upstream_python, "-c", "import sglang, os; print(os.path.dirname(sglang.__file__))")
    pkg = Path(root.stdout.strip())
    fields = _api_defaults(pkg / "srt/managers/io_struct.py", "GenerateReqInput")
    params = _api_defaults(pkg / "srt/sampling/sampling_params.py", "SamplingParams", stop_at="Internal fields")
    assert len(fields) >= 70 and len(params) >= 27, (len(fields), len(params))
    params = {k: (list(v) if isinstance(v, set) else v) for k, v in params.items()}
    want = server.generate(text="Hello", sampling_params={"max_new_tokens": 6, "temperature": 0})
    sp = {**params, "max_new_tokens": 6, "temperature": 0}
    for body in (
        {**fields, "text": "Hello", "sampling_params": sp},
        {**{k: None for k in fields}, "text": "Hello", "sampling_params": {**{k: None for k in params}, **sp}},
    ):
        r = server.post("/generate", body)
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == want["output_ids"]
    server.wait_idle_baseline()
