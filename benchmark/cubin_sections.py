"""Compile CUDA NVFP4 MoE builds to cubins (no GPU needed) and fingerprint their machine code.

A change that should leave a build's code alone (removing a build option it does not use) is
checked by hashing every `.text.<kernel>` section of the cubin before and after: the whole file
differs anyway, since the anonymous namespace's mangled name carries a hash of the source path, so
that part of each section name is replaced by `{anon}`. Builds are "default" (the shipped one), a
moe_build spec ("row_ring=0,cp_async=4"), a bench_moe_nvfp4 `c:` spec, or "tests" (the build of
every CUDA_CASES entry). nvcc warnings fail the run; --resources prints ptxas' registers / spills.

    python benchmark/cubin_sections.py --nvcc /path/to/nvcc default row_ring=0 --save before.json
    ... edit ...
    python benchmark/cubin_sections.py --nvcc /path/to/nvcc default row_ring=0 --against before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "python")]

from benchmark.moe_build import parse  # noqa: E402
from sgl_inkling_kernels import moe_w4a16_cuda  # noqa: E402
from sgl_inkling_kernels.moe_w4a16_cuda import SRC, CudaTiles  # noqa: E402

_ANON = re.compile(r"(\d+)_GLOBAL__N__")


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Name -> bytes of every section of a little-endian ELF64 file (a cubin)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = []
    for i in range(shnum):  # sh_name, sh_type, ..., sh_offset at 24, sh_size at 32
        name, kind = struct.unpack_from("<II", data, shoff + i * shentsize)
        offset, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 24)
        headers.append((name, kind, offset, size))
    _, _, str_off, str_size = headers[shstrndx]
    names = data[str_off : str_off + str_size]
    out = {}
    for name, kind, offset, size in headers:
        end = names.index(b"\0", name)
        body = b"" if kind == 8 else data[offset : offset + size]  # SHT_NOBITS holds no bytes
        out[names[name:end].decode()] = body
    return out


def strip_anon(name: str) -> str:
    """The section name without the anonymous namespace's path hash: the mangled `<len>_GLOBAL__N__...`
    component is cut by its own length prefix."""
    while m := _ANON.search(name):
        n = int(m.group(1))
        name = name[: m.start()] + "{anon}" + name[m.end(1) + n :]
    return name


def text_hashes(cubin: bytes) -> dict[str, str]:
    return {strip_anon(k): hashlib.sha256(v).hexdigest() for k, v in sorted(elf_sections(cubin).items())
            if k.startswith(".text.")}  # fmt: skip


def builds(specs: list[str]) -> dict[str, CudaTiles]:
    """Name -> build: a spec names its build (so that a comparison across a change of the defines still
    pairs them up), the test cases' builds are named by their defines."""
    from benchmark.bench_moe_nvfp4 import parse_tiles
    from benchmark.prebuild_cuda import test_tiles

    out: dict[str, CudaTiles] = {}
    for spec in specs:
        if spec == "default":
            out[spec] = moe_w4a16_cuda.BUILD
        elif spec == "tests":
            out.update((",".join(f"{k}={v}" for k, v in t.defines()), t) for t in test_tiles())
        elif spec.startswith("c:"):
            out[spec] = parse_tiles(spec)[0]
        else:
            out[spec] = parse(spec)
    return out


def compile_cubin(nvcc: str, arch: str, tiles: CudaTiles, resources: bool) -> tuple[bytes, str]:
    """The cubin of one build and nvcc's messages; the flags are cuda_build's, less the library ones."""
    flags = ["-O3", "-std=c++17", f"-arch={arch}", "-cubin", *(f"-D{k}={v}" for k, v in sorted(tiles.defines()))]
    if resources:
        flags += ["-Xptxas", "-v"]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "moe.cubin")
        done = subprocess.run([nvcc, *flags, "-o", out, str(SRC)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"nvcc failed for {tiles.defines()}:\n{done.stderr[-4000:]}")
        return Path(out).read_bytes(), done.stderr


def resource_lines(log: str) -> list[str]:
    """ptxas -v's registers, spills and shared memory, one line per kernel (names without the hash)."""
    lines, kernel, spill = [], "", ""
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            kernel = strip_anon(m.group(1))
        elif m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
            spill = f"spills {m.group(1)}/{m.group(2)} B"
        elif m := re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line):
            lines.append(f"{kernel}: {m.group(1)} registers, {spill}, {m.group(2)} B smem")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("builds", nargs="+", help="default | tests | field=value,... | c:...")
    p.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--save", type=Path, help="write the builds' section hashes here")
    p.add_argument("--against", type=Path, help="compare with a --save file; exit 1 on any difference")
    p.add_argument("--resources", action="store_true", help="print ptxas' registers and spills per kernel")
    args = p.parse_args()
    got, warned = {}, False
    for key, tiles in builds(args.builds).items():
        cubin, log = compile_cubin(args.nvcc, args.arch, tiles, args.resources)
        got[key] = text_hashes(cubin)
        warnings = [ln for ln in log.splitlines() if "warning" in ln.lower()]
        warned |= bool(warnings)
        print(f"{key}: {len(got[key])} .text sections{'' if not warnings else ', WARNINGS:'}")
        for ln in warnings:
            print("  ", ln)
        if args.resources:
            for ln in resource_lines(log):
                print("  ", ln)
    if args.save:
        args.save.write_text(json.dumps(got, indent=1, sort_keys=True))
    status = 1 if warned else 0
    if args.against:
        want = json.loads(args.against.read_text())
        for key, sections in got.items():
            if key not in want:
                print(f"{key}: not in {args.against}")
                status = 1
                continue
            old = want[key]
            diff = sorted(k for k in old.keys() | sections.keys() if old.get(k) != sections.get(k))
            print(f"{key}: {'identical' if not diff else f'{len(diff)} sections differ'} ({len(sections)} compared)")
            for k in diff:
                print(f"   {'changed' if k in old and k in sections else 'only before' if k in old else 'only after'}: {k}")
            status |= bool(diff)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
