"""The CUDA MoE build specs of the benchmarks: bench_moe_nvfp4's positional `c:` specs name every
CudaTiles field (a spec of another length, e.g. one written before a field was removed, is refused
instead of shifting its values), the GPU scripts' sweep specs parse to the builds their comments
name, moe_build --pick never picks a removed build, and cubin_sections reads ELF section tables."""

from __future__ import annotations

import shlex
import struct
from pathlib import Path

import pytest

from benchmark import cubin_sections, moe_build
from benchmark.bench_moe_nvfp4 import parse_tiles
from sgl_inkling_kernels.moe_w4a16_cuda import CudaTiles

ROOT = Path(__file__).resolve().parents[2]


def sweep(script: str) -> list[str]:
    """The entries of a GPU script's first SWEEP=(...) array, with the arrays it names ("${X[@]}")
    expanded from their own first assignments."""
    arrays: dict[str, list[str]] = {}
    for ln in (ROOT / "benchmark" / script).read_text().splitlines():
        name, eq, body = ln.partition("=(")
        if eq and name.isidentifier() and name not in arrays:
            words = shlex.split(body.split("#")[0].strip().removesuffix(")"))
            arrays[name] = [w for x in words for w in (arrays[x[2:-4]] if x.startswith("${") else [x])]
    return arrays["SWEEP"]


def test_c_spec_names_every_field_in_order():
    tiles, asm, batches = parse_tiles("c:2,8,4,128,8,0,1,0,0,3,0,1,3,1,1@1,8")
    want = CudaTiles(nt=2, depth=8, kernel_sink_max=4, l2=128, warps=8, dual_acc=0, x_prefetch=1, cp_async=0,
                     split_sinks=0, one_launch_max=3, sink_stream=0, pdl=1, row_ring=3, lean=1)  # fmt: skip
    assert tiles == want and asm == [] and batches == [1, 8]
    assert parse_tiles("c:1,4,8,256,2,1,0,8,1,1,1,8,3,1,1")[0] == CudaTiles(nt=1)  # the shipped build
    assert parse_tiles("c:1,4,8,256,4,1,0,8,1,1,1,8,4,0,1")[0] == CudaTiles(nt=1, warps=4, row_ring=4, lean=0)
    assert parse_tiles("c:1,4,8,256,2,1,0,8,1,1,1,8,3,1,2")[0] == CudaTiles(nt=1, row_tiles=2)


@pytest.mark.parametrize("body,why", [
    ("1,4,8,256,4,1,0,8,1,1,1,0,0,4,1", "lean"),  # 15 fields with bulk (or persist) of before
    ("1,4,8,256,4,1,0,8,1,1,1,0,4,0", "row_tiles .the 15th"),  # the 14 of before row_tiles was added
    ("1,4,8,256,4,1,0,8,1,1,1,0,4", "lean .the 14th"),  # the 13 of before lean was added
    ("1,4", "15 of"),  # trailing fields are not optional: they would hide a shifted spec
    ("1,4,8,256,4,1,1,8,1,1,1,0,4,0,1", "x_prefetch"),  # a field combination CudaTiles refuses, as an exit
    ("2,4,8,256,2,1,0,8,1,1,1,0,3,1,2", "row_tiles 2 needs nt 1"),
])  # fmt: skip
def test_c_spec_of_another_field_list_is_refused(body, why):
    with pytest.raises(SystemExit, match=why):
        parse_tiles("c:" + body)


@pytest.mark.parametrize("script,rest", [
    ("gpu_all.sh", [CudaTiles(nt=1, warps=4, row_ring=4, lean=0)]),
    ("gpu_moe_nvfp4.sh", [CudaTiles(nt=1, warps=4, row_ring=4, lean=0), CudaTiles(nt=1, row_ring=0)]),
])  # fmt: skip
def test_gpu_sweeps_are_the_builds_they_name(script, rest):
    builds = [parse_tiles(s)[0] for s in sweep(script)]
    assert builds[0] is None  # the module's dispatch first
    assert builds[1:] == rest


def _variant(ms: float, **tiles) -> dict:
    return {"ms": ms, "tiles": {"path": "cuda", "nt": 1, **vars(CudaTiles()), **tiles}}


def test_pick_skips_builds_that_were_removed():
    doc = {"results": [{"variants": [
        {"ms": 1.0, "tiles": {"path": "default dispatch"}},
        _variant(0.5, fused=1), _variant(0.6, persist=1), _variant(0.7, bulk=4), _variant(0.9, row_ring=0),
        _variant(1.1, row_ring=3),
    ]}]}  # fmt: skip
    assert moe_build.parse(moe_build.pick(doc)) == CudaTiles(row_ring=0)


def _elf(sections: dict[str, bytes]) -> bytes:
    """A minimal little-endian ELF64 file: a null section, the given ones and .shstrtab."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    body, offsets, data_at = b"", [], 64
    for v in sections.values():
        offsets.append(data_at + len(body))
        body += v
    str_at = data_at + len(body)
    sh_at = str_at + len(names)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, sh_at, 0, 64,
                                                                       0, 0, 64, len(sections) + 2, len(sections) + 1)
    entries, pos = [bytes(64)], 1
    for (n, v), off in zip(sections.items(), offsets):
        entries.append(struct.pack("<IIQQQQIIQQ", pos, 1, 6, 0, off, len(v), 0, 0, 16, 0))
        pos += len(n) + 1
    entries.append(struct.pack("<IIQQQQIIQQ", pos, 3, 0, 0, str_at, len(names), 0, 0, 1, 0))
    return header + body + names + b"".join(entries)


def test_cubin_sections_reads_sections_and_strips_the_path_hash():
    anon = "_ZN49_GLOBAL__N__05165775_16_moe_w4a16_mma_cu_b2a967e416moe_w4a16_kernelILi8EEEvv"
    got = cubin_sections.elf_sections(_elf({".text." + anon: b"\x01\x02\x03", ".nv.info": b"xy"}))
    assert got[".text." + anon] == b"\x01\x02\x03" and got[".nv.info"] == b"xy" and got[".shstrtab"].startswith(b"\0")
    assert cubin_sections.strip_anon(anon) == "_ZN{anon}16moe_w4a16_kernelILi8EEEvv"
    other = anon.replace("05165775", "99999999").replace("b2a967e4", "0badcafe")  # another checkout's path
    assert cubin_sections.strip_anon(other) == cubin_sections.strip_anon(anon)
