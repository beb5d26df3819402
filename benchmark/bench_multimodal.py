"""Encoder cost of image and audio input, as a ratio to the prefill cost of one text token.

Times, on one model and device: the vision tower on one image's patches (patchify included), the
dMel embedding on one second of audio (20 frames), and a text-only prefill of N tokens (per token).
Request-side preprocessing (decode, upscale, dMel encoding) is timed separately, on the CPU.

    python benchmark/bench_multimodal.py                       # inkling-tiny, CPU
    python benchmark/bench_multimodal.py --model PATH --device cuda --dtype bfloat16 --load-format dummy
Writes JSON to benchmark/results/bench_multimodal_<model>_<device>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from sgl_inkling.model_executor.model_loader import load_model
from sgl_inkling.model_executor.model_runner import ModelRunner
from sgl_inkling.model_executor.seq_runner import SeqRunner
from sgl_inkling.models.inkling.tiny import ensure_tiny_checkpoint
from sgl_inkling.multimodal import audio as audio_mod
from sgl_inkling.multimodal import image as image_mod


def timed(fn, repeat: int, device: torch.device) -> float:
    """Median seconds of fn() after one warm-up call."""
    fn()
    out = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="checkpoint dir (default: inkling-tiny)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--image-size", type=int, nargs=2, default=(512, 384), help="W H before the x2 upscale")
    ap.add_argument("--text-tokens", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    path = args.model or str(ensure_tiny_checkpoint())
    dtype = getattr(torch, args.dtype)
    model = load_model(path, dtype, args.device, args.load_format, progress=False, enable_multimodal=True)
    device = torch.device(args.device)
    runner = SeqRunner(ModelRunner(model, 2, args.text_tokens + 8, args.text_tokens + 64))

    rng = np.random.default_rng(0)
    w, h = args.image_size
    picture = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(picture).save(buf, format="PNG")
    png = buf.getvalue()
    pixels = torch.from_numpy(image_mod.decode_image(png))
    n_patches = image_mod.num_patches(pixels.shape[1], pixels.shape[0])
    wave = (0.1 * rng.standard_normal(audio_mod.SAMPLE_RATE)).astype(np.float32)  # one second
    bins = audio_mod.dmel_bins(wave)

    def prefill() -> None:
        seq = runner.new_seq()
        runner.step([seq], [rng.integers(0, 199_990, args.text_tokens).tolist()])
        runner.free(seq)

    text_s = timed(prefill, args.repeat, device) / args.text_tokens
    image_s = timed(lambda: model.encode_media("image", image_mod.patchify(pixels).to(device)), args.repeat, device)
    audio_s = timed(lambda: model.encode_media("audio", bins.to(device)), args.repeat, device)
    result = {
        "model": Path(path).name,
        "device": str(device),
        "dtype": args.dtype,
        "image_size_in": [w, h],
        "image_size_upscaled": [int(pixels.shape[1]), int(pixels.shape[0])],
        "image_patches": n_patches,
        "text_prefill_s_per_token": text_s,
        "image_encode_s": image_s,
        "image_encode_in_text_tokens": image_s / text_s,
        "image_encode_per_patch_in_text_tokens": image_s / n_patches / text_s,
        "audio_encode_s_per_second": audio_s,
        "audio_encode_per_second_in_text_tokens": audio_s / text_s,
        "cpu_preprocess_image_s": timed(lambda: image_mod.decode_image(png), args.repeat, torch.device("cpu")),
        "cpu_preprocess_audio_s_per_second": timed(lambda: audio_mod.dmel_bins(wave), args.repeat, torch.device("cpu")),
    }
    out = Path(__file__).parent / "results" / f"bench_multimodal_{result['model']}_{device.type}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
