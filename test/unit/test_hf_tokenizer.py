"""The Hugging Face tokenizer converted from tml-renderers' o200k vocabulary: loaded offline through
`transformers.AutoTokenizer`, it must give the runtime tokenizer's ids for text and every special."""

from __future__ import annotations

import os
import random

import pytest
from transformers import AutoTokenizer

from sgl_inkling.chat.hf_tokenizer import ensure_hf_tokenizer, tokenizer_dir_for
from sgl_inkling.chat.tokenizer import get_tokenizer


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    return root, ensure_hf_tokenizer(root)


@pytest.fixture(scope="module")
def hf(written, monkeypatch_module):
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(str(written[1]))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_random_text_encodes_to_the_same_ids(hf):
    ours = get_tokenizer()
    rng = random.Random(17)
    for _ in range(5):
        # Text decoded from random base-vocabulary ids: every script, byte pieces, odd whitespace.
        text = ours.decode([rng.randrange(199998) for _ in range(800)])
        assert hf.encode(text, add_special_tokens=False) == ours.encode(text)
    for text in ["", " ", "a", "Hello world", "   leading", "x\n\n\n", "ÀÉÎõü", "中文字符测试", "مرحبا", "🙂🙃"]:
        assert hf.encode(text, add_special_tokens=False) == ours.encode(text), text


def test_every_special_token_keeps_its_id(hf):
    ours = get_tokenizer()
    names = ours.tml.special_tokens()
    assert len(names) >= 16
    for name in names:
        tid = ours.token_id(name)
        assert hf.convert_tokens_to_ids(f"<|{name}|>") == tid
        assert hf.decode([tid]) == ours.decode([tid])
    assert hf.eos_token_id == ours.token_id("content_model_end_sampling")
    assert len(hf) == ours.vocab_size
    ids = ours.encode("Hi") + [ours.token_id("end_message")]
    assert hf.decode(ids, skip_special_tokens=True) == "Hi"


def test_written_once_and_reused(written):
    root, path = written
    before = (path / "tokenizer.json").stat().st_mtime_ns
    assert ensure_hf_tokenizer(root) == path
    assert (path / "tokenizer.json").stat().st_mtime_ns == before
    assert [p.name for p in (root / "tokenizers").iterdir()] == [path.name]  # no temporary left behind


def test_linked_into_a_checkpoint_without_one(written, tmp_path, monkeypatch):
    root, cached = written
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    assert tokenizer_dir_for(ckpt, root) == ckpt
    assert (ckpt / "tokenizer.json").resolve() == (cached / "tokenizer.json").resolve()
    assert (ckpt / "tokenizer_config.json").is_file()
    own = tmp_path / "own"
    own.mkdir()
    (own / "tokenizer.json").write_text("{}")
    assert tokenizer_dir_for(own, root) == own  # a checkpoint's own tokenizer is left alone

    def refuse(*_):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(os, "symlink", refuse)  # a read-only checkpoint: the cached directory is the answer
    ro = tmp_path / "ro"
    ro.mkdir()
    assert tokenizer_dir_for(ro, root) == cached and not list(ro.iterdir())
