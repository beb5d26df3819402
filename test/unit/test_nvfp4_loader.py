"""NVFP4 routed experts (the Inkling-NVFP4 layout) as the loader builds them, checked against a decoder
written here from the format's definition (16-entry e2m1 table, fp8 e4m3 bit decoding, scale2), and
the converter's output round-tripping through the loader. Rank slices are built in-process by setting
the parallel state (loading needs no collectives)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sgl_inkling.distributed.parallel_state import ParallelState, get_parallel, set_parallel
from sgl_inkling.model_executor.model_loader import load_model
from sgl_inkling.models.inkling.quant_config import QuantizationError
from sgl_inkling.models.inkling.tiny import TINY_CONFIG
from sgl_inkling.models.inkling.weights import WeightLoadError

from .helpers import prompt_logits, seq_runner

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
TEXT = TINY_CONFIG["text_config"]
MOE_LAYERS = [i for i, t in enumerate(TEXT["mlp_layer_types"]) if t == "sparse"]
W13 = "model.llm.layers.{}.mlp.experts.w13_weight"
W2 = "model.llm.layers.{}.mlp.experts.w2_weight"


def fp8_e4m3fn(byte: int) -> float:
    """float8_e4m3fn from its bits: 1 sign, 4 exponent (bias 7), 3 mantissa; exponent 0 is subnormal."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if exp == 0xF and man == 0x7:
        return float("nan")
    if exp == 0:
        return sign * man / 8 * 2.0**-6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


FP8_TABLE = torch.tensor([fp8_e4m3fn(b) for b in range(256)], dtype=torch.float32)
E2M1_TABLE = torch.tensor(E2M1, dtype=torch.float32)


def decode(codes: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor) -> torch.Tensor:
    """[E, r, c/2] uint8, [E, r, c/16] fp8, [E] fp32 -> [E, r, c] fp32: (e2m1 * fp8) * scale2."""
    lo, hi = (codes & 0xF).long(), (codes >> 4).long()
    values = E2M1_TABLE[torch.stack([lo, hi], -1).flatten(-2)]
    block = FP8_TABLE[scale.view(torch.uint8).long()]
    block = block[..., None].expand(*block.shape, 16).flatten(-2)
    return (values * block) * scale2.float()[:, None, None]


def read(path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            out.update({k: sf.get_tensor(k) for k in sf.keys()})
    return out


@pytest.fixture(scope="module")
def nvfp4_path():
    from sgl_inkling.models.inkling.tiny_nvfp4 import ensure_tiny_nvfp4_checkpoint

    return ensure_tiny_nvfp4_checkpoint()


@pytest.fixture(scope="module")
def ckpt(nvfp4_path):
    return read(nvfp4_path)


def load_rank(path, tp: int = 1, rank: int = 0, ep: int = 1, **kw):
    saved = get_parallel()
    set_parallel(ParallelState(tp_size=tp, tp_rank=rank, ep_size=ep))
    try:
        return load_model(path, torch.float32, "cpu", progress=False, **kw)
    finally:
        set_parallel(saved)


def test_checkpoint_has_the_real_layout(nvfp4_path, ckpt):
    e, i, h = TEXT["n_routed_experts"], TEXT["moe_intermediate_size"], TEXT["hidden_size"]
    quant = json.loads((nvfp4_path / "hf_quant_config.json").read_text())
    assert quant["quantization"]["quant_algo"] == "NVFP4" and quant["quantization"]["group_size"] == 16
    for layer in MOE_LAYERS:
        for name, rows, cols in ((W13.format(layer), 2 * i, h), (W2.format(layer), h, i)):
            assert ckpt[name].dtype == torch.uint8 and ckpt[name].shape == (e, rows, cols // 2)
            assert ckpt[f"{name}.scale"].dtype == torch.float8_e4m3fn
            assert ckpt[f"{name}.scale"].shape == (e, rows, cols // 16)
            assert ckpt[f"{name}.scale2"].dtype == torch.float32 and ckpt[f"{name}.scale2"].shape == (e,)
            assert ckpt[f"{name}.original_shape"].tolist() == [e, rows, cols]
            assert ckpt[f"{name}.input_amax"].dtype == torch.float32
    # Everything else kept its precision; the dense MLP of layer 0 and the sinks are not quantized.
    assert ckpt["model.llm.layers.1.mlp.shared_experts.shared_w13_weight"].dtype == torch.float32
    assert "model.llm.layers.0.mlp.w13_dn.weight.scale" not in ckpt


def test_quantization_matches_the_bf16_weights(tiny_path, ckpt):
    """Decoded NVFP4 is within half an e2m1 step of the source weight, per block (ModelOpt's RTN)."""
    src = read(tiny_path)
    for layer in MOE_LAYERS:
        for name in (W13.format(layer), W2.format(layer)):
            w = src[name]
            d = decode(ckpt[name], ckpt[f"{name}.scale"], ckpt[f"{name}.scale2"])
            step = FP8_TABLE[ckpt[f"{name}.scale"].view(torch.uint8).long()] * ckpt[f"{name}.scale2"][:, None, None]
            # Largest e2m1 gap is 2 (4 -> 6); block scales are rounded to fp8 too (3 mantissa bits).
            err = (d - w).abs().unflatten(-1, (-1, 16)).amax(-1)
            assert bool((err <= step * 1.0 * 1.07 + 1e-12).all()), name
            assert torch.nn.functional.cosine_similarity(d.flatten(), w.flatten(), dim=0) > 0.99


@pytest.mark.parametrize("tp,ep,rank", [(1, 1, 0), (2, 1, 1), (2, 2, 1), (4, 2, 2)])
def test_loader_matches_the_independent_decoder_bit_for_bit(nvfp4_path, ckpt, tp, ep, rank):
    model = load_rank(nvfp4_path, tp, rank, ep)
    p = ParallelState(tp_size=tp, tp_rank=rank, ep_size=ep)
    n_exp, i = TEXT["n_routed_experts"] // ep, TEXT["moe_intermediate_size"] // p.moe_tp_size
    experts = slice(p.ep_rank * n_exp, (p.ep_rank + 1) * n_exp)
    for layer in MOE_LAYERS:
        mod = model.model.llm.layers[layer].mlp.experts
        assert mod.nvfp4
        want13 = decode(*(ckpt[W13.format(layer) + s] for s in ("", ".scale", ".scale2")))
        want2 = decode(*(ckpt[W2.format(layer) + s] for s in ("", ".scale", ".scale2")))
        want13 = want13[experts, 2 * i * p.moe_tp_rank : 2 * i * (p.moe_tp_rank + 1)]
        want2 = want2[experts, :, i * p.moe_tp_rank : i * (p.moe_tp_rank + 1)]
        for e in range(n_exp):
            w13, w2 = mod.expert_weights(e, torch.float32)
            assert torch.equal(w13, want13[e]) and torch.equal(w2, want2[e]), (layer, e)
        # The packed tensors are held as stored (no repacking), only sliced.
        assert mod.w13_weight.dtype == torch.uint8 and mod.w2_weight_scale.dtype == torch.float8_e4m3fn


def test_converter_round_trips(tmp_path, tiny_path, ckpt, nvfp4_path):
    """quantize -> write -> load -> dequantize equals the quantizer's own output; sharded output too."""
    from sgl_inkling.tools.quantize_nvfp4 import convert
    from sgl_inkling_kernels.nvfp4 import dequantize_nvfp4, quantize_nvfp4

    out = convert(tiny_path, tmp_path / "sharded", max_shard_bytes=20_000_000, progress=False)
    assert len(list(out.glob("*.safetensors"))) > 1 and (out / "model.safetensors.index.json").exists()
    model = load_model(out, torch.float32, "cpu", progress=False)
    src = read(tiny_path)
    for layer in MOE_LAYERS:
        mod = model.model.llm.layers[layer].mlp.experts
        for name, attr in ((W13.format(layer), "w13_weight"), (W2.format(layer), "w2_weight")):
            codes, scale, scale2 = quantize_nvfp4(src[name])
            assert torch.equal(getattr(mod, attr), codes)
            assert torch.equal(getattr(mod, f"{attr}_scale").view(torch.uint8), scale.view(torch.uint8))
            assert torch.equal(getattr(mod, f"{attr}_scale2"), scale2)
            got = torch.stack([mod.expert_weights(e, torch.float32)[attr == "w2_weight"] for e in range(len(codes))])
            assert torch.equal(got, dequantize_nvfp4(codes, scale, scale2))
            assert torch.equal(codes, ckpt[name])  # the cached inkling-tiny-nvfp4 is the same conversion


def write_variant(tmp_path, nvfp4_path, ckpt, edit):
    t = dict(ckpt)
    edit(t)
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file(t, str(tmp_path / "model.safetensors"))
    for f in ("config.json", "hf_quant_config.json"):
        (tmp_path / f).write_text((nvfp4_path / f).read_text())
    return tmp_path


NAME = W2.format(2)


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda t: t.__setitem__(NAME + ".scale", t[NAME + ".scale"].float()), r"\.scale'.*dtype F32, expected F8_E4M3"),
        (lambda t: t.__setitem__(NAME, t[NAME].to(torch.int8)), r"w2_weight'.*dtype I8, expected U8"),
        (lambda t: t.__setitem__(NAME + ".scale2", t[NAME + ".scale2"].double()), r"scale2'.*dtype F64"),
        (lambda t: t.__setitem__(NAME, t[NAME][:, :, :-1].clone()), r"w2_weight'.*shape"),
        (lambda t: t.__setitem__(NAME + ".scale", t[NAME + ".scale"][:, :-1].clone()), r"\.scale'.*shape"),
        (lambda t: t.__setitem__(NAME + ".original_shape", torch.tensor([8, 64, 30], dtype=torch.int32)), "original_shape"),
        (lambda t: t.__setitem__(NAME + ".input_amax", torch.ones(3)), "input_amax"),
        (lambda t: t.pop(NAME + ".scale2"), re.escape(NAME + "_scale2")),
        (lambda t: t.__setitem__(NAME + ".weight_global_scale", torch.ones(8)), "compressed-tensors"),
        (lambda t: t.__setitem__("model.llm.layers.1.attn.wq_du.weight.scale", torch.ones(2)), "only the routed"),
    ],
    ids=["scale-f32", "codes-i8", "scale2-f64", "codes-shape", "scale-shape", "original-shape", "input-amax",
         "missing-scale2", "compressed-tensors", "quantized-attention"],
)  # fmt: skip
def test_bad_nvfp4_tensor_is_refused_naming_it(tmp_path, nvfp4_path, ckpt, edit, match):
    path = write_variant(tmp_path, nvfp4_path, ckpt, edit)
    with pytest.raises(WeightLoadError, match=match):
        load_model(path, torch.float32, "cpu", progress=False)


def test_quantization_flag_against_the_checkpoint(tmp_path, tiny_path, nvfp4_path):
    from sgl_inkling.server_args import ServerArgs, ServerArgsError, parse_server_args

    assert parse_server_args(["--quantization", "modelopt_fp4", "--device", "cpu"]).quantization == "modelopt_fp4"
    with pytest.raises(ServerArgsError, match="--quantization: 'gptq' is not supported"):
        ServerArgs(quantization="gptq", device="cpu").check()
    for alias in ("modelopt_fp4", "modelopt", "nvfp4"):
        assert load_rank(nvfp4_path, quantization=alias).model.llm.layers[1].mlp.experts.nvfp4
    with pytest.raises(QuantizationError, match="--quantization modelopt_fp4: the checkpoint is not quantized"):
        load_model(tiny_path, progress=False, quantization="modelopt_fp4")
    with pytest.raises(QuantizationError, match="'awq' is not supported"):
        load_model(nvfp4_path, progress=False, quantization="awq")
    # A quantized checkpoint whose config is gone: its extra tensors are refused, named.
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).symlink_to(nvfp4_path / f)
    with pytest.raises(WeightLoadError, match=r"w13_weight.*declares no quantization"):
        load_model(bare, progress=False)


@pytest.mark.parametrize(
    "quant,match",
    [
        ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}, "quant_algo 'FP8'"),
        ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 32}}, "group_size 32"),
        ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4",
          "exclude_modules": ["model.llm.layers.2.mlp.experts"]}}, "layers.2.mlp.experts in BF16"),
    ],
    ids=["fp8", "group-32", "experts-excluded"],
)  # fmt: skip
def test_unsupported_checkpoint_quantization_is_refused(tmp_path, nvfp4_path, quant, match):
    for f in ("config.json", "model.safetensors"):
        (tmp_path / f).symlink_to(nvfp4_path / f)
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(quant))
    with pytest.raises(QuantizationError, match=match):
        load_model(tmp_path, progress=False)


def test_flat_quantization_config_in_config_json(tmp_path, nvfp4_path):
    """Newer ModelOpt exports: config.json quantization_config (quant_method modelopt, flat fields)."""
    cfg = json.loads((nvfp4_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": []}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").symlink_to(nvfp4_path / "model.safetensors")
    assert load_model(tmp_path, progress=False).model.llm.layers[3].mlp.experts.nvfp4
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(QuantizationError, match="'compressed-tensors' is not supported"):
        load_model(tmp_path, progress=False)


def test_dummy_nvfp4_weights(tiny_path):
    """`--load-format dummy --quantization modelopt_fp4`: random codes and scales on the device, never
    all zero, weights of std ~0.02 as the BF16 dummy's, the same model at any TP size, and logits on
    the BF16 dummy's scale."""
    full = load_rank(tiny_path, load_format="dummy", quantization="modelopt_fp4")
    bf16 = load_rank(tiny_path, load_format="dummy")
    half = load_rank(tiny_path, 2, 1, load_format="dummy", quantization="modelopt_fp4")
    for layer in MOE_LAYERS:
        mod = full.model.llm.layers[layer].mlp.experts
        for name in ("w13_weight", "w2_weight"):
            codes, scale, scale2 = (getattr(mod, name + s) for s in ("", "_scale", "_scale2"))
            assert codes.dtype == torch.uint8 and len(codes.unique()) > 200  # every byte value occurs
            w = decode(codes, scale, scale2)
            assert bool((w != 0).any()) and 0.017 < float(w.std()) < 0.023, float(w.std())
            ref = getattr(bf16.model.llm.layers[layer].mlp.experts, name).detach()
            assert 0.8 < float(w.std() / ref.std()) < 1.25
        # Rank 1 of TP 2 holds the second half of the same (full-shape) draw.
        i = TEXT["moe_intermediate_size"] // 2
        rank1 = half.model.llm.layers[layer].mlp.experts
        assert torch.equal(rank1.w13_weight, mod.w13_weight[:, 2 * i :])
        assert torch.equal(rank1.w2_weight_scale.view(torch.uint8), mod.w2_weight_scale[:, :, i // 16 :].view(torch.uint8))
    prompt = list(range(1000, 1030))
    a, b = prompt_logits(seq_runner(full), prompt), prompt_logits(seq_runner(bf16), prompt)
    assert bool(torch.isfinite(a).all()) and 0.5 < float(a.std() / b.std()) < 2.0
