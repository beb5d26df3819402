"""Hub names, dtypes and dummy values of the NVFP4 routed-expert tensors (Inkling-NVFP4 layout).

Per quantized tensor `W` (`model.llm.layers.{L}.mlp.experts.{w13_weight,w2_weight}`) the ModelOpt
export holds `W` (uint8 codes), `W.scale` (fp8 e4m3 block scales), `W.scale2` (fp32 per expert),
`W.input_amax` (fp32 activation amax) and `W.original_shape` (int `[3]`). vLLM's Inkling loader renames
`.scale` / `.scale2` to ModelOpt's usual `_scale` / `_scale_2`; we accept both spellings. The model's
parameters are `W`, `W_scale`, `W_scale2` (RoutedExperts). compressed-tensors' NVFP4 spellings
(`weight_packed`, `weight_global_scale`, `input_global_scale`) store the global scale inverted and
are refused by name rather than loaded wrong.
"""

from __future__ import annotations

import math
import re

import torch

from sgl_inkling_kernels.nvfp4 import E2M1_MAGNITUDES

_EXPERT = re.compile(r"^(?P<base>.*\.mlp\.experts\.(?:w13_weight|w2_weight))(?P<aux>.*)$")
# hub suffix -> parameter suffix; None: checked, then dropped (W4A16 needs neither).
_AUX = {
    "": "", ".scale": "_scale", "_scale": "_scale", ".scale2": "_scale2", "_scale_2": "_scale2",
    ".input_amax": None, ".original_shape": None,
}  # fmt: skip
_COMPRESSED_TENSORS = (".weight_packed", ".weight_scale", ".weight_global_scale", ".input_global_scale")
# safetensors dtype of each kept tensor, by parameter suffix
_DTYPES = {"": "U8", "_scale": "F8_E4M3", "_scale2": "F32"}


class NVFP4TensorError(ValueError):
    pass


def param_name(hub: str) -> tuple[str, str] | tuple[None, None]:
    """Hub name of a routed-expert NVFP4 tensor -> (parameter name or None for input_amax /
    original_shape, the hub suffix); (None, None) for any other tensor."""
    m = _EXPERT.match(hub)
    if m is None:
        return None, None
    aux = m["aux"]
    if aux in _COMPRESSED_TENSORS:
        raise NVFP4TensorError(
            f"tensor {hub!r}: compressed-tensors NVFP4 is not supported (its global scale is stored inverted); "
            "use a ModelOpt export (W, W.scale, W.scale2)"
        )
    if aux not in _AUX:
        return None, None
    kept = _AUX[aux]
    return (m["base"] + kept if kept is not None else None), aux


def expected_dtype(aux: str) -> str:
    """safetensors dtype the tensor of hub suffix `aux` (from param_name) must have."""
    return _DTYPES[_AUX[aux]]


def check_aux(hub: str, aux: str, t: torch.Tensor, codes_shape: tuple[int, ...]) -> None:
    """`input_amax` (one fp32 value, or one per expert) and `original_shape` (`[E, rows, cols]` of the
    unpacked weight) are checked so a malformed export is refused, then dropped: W4A16 keeps the
    activations in bf16 and so never needs the activation scale."""
    experts, rows, packed = codes_shape
    if aux == ".input_amax":
        if not t.is_floating_point() or t.numel() not in (1, experts):
            raise NVFP4TensorError(
                f"tensor {hub!r}: expected one float activation amax (or one per expert), got "
                f"{t.dtype} shape {list(t.shape)}"
            )
        if not bool(torch.isfinite(t.float()).all()) or bool((t.float() < 0).any()):
            raise NVFP4TensorError(f"tensor {hub!r}: activation amax must be finite and >= 0")
        return
    want = [experts, rows, 2 * packed]
    if t.is_floating_point() or t.shape != (3,) or t.tolist() != want:
        raise NVFP4TensorError(f"tensor {hub!r}: expected integer original_shape {want}, got {t.tolist()} ({t.dtype})")


# Dummy NVFP4 weights: uniform random codes, block scales uniform in [32, 96], and a scale2 that makes
# the weights' standard deviation 0.02, as the BF16 dummy's (so activations look alike).
_DUMMY_SCALE_RANGE = (32.0, 96.0)
_E2M1_RMS = math.sqrt(sum(v * v for v in E2M1_MAGNITUDES) / len(E2M1_MAGNITUDES))
_SCALE_RMS = math.sqrt((_DUMMY_SCALE_RANGE[1] ** 3 - _DUMMY_SCALE_RANGE[0] ** 3) / (3 * (_DUMMY_SCALE_RANGE[1] - _DUMMY_SCALE_RANGE[0])))
DUMMY_WEIGHT_STD = 0.02
DUMMY_SCALE2 = DUMMY_WEIGHT_STD / (_E2M1_RMS * _SCALE_RMS)


def fill_dummy(name: str, p: torch.Tensor, gen: torch.Generator) -> bool:
    """Fill an NVFP4 tensor in place on its device; False when `p` is not one."""
    if p.dtype == torch.uint8:
        p.random_(0, 256, generator=gen)  # every byte value: codes of both signs, never all zero
    elif p.dtype == torch.float8_e4m3fn:
        for e in range(p.shape[0]):  # one expert at a time: the fp32 staging stays small
            p[e].copy_(torch.empty(p.shape[1:], dtype=torch.float32, device=p.device).uniform_(*_DUMMY_SCALE_RANGE, generator=gen))
    elif name.endswith("_weight_scale2"):
        p.fill_(DUMMY_SCALE2)
    else:
        return False
    return True
