"""Turn `--model-path` into a local checkpoint directory, never touching the network.

Accepted forms: nothing / `inkling-tiny` (the embedded test model, written on first use),
`inkling-tiny-nvfp4` (the same with NVFP4 routed experts, converted on first use), a local
directory holding `config.json`, or a Hugging Face repo id (`org/name`) already present in the
local hub cache. Downloads are deliberately out of scope: a serving process that silently pulls
hundreds of GB at start-up is worse than one that fails with instructions.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# Hub repo ids: `name` (legacy, no org) or `org/name`; letters, digits, `-`, `_`, `.`.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelNotFoundError(ValueError):
    """The model could not be found locally; the message lists every place that was checked."""


def hf_hub_cache_dir() -> Path:
    """The hub cache directory, resolved the way huggingface_hub does it.

    Read from the environment on each call (huggingface_hub freezes it at import time), so a
    changed HF_HUB_CACHE / HF_HOME is honoured.
    """
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):  # the second is the legacy name
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def _find_in_hub_cache(repo_id: str, looked: list[str]) -> Path | None:
    """Snapshot directory of `repo_id` with a config.json, preferring the one refs/main names."""
    cache = hf_hub_cache_dir()
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    if not repo_dir.is_dir():
        looked.append(f"{repo_dir} (not in the hub cache {cache})")
        return None
    snapshots = repo_dir / "snapshots"
    ref_main = repo_dir / "refs" / "main"
    if ref_main.is_file():
        preferred = snapshots / ref_main.read_text().strip()
        looked.append(f"{preferred / 'config.json'} (snapshot named by {ref_main})")
        if (preferred / "config.json").is_file():
            return preferred
    else:
        looked.append(f"{ref_main} (absent)")
    # No usable refs/main (e.g. a download pinned to a commit): take the newest complete snapshot.
    candidates = list(snapshots.iterdir()) if snapshots.is_dir() else []
    candidates.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    looked.append(f"{snapshots}/*/config.json ({len(candidates)} snapshot(s) present)")
    for snap in candidates:
        if (snap / "config.json").is_file():
            return snap
    return None


def resolve_model_path(model: str | None) -> Path:
    """Local directory of the checkpoint named by `model` (see the module docstring)."""
    from sgl_inkling.models.inkling.tiny import TINY_NAME, ensure_tiny_checkpoint
    from sgl_inkling.models.inkling.tiny_nvfp4 import NAME as TINY_NVFP4_NAME
    from sgl_inkling.models.inkling.tiny_nvfp4 import ensure_tiny_nvfp4_checkpoint

    if model is None or model == TINY_NAME:
        return ensure_tiny_checkpoint()
    if model == TINY_NVFP4_NAME:
        return ensure_tiny_nvfp4_checkpoint()

    local = Path(model).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelNotFoundError(
                f"--model-path {model!r}: directory {local.resolve()} has no config.json; "
                "point it at a Hugging Face-style checkpoint directory (config.json + *.safetensors)"
            )
        return local.resolve()
    if local.exists():
        raise ModelNotFoundError(f"--model-path {model!r}: {local.resolve()} is a file, not a directory")

    looked = [f"{local.resolve()} (no such local directory)"]
    if _REPO_ID.match(model):
        found = _find_in_hub_cache(model, looked)
        if found is not None:
            return found
        hint = (
            f"The runtime never downloads models. Fetch it first, e.g. `huggingface-cli download {model}` "
            "(or `hf download`), or set HF_HUB_CACHE / HF_HOME to the cache that holds it, or pass "
            "--model-path a local directory with config.json."
        )
    else:
        hint = "Pass --model-path a local directory with config.json, or a Hugging Face repo id (org/name)."
    places = "\n".join(f"  - {p}" for p in looked)
    raise ModelNotFoundError(f"--model-path {model!r} was not found locally. Looked in:\n{places}\n{hint}")
