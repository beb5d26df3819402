"""Image preprocessing for the hMLP encoder (INKLING.md section 5).

Decode (PNG, JPEG or WebP only), upscale the long edge x2 with Lanczos up to 2048 px (never
downscale), then cut 40x40 patches in raster order: rows ceil(H/40), columns floor(W/40) + 1, the
extra column padded (it ends each row). Padding is -1 in 0..255 pixel units before the CLIP
normalisation, as the reference processor pads; each patch is repeated over the 2 time steps.
The request side keeps the upscaled uint8 picture (smaller than patches); `patchify` runs where the
encoder runs.
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import torch

from sgl_inkling.multimodal.errors import MediaError

PATCH = 40
TIME_STEPS = 2
MAX_UPSCALED_LONG_EDGE = 2048
MAX_INPUT_PIXELS = 8192 * 8192  # refuse larger pictures before decoding them
FORMATS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def upscaled_size(width: int, height: int) -> tuple[int, int]:
    long_edge = max(width, height)
    target = min(2 * long_edge, max(MAX_UPSCALED_LONG_EDGE, long_edge))
    ratio = target / long_edge
    if ratio == 1.0:
        return width, height
    return math.floor(width * ratio + 0.5), math.floor(height * ratio + 0.5)


def num_patches(width: int, height: int) -> int:
    """Tokens of a picture of this (already upscaled) size."""
    return math.ceil(height / PATCH) * (width // PATCH + 1)


def decode_image(data: bytes) -> np.ndarray:
    """Encoded bytes -> upscaled RGB uint8 [H, W, 3]."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.format not in FORMATS:
                raise MediaError(f"unsupported image format {img.format or 'unknown'}; use PNG, JPEG or WebP")
            if img.width * img.height > MAX_INPUT_PIXELS:
                raise MediaError(f"image of {img.width}x{img.height} pixels is too large")
            img.load()
            img = img.convert("RGB")
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise MediaError("image is too large") from None
    except Exception as e:  # PIL raises many types for truncated or corrupt files
        raise MediaError(f"cannot decode image: {e}") from None
    size = upscaled_size(img.width, img.height)
    if size != (img.width, img.height):
        img = img.resize(size, Image.Resampling.LANCZOS)
    return np.asarray(img, dtype=np.uint8).copy()


def patchify(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [H, W, 3] -> normalised patches [N, TIME_STEPS, PATCH, PATCH, 3] (float32), raster order."""
    h, w, _ = pixels.shape
    rows, cols = math.ceil(h / PATCH), w // PATCH + 1
    canvas = torch.full((rows * PATCH, cols * PATCH, 3), -1.0)
    canvas[:h, :w] = pixels.float()
    mean = torch.tensor([m * 255.0 for m in _CLIP_MEAN])
    std = torch.tensor([s * 255.0 for s in _CLIP_STD])
    canvas = (canvas - mean) / std
    patches = canvas.reshape(rows, PATCH, cols, PATCH, 3).permute(0, 2, 1, 3, 4).reshape(-1, PATCH, PATCH, 3)
    return patches.unsqueeze(1).expand(-1, TIME_STEPS, -1, -1, -1).contiguous()
