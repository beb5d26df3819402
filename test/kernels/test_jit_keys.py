"""`jit_keys` computes the compile key a launch would look Triton's JIT cache up by: its rules agree
with the installed Triton's own specialisation (the native `specialize_impl` and the binder the JIT
builds from a kernel's signature), and the recorder reports a launch whose key warm-up never saw."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
pytest.importorskip("triton")

from triton.backends.compiler import BaseBackend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature, native_specialize_impl  # noqa: E402

from sgl_inkling_kernels import decode_attention as da  # noqa: E402
from sgl_inkling_kernels import rmsnorm as rn  # noqa: E402
from sgl_inkling_kernels.jit_keys import KeyLog, arg_key, launch_key, record_keys  # noqa: E402

_BUF = torch.zeros(64, dtype=torch.float32)
VALUES = [0, 1, 2, 3, 15, 16, 17, 32, 48, -1, -16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), 2**63, 2**63 + 16,
          True, False, 0.5, 1.0, None, _BUF, _BUF[1:], _BUF[4:], _BUF.view(torch.uint8)[3:],
          torch.zeros(3, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.int64)[1:],
          torch.zeros(2, dtype=torch.float8_e4m3fn), torch.zeros(2, dtype=torch.bool)]  # fmt: skip


@pytest.mark.parametrize("specialize, align", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("const", [False, True])
def test_argument_rules_match_triton(specialize, align, const):
    for v in VALUES:
        want = native_specialize_impl(BaseBackend, v, const, specialize, align)
        assert arg_key(v, specialize=specialize, align=align, const=const) == tuple(want), v


def _tritons_binder(kernel):
    """The function Triton's JIT computes a launch's specialisation with (compiled mode)."""
    opts = {k: v for k, v in getattr(kernel, "kwargs", {}).items() if k.startswith("do_not_specialize")}
    jit = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **opts)
    return create_function_from_signature(jit.signature, jit.params, BaseBackend)


def _split_args(num_splits: int, bsz: int = 3, heads: int = 4, dim: int = 16) -> tuple[tuple, dict]:
    """Arguments of a `_decode_split_kernel` launch as decode_attention makes them."""
    q = torch.zeros(bsz, heads, dim)
    kv = torch.zeros(8, 2, dim)
    rows, pos = torch.zeros(bsz, dtype=torch.int64), torch.zeros(bsz, dtype=torch.int64)
    rel, table, table_rows = torch.zeros(bsz, heads, 4), torch.zeros(4, 32), torch.zeros(2, 8, dtype=torch.int64)
    part_o = torch.zeros(bsz, heads, num_splits, dim)
    part_lse = torch.zeros(bsz, heads, num_splits)
    counters = torch.zeros(bsz * 2, dtype=torch.int32)
    out = torch.zeros(bsz, heads * dim)
    args = (q, kv, kv, table_rows, rows, pos, rel, table, q, part_o, part_lse, counters, out,
            q.stride(0), q.stride(1), kv.stride(0), kv.stride(1), kv.stride(0), kv.stride(1), table_rows.stride(0),
            rel.stride(0), rel.stride(1), table.stride(0), out.stride(0), heads, 0.25, 32, 16, num_splits)  # fmt: skip
    meta = dict(G=2, BLOCK_G=16, D=dim, BLOCK_D=dim, R=4, BLOCK_R=16, BLOCK_N=16, HAS_TAU=False, HAS_WINDOW=True,
                UPCAST=True, PREC="ieee", MERGE=True, BLOCK_GM=2, SPLIT_CHUNK=8, num_warps=4, num_stages=2)  # fmt: skip
    return args, meta


def test_launch_keys_match_tritons_binder():
    x = torch.zeros(3, 64)
    w = torch.zeros(64)
    launches = [
        (rn._rmsnorm_kernel, (x, x, w, x, x, 64, 64, 64, 64, 64, 1e-6), dict(HAS_RES=True, BLOCK=64, num_warps=4)),
        (rn._rmsnorm_kernel, (x[1:], None, w, x, None, 1, 0, 17, 0, 63, 1e-6), dict(HAS_RES=False, BLOCK=64)),
    ]
    for splits in (1, 2, 16, 17):
        launches.append((da._decode_split_kernel, *_split_args(splits)))
    for kernel, args, kwargs in launches:
        _, want, options = _tritons_binder(kernel)(*args, **kwargs)
        got = launch_key(kernel, args, kwargs)
        assert [part for _, part in got.args] == [tuple(w) for w in want]
        assert dict(got.options) == options


def test_decode_split_key_is_the_same_for_every_split_count():
    # The split count changes with the batch (and the GPU's SM count): no variant per count.
    keys = {launch_key(da._decode_split_kernel, *_split_args(s)) for s in range(1, 65)}
    assert len(keys) == 1


def test_recorder_reports_only_new_variants():
    x, w = torch.randn(3, 64), torch.ones(64)
    with record_keys() as log:
        rn.rmsnorm(x, w, 1e-6)
        seen, n_seen = log.keys(), len(log.launches)
        rn.rmsnorm(torch.randn(5, 64), w, 1e-6)  # another token count: the same variant
        rn.rmsnorm(torch.randn(3, 72), torch.ones(72), 1e-6)  # a new width: new block, N not a multiple of 16
        rn.rmsnorm(torch.randn(3 * 64 + 1)[1:].view(3, 64), w, 1e-6)  # a view 4 bytes off alignment
    new = KeyLog(log.launches[n_seen:]).new_since(seen)
    assert len(log.launches) == n_seen + 3
    assert len(new) == 2, new
    assert new[0].startswith("_rmsnorm_kernel: ") and "BLOCK: ('constexpr', 128) vs ('constexpr', 64)" in new[0]
    # (Res: without a residual the kernel gets X in its place)
    assert new[1] == "_rmsnorm_kernel: X: ('*fp32', '') vs ('*fp32', 'D'); Res: ('*fp32', '') vs ('*fp32', 'D')"
    # Outside the block launches are not recorded (the kernels' own `run` is back).
    rn.rmsnorm(x, w, 1e-6)
    assert len(log.launches) == n_seen + 3


@pytest.mark.parametrize("lens", [[1], [3], [2, 1], [1, 1, 1], [16, 5, 1], [7, 9, 2, 1, 1]])
def test_forward_batch_fields_are_16_byte_aligned(lens):
    # The batch's index tensors come from one staged copy; each must start 16-byte aligned whatever
    # the token and batch counts, or the kernels reading them compile a second variant.
    from sgl_inkling.model_executor.forward_batch import ForwardBatch, ForwardMode

    ids = [list(range(n)) for n in lens]
    total = sum(lens)
    b = ForwardBatch.build(ForwardMode.EXTEND, ids, list(range(len(lens))), [5] * len(lens), list(range(total)),
                           list(range(total)), "cpu", logits_counts=[1] * len(lens))  # fmt: skip
    fields = ("input_ids", "positions", "req_pool_indices", "prefix_lens", "extend_lens", "out_loc", "out_loc_swa",
              "logits_indices")  # fmt: skip
    for name in fields:
        assert getattr(b, name).data_ptr() % 16 == 0, name
    assert b.extend_lens.tolist() == lens and b.prefix_lens.tolist() == [5] * len(lens)
    assert b.input_ids.tolist() == [t for seq in ids for t in seq]
    assert b.positions.tolist() == [5 + j for n in lens for j in range(n)]
    assert b.logits_indices.tolist() == [sum(lens[: i + 1]) - 1 for i in range(len(lens))]


def test_compile_warnings_are_quiet_during_a_warm_up(caplog):
    # jit_watch warns for every compile after warm-up, except inside another warm-up (the benchmarks
    # build one ModelRunner per batch size in one process). Its hook is driven by hand here: the
    # interpreter never compiles.
    from sgl_inkling_kernels import jit_watch

    jit_watch.log_compiles_after_warmup()
    with caplog.at_level("WARNING", logger=jit_watch.__name__):
        with jit_watch.warming_up():
            jit_watch._hook(repr="_kernel_a[...]")
        jit_watch._hook(repr="_kernel_b[...]")
    assert [r.getMessage().split(": ")[-1] for r in caplog.records] == ["_kernel_b[...]"]


def test_compile_warning_names_the_variant(caplog):
    # Triton 3.6's `repr` lists no argument types; the warning carries the specialization data (the
    # signature, constants and divisibility that tell which variant warm-up missed).
    from sgl_inkling_kernels import jit_watch

    jit_watch.log_compiles_after_warmup()
    data = '{"name": "_kernel_c", "signature": {"X": "*bf16", "n": "i32"}, "attrs": [[["tt.divisibility", 16]]]}'
    with caplog.at_level("WARNING", logger=jit_watch.__name__):
        jit_watch._hook(repr="_kernel_c[num_warps=4](X: ()", compile={"key": None, "specialization_data": data})
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().endswith(data)


def _launch_kernel_d():  # stands for a launcher: the frame the warning names, with its caller
    from sgl_inkling_kernels import jit_watch

    jit_watch._hook(repr="_kernel_d[...]")


def test_compile_warning_names_the_launching_line(caplog):
    from sgl_inkling_kernels import jit_watch

    jit_watch.log_compiles_after_warmup()
    with caplog.at_level("WARNING", logger=jit_watch.__name__):
        _launch_kernel_d()
    msg = caplog.records[0].getMessage()
    site = msg.split("launched from ")[1].split(": ")[0]
    assert site.startswith("test_jit_keys.py:") and "(_launch_kernel_d) <- test_jit_keys.py:" in site, msg
    assert site.endswith("(test_compile_warning_names_the_launching_line)"), msg
