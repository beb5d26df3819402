"""Serve `inkling-slice` by name: the server loads models from a directory, so the benchmarks write
one holding only the slice's config.json (dummy weights are made on the device, no checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

from sgl_inkling.models.inkling.slice_config import SLICE_CONFIG, SLICE_NAME
from sgl_inkling.models.inkling.tiny import TINY_NAME, cache_root

MODEL_FLAGS = ("--model-path", "--model")


def write_slice_dir() -> Path:
    target = cache_root() / SLICE_NAME
    target.mkdir(parents=True, exist_ok=True)
    text = json.dumps(SLICE_CONFIG, indent=2)
    cfg = target / "config.json"
    if not cfg.exists() or cfg.read_text() != text:
        cfg.write_text(text)
    return target


def resolve_bench_model(server_args: list[str]) -> tuple[list[str], str]:
    """Server flags with `--model-path inkling-slice` pointing at its directory (and dummy weights,
    the only kind it has, unless a load format is given); also returns the model's name."""
    args = list(server_args)
    for i, a in enumerate(args[:-1]):
        if a in MODEL_FLAGS and args[i + 1] == SLICE_NAME:
            args[i + 1] = str(write_slice_dir())
            if "--load-format" not in args:
                args += ["--load-format", "dummy"]
            if "--served-model-name" not in args:
                args += ["--served-model-name", SLICE_NAME]
            return args, SLICE_NAME
        if a in MODEL_FLAGS:
            return args, args[i + 1]
    return args, TINY_NAME
