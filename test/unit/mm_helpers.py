"""Media fixtures for the multimodal tests: seeded pictures and clips, encoded as clients send them."""

from __future__ import annotations

import base64
import io

import numpy as np


def picture(width: int, height: int, seed: int) -> np.ndarray:
    """A smooth seeded picture (random noise would make Lanczos ringing dominate)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    out = np.empty((height, width, 3))
    for c in range(3):
        fx, fy, ph = rng.uniform(0.01, 0.2), rng.uniform(0.01, 0.2), rng.uniform(0, 6.3)
        out[..., c] = 127.5 + 120 * np.sin(fx * x + fy * y + ph)
    return out.round().clip(0, 255).astype(np.uint8)


def encode_image(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def clip(seconds: float, rate: int, seed: int, channels: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * rng.uniform(200, 2000) * t) * np.exp(-t)
    wave = tone + 0.05 * rng.standard_normal(t.shape)
    return np.stack([wave] * channels, axis=1).astype(np.float32)


def encode_audio(wave: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, wave, rate, format=fmt)
    return buf.getvalue()
