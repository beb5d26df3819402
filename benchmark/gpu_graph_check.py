"""Quick CUDA-graph check on inkling-tiny: graphs vs eager give the same greedy tokens, and their speed."""

import json
import time

import sglang

if __name__ == "__main__":
    res = {}
    for name, kw in (("graph", {"cuda_graph_max_bs": 8}), ("eager", {"disable_cuda_graph": True})):
        e = sglang.Engine(device="cuda", dtype="bfloat16", **kw)
        e.generate("warm", {"max_new_tokens": 2})
        t = time.perf_counter()
        sp = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
        outs = e.generate(["Hello there", "abc", "The quick brown fox"], sp)
        res[name] = ([o["output_ids"] for o in outs], 3 * 48 / (time.perf_counter() - t))
        e.shutdown()
    print(json.dumps({"graph_equals_eager": res["graph"][0] == res["eager"][0],
                      "tok_s_graph": res["graph"][1], "tok_s_eager": res["eager"][1]}))  # fmt: skip
