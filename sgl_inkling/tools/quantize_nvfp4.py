"""Write an Inkling-NVFP4-layout checkpoint from a BF16 (or fp32) Inkling checkpoint.

    python -m sgl_inkling.tools.quantize_nvfp4 SRC DST [--max-shard-size 5GB]

Only the routed experts (`model.llm.layers.{L}.mlp.experts.{w13_weight,w2_weight}`) are quantized, with
ModelOpt's NVFP4 math (sgl_inkling_kernels.nvfp4.quantize_nvfp4): per expert scale2 = amax / (448 * 6),
per 16 inputs an fp8 e4m3 block scale, round-to-nearest e2m1 codes. Each becomes the real layout's
`W` (uint8 codes), `W.scale`, `W.scale2`, `W.input_amax` and `W.original_shape`; every other tensor is
copied unchanged, and `hf_quant_config.json` names the format. There is no calibration data here, so
`input_amax` is written as 448 * 6 (an activation scale of 1): W4A16 never reads it, a W4A4 runtime
would need a calibrated export. Output is sharded with an index when larger than one shard.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from sgl_inkling.models.inkling.weights import checkpoint_files
from sgl_inkling_kernels.nvfp4 import BLOCK, E2M1_MAX, FP8_MAX, quantize_nvfp4

ROUTED = re.compile(r"^model\.llm\.layers\.\d+\.mlp\.experts\.(w13_weight|w2_weight)$")
# Everything but the routed experts stays in the source precision (ModelOpt wildcards).
EXCLUDE_MODULES = [
    "model.llm.embed", "model.llm.embed_norm", "model.llm.norm", "model.llm.unembed",
    "model.llm.layers.*.attn*", "model.llm.layers.*.attn_sconv", "model.llm.layers.*.mlp_sconv",
    "model.llm.layers.*.attn_norm", "model.llm.layers.*.mlp_norm", "model.llm.layers.*.mlp.gate",
    "model.llm.layers.*.mlp.shared_experts*", "model.llm.layers.*.mlp.w13_dn", "model.llm.layers.*.mlp.w2_md",
    "model.mtp*", "model.visual*", "model.audio*",
]  # fmt: skip
UNCALIBRATED_INPUT_AMAX = FP8_MAX * E2M1_MAX
_WEIGHT_FILES = (".safetensors", ".safetensors.index.json")
_EXPERTS_PER_CHUNK = 8


def hf_quant_config() -> dict:
    return {
        "producer": {"name": "modelopt", "version": "sgl_inkling.tools.quantize_nvfp4"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": BLOCK,
            "exclude_modules": EXCLUDE_MODULES,
        },
    }


def quantized_tensors(name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """One routed-expert weight `[E, rows, cols]` -> the five tensors of the real layout. Experts are
    independent (scale2 is per expert), so they are quantized a few at a time: full-size Inkling's
    w13 is 256 x 6144 x 6144, 38 GB in the fp32 the math runs in."""
    parts = [quantize_nvfp4(w[e : e + _EXPERTS_PER_CHUNK]) for e in range(0, w.shape[0], _EXPERTS_PER_CHUNK)]
    codes, scale, scale2 = (torch.cat(x) for x in zip(*parts))
    return {
        name: codes,
        f"{name}.scale": scale,
        f"{name}.scale2": scale2,
        f"{name}.input_amax": torch.tensor([UNCALIBRATED_INPUT_AMAX], dtype=torch.float32),
        f"{name}.original_shape": torch.tensor(list(w.shape), dtype=torch.int32),
    }


def tensor_names(src: Path) -> list[str]:
    names = []
    for f in checkpoint_files(src):
        with safe_open(f, framework="pt", device="cpu") as sf:
            names += list(sf.keys())
    return names


def source_tensors(src: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for f in checkpoint_files(src):
        with safe_open(f, framework="pt", device="cpu") as sf:
            for name in sf.keys():
                yield name, sf.get_tensor(name)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?B?)", text.strip().upper())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 5GB, 500MB)")
    unit = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12}
    return int(float(m[1]) * unit[m[2]])


def convert(src: str | Path, dst: str | Path, max_shard_bytes: int = 5 * 10**9, progress: bool = True) -> Path:
    """Quantize SRC's routed experts into DST (created; must not hold a checkpoint already)."""
    src, dst = Path(src), Path(dst)
    if (dst / "config.json").exists():
        raise FileExistsError(f"{dst} already holds a checkpoint")
    config = json.loads((src / "config.json").read_text())
    if "quantization_config" in config:
        raise ValueError(f"{src} is already quantized (config.json has quantization_config)")
    dst.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    quantized = 0
    total = len(tensor_names(src))
    for name, t in tqdm(source_tensors(src), total=total, desc="Quantizing", unit="tensor", disable=not progress):
        if name.endswith((".scale", ".scale2", ".input_amax")):
            raise ValueError(f"{src} is already quantized (tensor {name!r})")
        out = quantized_tensors(name, t) if ROUTED.match(name) else {name: t.contiguous()}
        quantized += len(out) > 1
        nbytes = sum(x.numel() * x.element_size() for x in out.values())
        if sizes[-1] and sizes[-1] + nbytes > max_shard_bytes:
            shards.append({})
            sizes.append(0)
        shards[-1].update(out)
        sizes[-1] += nbytes
    if not quantized:
        raise ValueError(f"{src} has no routed-expert tensors (model.llm.layers.*.mlp.experts.w13_weight) to quantize")
    if len(shards) == 1:
        save_file(shards[0], str(dst / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k, shard in enumerate(shards):
            file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(dst / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
        index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    (dst / "hf_quant_config.json").write_text(json.dumps(hf_quant_config(), indent=2))
    for extra in src.iterdir():  # tokenizer and generation files, if any
        if extra.is_file() and not extra.name.endswith(_WEIGHT_FILES) and not (dst / extra.name).exists():
            shutil.copy(extra, dst / extra.name)
    if progress:
        print(f"wrote {dst}: {quantized} routed-expert tensors in NVFP4, {len(shards)} shard(s), "
              f"{sum(sizes) / 1e9:.2f} GB", file=sys.stderr)  # fmt: skip
    return dst


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sgl_inkling.tools.quantize_nvfp4", description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="BF16 Inkling checkpoint directory (config.json + *.safetensors)")
    p.add_argument("dst", type=Path, help="output directory")
    p.add_argument("--max-shard-size", type=parse_size, default=5 * 10**9, help="default 5GB")
    args = p.parse_args(argv)
    convert(args.src, args.dst, args.max_shard_size)


if __name__ == "__main__":
    main()
