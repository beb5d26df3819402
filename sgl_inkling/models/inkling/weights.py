"""Load hub-format safetensors (single file or sharded) into the model by hub tensor name.

Under tensor/expert parallelism each rank reads only its slice of a tensor (see distributed.sharding).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from sgl_inkling.distributed.sharding import full_shape, param_shards, slices
from sgl_inkling.models.inkling import nvfp4_weights
from sgl_inkling.models.inkling.moe import use_kernel_layouts

logger = logging.getLogger(__name__)

# Media towers: loaded when the model has them (multimodal on), skipped by a text-only model.
_TOWER_PREFIXES = {"image": "model.visual.", "audio": "model.audio."}
# Extra tensors of quantized checkpoints: in a model built without quantized experts they mean the
# checkpoint declares no quantization (no hf_quant_config.json / quantization_config).
_QUANT_SUFFIXES = (".scale", ".scale2", ".input_amax", "_scale", "_scale_2", "_input_scale")


class WeightLoadError(ValueError):
    """A checkpoint whose tensors do not match the model: names the tensor."""


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightLoadError(f"{index} has no weight_map")
        files = sorted({path / f for f in weight_map.values()})
        for f in files:
            if not f.exists():
                raise WeightLoadError(f"{index} names shard {f.name}, which is missing")
        return files
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"no *.safetensors files in {path}")
    return files


def tower_modalities(path: str | Path) -> tuple[str, ...]:
    """The media towers ("image", "audio") whose tensors the checkpoint holds."""
    names: set[str] = set()
    for f in checkpoint_files(Path(path)):
        with safe_open(f, framework="pt", device="cpu") as sf:
            names.update(sf.keys())
    return tuple(m for m, prefix in _TOWER_PREFIXES.items() if any(n.startswith(prefix) for n in names))


def load_safetensors(model: nn.Module, path: str | Path, progress: bool = True) -> None:
    """Copy every hub tensor into the parameter of the same name; shapes and presence are checked."""
    path = Path(path)
    params = dict(model.named_parameters())
    shards = param_shards(model)
    loaded: set[str] = set()
    files = checkpoint_files(path)
    names_per_file = []
    for f in files:
        with safe_open(f, framework="pt", device="cpu") as sf:
            names_per_file.append(list(sf.keys()))
    total = sum(len(n) for n in names_per_file)
    bar = tqdm(total=total, desc="Loading safetensors", unit="tensor", disable=not progress)
    skipped = 0
    skip = tuple(p for p in _TOWER_PREFIXES.values() if not any(n.startswith(p) for n in params))
    nvfp4 = any(p.dtype == torch.uint8 for p in params.values())  # NVFP4 routed experts (RoutedExperts)
    for f, names in zip(files, names_per_file):
        with safe_open(f, framework="pt", device="cpu") as sf:
            for name in names:
                bar.update(1)
                if skip and name.startswith(skip):
                    skipped += 1
                    continue
                target = _load_tensor(sf, f.name, name, params, shards, nvfp4, path)
                if target is not None:
                    loaded.add(target)
    bar.close()
    missing = sorted(set(params) - loaded)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise WeightLoadError(f"checkpoint {path} is missing tensor(s) {', '.join(missing[:5])}{more}")
    if skipped:
        logger.info("skipped %d vision/audio tower tensors (multimodal off)", skipped)
    use_kernel_layouts(model)


def _target(name: str, nvfp4: bool) -> tuple[str | None, str | None]:
    """(parameter name or None to drop the tensor, NVFP4 hub suffix or None)."""
    if not nvfp4:
        return name, None
    try:
        target, aux = nvfp4_weights.param_name(name)
    except nvfp4_weights.NVFP4TensorError as e:
        raise WeightLoadError(str(e)) from None
    return (target, aux) if aux is not None else (name, None)


def _load_tensor(sf, file: str, name: str, params: dict, shards: dict, nvfp4: bool, path: Path) -> str | None:
    """Copy hub tensor `name` into its parameter (this rank's slice); return the parameter's name, or
    None for a checked-and-dropped NVFP4 tensor (input_amax, original_shape)."""
    target, aux = _target(name, nvfp4)
    if target is None:
        base = name[: -len(aux)]
        if base in params:
            codes = full_shape(tuple(params[base].shape), shards.get(base, ()))
            try:
                nvfp4_weights.check_aux(name, aux, sf.get_tensor(name), codes)
            except nvfp4_weights.NVFP4TensorError as e:
                raise WeightLoadError(f"{e} (in {file})") from None
            return None
        target = name  # input_amax of a layer the model lacks: reported as unexpected below
    param = params.get(target)
    view = sf.get_slice(name)
    if nvfp4 and name.endswith(_QUANT_SUFFIXES) and param is None:
        raise WeightLoadError(
            f"tensor {name!r} ({file}): only the routed experts (mlp.experts.w13_weight / w2_weight) may be "
            "quantized; the rest of Inkling-NVFP4 is BF16"
        )
    if name.endswith(_QUANT_SUFFIXES) and param is None or (not nvfp4 and view.get_dtype() == "U8"):
        raise WeightLoadError(
            f"tensor {name!r} ({file}) belongs to a quantized checkpoint, but {path} declares no quantization "
            "(hf_quant_config.json or config.json quantization_config)"
        )
    if param is None:
        raise WeightLoadError(f"unexpected tensor {name!r} in {file}: the model has no such weight")
    shape = tuple(view.get_shape())
    expected = full_shape(tuple(param.shape), shards.get(target, ()))
    if shape != expected:
        raise WeightLoadError(f"tensor {name!r} in {file} has shape {list(shape)}, expected {list(expected)}")
    if aux is not None and view.get_dtype() != nvfp4_weights.expected_dtype(aux):
        raise WeightLoadError(
            f"tensor {name!r} in {file} has dtype {view.get_dtype()}, expected {nvfp4_weights.expected_dtype(aux)}"
        )
    with torch.no_grad():
        param.copy_(view[slices(shape, shards[target])] if target in shards else view[:])
    return target


def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights in place on the model's device (`--load-format dummy`): no file, no host copy.

    A sharded parameter is drawn at its full shape and sliced, so every TP size sees the same model.
    """
    gen = None
    shards = param_shards(model)
    for name, param in model.named_parameters():
        if gen is None or gen.device != param.device:
            gen = torch.Generator(device=param.device).manual_seed(seed)
        full = full_shape(tuple(param.shape), shards.get(name, ()))
        p = param if full == tuple(param.shape) else param.new_empty(full)
        with torch.no_grad():
            if nvfp4_weights.fill_dummy(name, p, gen):
                pass
            elif name.endswith(("norm.weight", "global_scale")):
                p.fill_(1.0)
            elif name.endswith("gate.bias"):
                p.zero_()
            elif "sconv" in name:
                p.normal_(0.0, 0.1, generator=gen)
            else:
                p.normal_(0.0, 0.02, generator=gen)
            if p is not param:
                param.copy_(p[slices(full, shards[name])])
    use_kernel_layouts(model)
