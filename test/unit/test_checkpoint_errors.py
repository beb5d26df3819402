"""Checkpoints and configs that do not match the model fail with a message that names the culprit."""

from __future__ import annotations

import copy
import json
import re
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sgl_inkling.model_executor.model_loader import load_model
from sgl_inkling.models.inkling.config import ConfigError, InklingConfig
from sgl_inkling.models.inkling.tiny import TINY_CONFIG
from sgl_inkling.models.inkling.weights import WeightLoadError

from .helpers import prompt_logits, random_prompt, seq_runner

VICTIM = "model.llm.layers.1.attn.wk_dv.weight"
MTP_VICTIM = "model.mtp.layers.1.transformer_block.mlp.w13_dn.weight"


def read_all(path) -> dict[str, torch.Tensor]:
    with safe_open(path / "model.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def write_ckpt(tmp_path, tensors, config=TINY_CONFIG):
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.fixture(scope="module")
def tensors(tiny_path):
    return read_all(tiny_path)


@pytest.mark.parametrize("victim", [VICTIM, MTP_VICTIM])
def test_missing_tensor_is_named(tmp_path, tensors, victim):
    t = dict(tensors)
    del t[victim]
    with pytest.raises(WeightLoadError, match=re.escape(victim)):
        load_model(write_ckpt(tmp_path, t), progress=False)


def test_misshapen_tensor_is_named(tmp_path, tensors):
    t = dict(tensors)
    t[VICTIM] = t[VICTIM][:-1].clone()
    with pytest.raises(WeightLoadError, match=re.escape(VICTIM) + ".*shape"):
        load_model(write_ckpt(tmp_path, t), progress=False)


def test_unexpected_tensor_is_named(tmp_path, tensors):
    t = dict(tensors)
    t["model.llm.layers.9.attn.wq_du.weight"] = torch.zeros(2, 2)
    with pytest.raises(WeightLoadError, match=r"model\.llm\.layers\.9\.attn\.wq_du\.weight"):
        load_model(write_ckpt(tmp_path, t), progress=False)


def test_sharded_checkpoint_loads_the_same_model(tmp_path, tiny_path, tensors, tiny_model):
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / fname))
        weight_map.update(dict.fromkeys(keys, fname))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(tiny_path / "config.json", tmp_path / "config.json")
    sharded = load_model(tmp_path, progress=False)
    prompt = random_prompt(20, seed=4)
    assert torch.equal(
        prompt_logits(seq_runner(sharded), prompt), prompt_logits(seq_runner(tiny_model), prompt)
    )


def test_missing_shard_is_named(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "gone.safetensors"}})
    )
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    with pytest.raises(WeightLoadError, match="gone.safetensors"):
        load_model(tmp_path, progress=False)


def _cfg(**text_overrides) -> dict:
    cfg = copy.deepcopy(TINY_CONFIG)
    for k, v in text_overrides.items():
        if v is None:
            cfg["text_config"].pop(k)
        else:
            cfg["text_config"][k] = v
    return cfg


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"hidden_size": None}, "text_config.hidden_size"),
        ({"swa_num_key_value_heads": None}, "text_config.swa_num_key_value_heads"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"layer_types": ["hybrid"]}, "layer_types"),
        ({"mlp_layer_types": ["dense", "moe", "sparse", "sparse"]}, "mlp_layer_types"),
        ({"unpadded_vocab_size": 999_999}, "unpadded_vocab_size"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"head_dim": "16"}, "head_dim"),
    ],
)
def test_config_errors_name_the_field(overrides, named):
    with pytest.raises(ConfigError, match=named):
        InklingConfig.from_dict(_cfg(**overrides))


def test_config_requires_inkling_model_type_and_text_config():
    with pytest.raises(ConfigError, match="model_type"):
        InklingConfig.from_dict({**TINY_CONFIG, "model_type": "llama"})
    with pytest.raises(ConfigError, match="text_config"):
        InklingConfig.from_dict({k: v for k, v in TINY_CONFIG.items() if k != "text_config"})
    bad_mtp = {**TINY_CONFIG, "mtp_config": {"num_nextn_predict_layers": 2, "local_layer_ids": [5]}}
    with pytest.raises(ConfigError, match="local_layer_ids"):
        InklingConfig.from_dict(bad_mtp)


def test_config_reads_every_documented_field():
    cfg = InklingConfig.from_dict(TINY_CONFIG).text
    t = TINY_CONFIG["text_config"]
    assert cfg.layer_types == tuple(t["layer_types"]) and cfg.mlp_layer_types == tuple(t["mlp_layer_types"])
    assert cfg.log_scaling_n_floor == 8 and cfg.unpadded_vocab_size == 200058
    assert cfg.mtp.num_layers == 8
    assert cfg.mtp.layer_types == tuple(
        "hybrid_sliding" if d in (0, 3, 6) else "hybrid" for d in range(8)
    )
    # Defaults when a layout is given by ids instead of types (full layer every 6th).
    derived = InklingConfig.from_dict(_cfg(layer_types=None, num_hidden_layers=12, mlp_layer_types=None)).text
    assert derived.layer_types.count("hybrid") == 2 and derived.layer_types[5] == "hybrid"
    assert set(derived.mlp_layer_types) == {"sparse"}
    assert (
        InklingConfig.from_dict(_cfg(conv_kernel_size=None, sconv_kernel_size=4)).text.conv_kernel_size == 4
    )
