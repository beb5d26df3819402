"""`inkling-tiny-nvfp4`: inkling-tiny with its routed experts converted to NVFP4 by the converter
(sgl_inkling.tools.quantize_nvfp4), so it has exactly the Inkling-NVFP4 layout: uint8 codes, fp8
block scales, fp32 scale2, input_amax, original_shape and hf_quant_config.json. Written on first use."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from sgl_inkling.models.inkling import tiny

NAME = "inkling-tiny-nvfp4"
_VERSION = 1  # bump when the converter's output changes


def ensure_tiny_nvfp4_checkpoint(src: Path | None = None, name: str = NAME) -> Path:
    """The NVFP4 conversion of `src` (default: inkling-tiny), cached beside it."""
    from sgl_inkling.tools.quantize_nvfp4 import convert

    src = src or tiny.ensure_tiny_checkpoint()
    target = tiny.cache_root() / f"{name}-v{_VERSION}-from-{src.name}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        convert(src, tmp / "ckpt", progress=False)
        try:
            (tmp / "ckpt").rename(target)
        except OSError:
            pass  # another process finished first; its copy is identical
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
