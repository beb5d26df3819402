"""`inkling-tiny-w512`: a narrow Inkling with the real attention reach (sliding window 512,
relative-position extent 1024), for tests and benchmarks of what depends on the window (the prefix
cache's checkpoints and the sliding KV they keep) at CPU speed with prompts of thousands of tokens.
The slice's trunk pattern (sliding, sliding, full) with two narrow heads per layer keeps the
reference attention cheap; seeded random weights, like inkling-tiny.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path

from sgl_inkling.models.inkling import tiny

NAME = "inkling-tiny-w512"
_VERSION = 1

CONFIG: dict = copy.deepcopy(tiny.TINY_CONFIG)
CONFIG["text_config"].update(
    sliding_window_size=512,
    rel_extent=1024,
    max_position_embeddings=16384,
    num_hidden_layers=3,
    layer_types=["hybrid_sliding", "hybrid_sliding", "hybrid"],
    mlp_layer_types=["dense", "sparse", "sparse"],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    swa_num_attention_heads=2,
    swa_num_key_value_heads=2,
    swa_head_dim=8,
)


def ensure_tiny_window_checkpoint() -> Path:
    """Path of the checkpoint, writing it on first use (safe under concurrent callers)."""
    target = tiny.cache_root() / f"{NAME}-v{_VERSION}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=target.parent))
    try:
        tiny.write_random_checkpoint(CONFIG, tmp)
        try:
            tmp.rename(target)
        except OSError:
            pass  # another process finished first; its copy is identical
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
