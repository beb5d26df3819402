"""A Hugging Face tokenizer (tokenizer.json, tokenizer_config.json) for Inkling's o200k chat vocabulary.

Checkpoints carry no tokenizer files, but SGLang's own tools (bench_serving, sglang-router) and
`transformers.AutoTokenizer` need a loadable directory. It is converted once from the vocabulary
tml-renderers ships (so nothing is downloaded), written to the runtime's cache, keyed by a digest of
that vocabulary and its special tokens, and checked against the runtime tokenizer before use.
sglang-router loads a worker's tokenizer from its model path, so the files are also linked into a
writable checkpoint directory that has none.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from sgl_inkling.chat.tokenizer import InklingTokenizer, get_tokenizer

logger = logging.getLogger(__name__)

# tiktoken's o200k_base pre-tokenisation pattern (the split before byte-pair merging).
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])  # fmt: skip
# A sample the written tokenizer must encode exactly as the runtime does before it is used.
CHECK_TEXT = (
    "Hello, world! It's 2026; naïve café — 東京 👋🏽 \n\n\tdef f(x):\n    return x**2  # ok\r\n"
    "I'LL they're WE'VE 1234567 3.14159 https://example.com/a?b=c  trailing   "
)


def vocab_file() -> Path:
    import tml_renderers

    return Path(tml_renderers.__file__).parent / "data" / "o200k_base.tiktoken"


def load_ranks(path: Path) -> dict[bytes, int]:
    """A .tiktoken file: one `base64(token bytes) rank` pair per line."""
    ranks = {}
    for line in path.read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


class _O200kConverter(TikTokenConverter):
    """transformers' tiktoken converter, reading the file without the tiktoken package."""

    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
        return load_ranks(Path(tiktoken_url))


def _specials(tok: InklingTokenizer) -> dict[int, str]:
    return {tok.token_id(n): f"<|{n}|>" for n in tok.tml.special_tokens()}


def cache_root() -> Path:
    return Path(os.environ.get("SGLANG_INKLING_CACHE", Path.home() / ".cache" / "sglang-inkling"))


def _digest(tok: InklingTokenizer) -> str:
    h = hashlib.sha256(vocab_file().read_bytes())
    h.update(json.dumps(sorted(_specials(tok).items())).encode())
    h.update(O200K_PATTERN.encode())
    return h.hexdigest()[:16]


def build_hf_tokenizer(tok: InklingTokenizer) -> PreTrainedTokenizerFast:
    """The converted tokenizer; special tokens keep the runtime's ids (they follow the base ranks)."""
    specials = _specials(tok)
    converter = _O200kConverter(str(vocab_file()), pattern=O200K_PATTERN, extra_special_tokens=None)
    backend = converter.converted()
    ranks = backend.get_vocab_size()
    if sorted(specials) != list(range(ranks, ranks + len(specials))):
        raise RuntimeError(f"special token ids do not follow the {ranks} base ranks: {sorted(specials)[:3]}...")
    from tokenizers import AddedToken

    backend.add_special_tokens([AddedToken(specials[i], special=True, normalized=False) for i in sorted(specials)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=specials[tok.eos_token_ids[0]],  # end of turn, the stop token
        pad_token=specials[tok.token_id("endoftext")],
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def check_equal(hf, tok: InklingTokenizer) -> None:
    """Raise unless `hf` encodes the sample and spells every special as the runtime tokenizer does."""
    ours, theirs = tok.encode(CHECK_TEXT), hf.encode(CHECK_TEXT, add_special_tokens=False)
    if ours != theirs:
        raise RuntimeError(f"converted tokenizer disagrees with the runtime's: {theirs[:16]} vs {ours[:16]}")
    for token_id, spelling in _specials(tok).items():
        if hf.convert_tokens_to_ids(spelling) != token_id:
            raise RuntimeError(f"converted tokenizer maps {spelling} to {hf.convert_tokens_to_ids(spelling)}")


def ensure_hf_tokenizer(root: Path | None = None) -> Path:
    """The directory holding the converted tokenizer, written on first use (a few seconds)."""
    tok = get_tokenizer()
    target = (root or cache_root()) / "tokenizers" / f"inkling-o200k-chat-{_digest(tok)}"
    if (target / "tokenizer.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    logger.info("Writing a Hugging Face tokenizer for the o200k chat vocabulary to %s", target)
    hf = build_hf_tokenizer(tok)
    check_equal(hf, tok)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        hf.save_pretrained(tmp)
        # transformers 5 names its own backend class; older releases (and other tools) know this name.
        config = json.loads((tmp / "tokenizer_config.json").read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
        # Another process may have finished first; its directory is as good as ours.
        if not target.exists():
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_dir_for(model_dir: Path, root: Path | None = None) -> Path:
    """Where the served model's tokenizer is: the checkpoint's own files, else the converted ones,
    linked into the checkpoint directory when it is writable (else the cache directory itself)."""
    if (model_dir / "tokenizer.json").is_file():
        return model_dir
    cached = ensure_hf_tokenizer(root)
    try:
        for name in TOKENIZER_FILES:
            tmp = model_dir / f".{name}.{os.getpid()}.tmp"
            tmp.unlink(missing_ok=True)
            os.symlink(cached / name, tmp)
            os.replace(tmp, model_dir / name)  # also replaces a link left dangling by a cleared cache
    except OSError as e:
        logger.info("Cannot link the tokenizer into %s (%s); it stays in %s", model_dir, e, cached)
        return cached
    return model_dir
