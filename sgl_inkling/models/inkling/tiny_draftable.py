"""`inkling-tiny-draftable`: inkling-tiny with weights under which the MTP depths draft well.

With random weights the depths almost never guess the trunk's token, so speculative decoding would
only ever exercise its rejection path. Here every layer's output projections are scaled down, so
the residual stream stays close to the normalised token embedding: the trunk's next token is then
mostly a function of the current token, and a depth that passes its token embedding through
(`input_proj` ~ [small | identity], the trunk's embed_norm) predicts the token after it. Attention,
short convs and experts still contribute, so some drafts are rejected: both paths get exercised.
A test fixture, not a model: greedy output with and without MTP is compared on it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from sgl_inkling.models.inkling import tiny

NAME = "inkling-tiny-draftable"
_OUTPUT_PROJECTIONS = ("attn.wo_ud.weight", "w2_weight", "w2_md.weight", "shared_w2_weight")


def make_draftable(tensors: dict[str, torch.Tensor], hidden: int, scale: float = 0.03, seed: int = 7) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, t in tensors.items():
        if name.endswith(_OUTPUT_PROJECTIONS):
            t.mul_(scale)
        if name.startswith("model.mtp.") and name.endswith(".embed_norm.weight"):
            t.copy_(tensors["model.llm.embed_norm.weight"])
        if name.endswith(".input_proj.weight"):  # hidden first: [:, :H] reads g, [:, H:] reads e
            t.copy_(0.05 * torch.randn(t.shape, generator=gen) / hidden**0.5)
            t[:, hidden:] += torch.eye(hidden)


def ensure_draftable_checkpoint() -> Path:
    src = tiny.ensure_tiny_checkpoint()
    target = tiny.cache_root() / f"{NAME}-from-{src.name}"
    if (target / "config.json").exists():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=target.parent))
    try:
        config = json.loads((src / "config.json").read_text())
        tensors = load_file(str(src / "model.safetensors"))
        make_draftable(tensors, config["text_config"]["hidden_size"])
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for extra in src.iterdir():  # tokenizer files, if the tiny checkpoint carries any
            if extra.name not in ("config.json", "model.safetensors"):
                shutil.copy(extra, tmp / extra.name)
        try:
            tmp.rename(target)
        except OSError:
            pass  # another process finished first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
