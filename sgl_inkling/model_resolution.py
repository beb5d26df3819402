"""Turn `--model-path` into a local checkpoint directory, never touching the network.

Accepted forms: nothing / `inkling-tiny` (the embedded test model, written on first use),
`inkling-tiny-nvfp4` (the same with NVFP4 routed experts, converted on first use), a local
directory holding `config.json`, or a Hugging Face repo id (`org/name`) already present in the
local hub cache, found by huggingface_hub itself (`local_files_only`): `--revision` picks a branch,
tag or commit, `--download-dir` the cache directory. Downloads are deliberately out of scope: a
serving process that silently pulls hundreds of GB at start-up is worse than one that fails with
instructions.
"""

from __future__ import annotations

import re
from pathlib import Path

from huggingface_hub import constants, scan_cache_dir, snapshot_download
from huggingface_hub.errors import CacheNotFound, HFValidationError, LocalEntryNotFoundError

# Hub repo ids: `name` (legacy, no org) or `org/name`; letters, digits, `-`, `_`, `.`.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelNotFoundError(ValueError):
    """The model could not be found locally; the message says where it looked and what to do."""


def _cached_revisions(repo_id: str, cache_dir: str) -> str:
    """What the cache holds for `repo_id`, for the error message: commits and the refs naming them."""
    try:
        info = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return f"the hub cache {cache_dir} does not exist"
    repo = next((r for r in info.repos if r.repo_id == repo_id and r.repo_type == "model"), None)
    if repo is None:
        return f"the hub cache {cache_dir} has no snapshot of {repo_id}"
    revs = [f"{r.commit_hash}" + (f" ({', '.join(sorted(r.refs))})" if r.refs else "") for r in repo.revisions]
    return f"the hub cache {cache_dir} has {len(revs)} snapshot(s) of {repo_id}: {', '.join(revs) or 'none'}"


def _from_hub_cache(repo_id: str, revision: str | None, download_dir: str | None) -> Path:
    cache_dir = download_dir or constants.HF_HUB_CACHE
    rev = revision or "main"
    try:
        snap = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError) as e:
        raise ModelNotFoundError(
            f"--model-path {repo_id!r} (revision {rev!r}) was not found locally: {e}\n"
            f"  {_cached_revisions(repo_id, cache_dir)}.\n"
            f"The runtime never downloads models. Fetch it first, e.g. `huggingface-cli download {repo_id}"
            f"{' --revision ' + revision if revision else ''}` (or `hf download`), pass --revision naming a "
            "cached snapshot, --download-dir naming the cache that holds it (or set HF_HUB_CACHE / HF_HOME), "
            "or pass --model-path a local directory with config.json."
        ) from None
    if not (snap / "config.json").is_file():
        raise ModelNotFoundError(f"--model-path {repo_id!r} (revision {rev!r}): snapshot {snap} has no config.json")
    return snap


def resolve_model_path(model: str | None, revision: str | None = None, download_dir: str | None = None) -> Path:
    """Local directory of the checkpoint named by `model` (see the module docstring)."""
    from sgl_inkling.models.inkling.tiny import TINY_NAME, ensure_tiny_checkpoint
    from sgl_inkling.models.inkling.tiny_nvfp4 import NAME as TINY_NVFP4_NAME
    from sgl_inkling.models.inkling.tiny_nvfp4 import ensure_tiny_nvfp4_checkpoint

    hub_only = [flag for flag, v in (("--revision", revision), ("--download-dir", download_dir)) if v]
    if model is None or model == TINY_NAME:
        if hub_only:
            raise ValueError(f"{hub_only[0]} applies to a hub repo id; the embedded {TINY_NAME} has none")
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
        if hub_only:
            raise ValueError(f"{hub_only[0]} applies to a hub repo id; {local.resolve()} is a local directory")
        return local.resolve()
    if local.exists():
        raise ModelNotFoundError(f"--model-path {model!r}: {local.resolve()} is a file, not a directory")
    if not _REPO_ID.match(model):
        raise ModelNotFoundError(
            f"--model-path {model!r}: no such local directory ({local.resolve()}) and not a hub repo id. "
            "Pass --model-path a local directory with config.json, or a Hugging Face repo id (org/name)."
        )
    return _from_hub_cache(model, revision, download_dir)
