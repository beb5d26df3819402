"""Which weight format the routed experts use: read from the checkpoint, checked against `--quantization`.

Inkling-NVFP4 is a ModelOpt export: only the routed experts are NVFP4 (W4A16 on Hopper), the rest BF16.
ModelOpt describes it in `hf_quant_config.json` as `{"producer": {"name": "modelopt"}, "quantization":
{"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": [...]}}`; newer exports put the same
fields flat in config.json's `quantization_config` (`quant_method: "modelopt"`, `quant_algo`,
`group_size`, `ignore`). vLLM reads both (modelopt.py `from_config`) and maps NVFP4 to its
`modelopt_fp4` method; SGLang names the method `modelopt_fp4` too (`modelopt` auto-detects FP8 or
FP4). A checkpoint in any other quantization is refused: this runtime has no kernel for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

NVFP4 = "nvfp4"
# --quantization values meaning NVFP4 routed experts (upstream spellings); None: whatever the checkpoint is.
NVFP4_METHODS = ("modelopt_fp4", "modelopt", "nvfp4")
# quant_algo values with NVFP4 weights; W4A16_NVFP4 is the weight-only export (same tensors).
_NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
GROUP_SIZE = 16


class QuantizationError(ValueError):
    """A checkpoint quantization or `--quantization` value this runtime cannot serve: names it."""


@dataclass(frozen=True)
class CheckpointQuant:
    method: str  # NVFP4
    source: str  # the file that said so
    exclude_modules: tuple[str, ...] = ()


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise QuantizationError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise QuantizationError(f"{path} must hold a JSON object")
    return data


def _parse(cfg: dict, source: str) -> CheckpointQuant:
    nested = cfg.get("quantization")
    if isinstance(nested, dict):  # hf_quant_config.json (ModelOpt's legacy layout)
        producer = (cfg.get("producer") or {}).get("name", "modelopt")
        algo, group, exclude = nested.get("quant_algo"), nested.get("group_size"), nested.get("exclude_modules")
        method = str(producer)
    else:  # config.json quantization_config
        method = str(cfg.get("quant_method", ""))
        algo, group, exclude = cfg.get("quant_algo"), cfg.get("group_size"), cfg.get("ignore", cfg.get("exclude_modules"))
    if not method.lower().startswith("modelopt"):
        raise QuantizationError(f"{source}: quantization method {method!r} is not supported (only ModelOpt NVFP4 is)")
    if str(algo).upper() not in _NVFP4_ALGOS:
        raise QuantizationError(f"{source}: ModelOpt quant_algo {algo!r} is not supported (only NVFP4 is)")
    if group is not None and int(group) != GROUP_SIZE:
        raise QuantizationError(f"{source}: NVFP4 group_size {group} is not supported (only {GROUP_SIZE} is)")
    if exclude is not None and not isinstance(exclude, list):
        raise QuantizationError(f"{source}: exclude_modules must be a list, got {type(exclude).__name__}")
    return CheckpointQuant(NVFP4, source, tuple(exclude or ()))


def detect_quantization(model_dir: str | Path) -> CheckpointQuant | None:
    """The checkpoint's quantization, or None for an unquantized (BF16) checkpoint."""
    model_dir = Path(model_dir)
    hf_quant = model_dir / "hf_quant_config.json"
    found = _parse(_read_json(hf_quant), str(hf_quant)) if hf_quant.is_file() else None
    config = model_dir / "config.json"
    qc = _read_json(config).get("quantization_config") if config.is_file() else None
    if qc is not None:
        if not isinstance(qc, dict):
            raise QuantizationError(f"{config}: quantization_config must be an object")
        flat = _parse(qc, f"{config} quantization_config")
        found = found or flat
    return found


def excluded(module: str, patterns: tuple[str, ...]) -> bool:
    """ModelOpt's exclude_modules are module names or fnmatch wildcards (`prefix*` covers the subtree)."""
    return any(module == p or fnmatch(module, p) or module.startswith(p.rstrip("*") + ".") for p in patterns)


def resolve_quantization(flag: str | None, found: CheckpointQuant | None, load_format: str) -> str | None:
    """The routed experts' format: the checkpoint's, or with `--load-format dummy` the flag's.

    An explicit flag that contradicts the checkpoint is an error naming both (a BF16 checkpoint
    served as NVFP4, or the reverse, would otherwise load garbage or fail deep in the loader)."""
    if flag is not None and flag not in NVFP4_METHODS:
        raise QuantizationError(
            f"--quantization {flag!r} is not supported: Inkling serves BF16 or ModelOpt NVFP4 routed experts "
            f"({', '.join(NVFP4_METHODS)})"
        )
    if load_format == "dummy" and found is None:
        return NVFP4 if flag is not None else None
    if flag is not None and found is None:
        raise QuantizationError(
            f"--quantization {flag}: the checkpoint is not quantized (no hf_quant_config.json or "
            "quantization_config); drop the flag to serve it in BF16"
        )
    return found.method if found is not None else None


def check_quantization(flag: str | None, model_dir: str | Path, load_format: str) -> str | None:
    """The start-up check (before any process spawns): what load_model will decide, or the error."""
    return resolve_quantization(flag, detect_quantization(model_dir), load_format)


def check_experts_quantized(found: CheckpointQuant | None, moe_layers: list[int]) -> None:
    """Every MoE layer's routed experts are NVFP4 in Inkling-NVFP4; a checkpoint excluding some of
    them (mixed BF16/NVFP4 experts) is refused rather than loaded half-understood."""
    if found is None:
        return
    for i in moe_layers:
        name = f"model.llm.layers.{i}.mlp.experts"
        if excluded(name, found.exclude_modules) or excluded(name + ".w13_weight", found.exclude_modules):
            raise QuantizationError(
                f"{found.source}: exclude_modules leaves {name} in BF16; mixed BF16/NVFP4 routed experts are "
                "not supported"
            )
