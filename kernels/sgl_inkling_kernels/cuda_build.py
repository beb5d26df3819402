"""Build a CUDA source of this package into a shared library and load it with ctypes.

The sources expose plain C entry points and include no torch headers, so a build takes seconds
(torch's extension builder spends about a minute on its headers) and the library does not depend
on torch's C++ ABI. Libraries are cached under $XDG_CACHE_HOME/sgl_inkling/cuda (default
~/.cache), keyed by the source, the flags, the GPU architecture and the nvcc version; a build
writes a temporary file and renames it, so ranks building at once do not see a partial library.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def _nvcc() -> tuple[str, Path | None]:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc"), Path(CUDA_HOME)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("building the CUDA kernels needs nvcc (set CUDA_HOME or put nvcc on PATH)")
    return nvcc, Path(nvcc).resolve().parents[1]


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sgl_inkling" / "cuda"


def load_cuda_library(src: Path, defines: dict[str, int] | None = None) -> ctypes.CDLL:
    """The compiled `src` for the current GPU, built on first use."""
    nvcc, home = _nvcc()
    major, minor = torch.cuda.get_device_capability()
    lib_dirs = [home / d for d in ("lib64", "lib") if (home / d).exists()]
    flags = ["-O3", "-std=c++17", f"-arch=sm_{major}{minor}", "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared"]
    flags += [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([src.read_text(), *flags, version]).encode()).hexdigest()[:16]
    path = cache_dir() / f"{src.stem}-{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        logger.info("building %s for sm_%d%d (first use on this machine)", src.name, major, minor)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        link = [a for d in lib_dirs for a in (f"-L{d}", "-Xlinker", f"-rpath={d}")]
        cmd = [nvcc, *flags, *link, "-o", tmp, str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            os.unlink(tmp)
            raise RuntimeError(f"nvcc failed on {src.name}:\n{done.stderr[-4000:]}")
        os.replace(tmp, path)
        logger.info("built %s in %.0f s", src.name, time.monotonic() - start)
    return ctypes.CDLL(str(path))
