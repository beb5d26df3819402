"""Audio preprocessing: decode WAV/FLAC/MP3, mix to mono, resample to 16 kHz, dMel-encode.

The dMel encoding itself is tml-renderers' (a 16 kHz 16-bit PCM WAV handed to its renderer): one
frame per 800 samples (50 ms, so 20 tokens a second), 80 mel bands quantised to the checkpoint's
bins. Resampling uses soxr at high quality, the resampler tml-renderers uses through librosa.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import torch

from sgl_inkling.multimodal.errors import MediaError

SAMPLE_RATE = 16_000
HOP = 800  # samples per token
MAX_SECONDS = 600
FORMATS = {"WAV": "wav", "FLAC": "flac", "MP3": "mp3"}


def decode_audio(data: bytes) -> np.ndarray:
    """Encoded bytes -> mono float32 samples at 16 kHz."""
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
    except Exception:
        raise MediaError("cannot decode audio: not a WAV, FLAC or MP3 file") from None
    if info.format not in FORMATS:
        raise MediaError(f"unsupported audio format {info.format}; use WAV, FLAC or MP3")
    if info.duration > MAX_SECONDS:
        raise MediaError(f"audio of {info.duration:.0f} s is too long (limit {MAX_SECONDS} s)")
    try:
        wave, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as e:
        raise MediaError(f"cannot decode audio: {e}") from None
    wave = wave.mean(axis=1)
    if wave.size == 0:
        raise MediaError("audio has no samples")
    if rate != SAMPLE_RATE:
        import soxr

        wave = soxr.resample(wave, rate, SAMPLE_RATE, quality="HQ").astype(np.float32)
    return wave


def wav16k_base64(wave: np.ndarray) -> str:
    """The canonical form handed to tml-renderers: 16 kHz mono 16-bit PCM WAV, base64."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.clip(wave, -1.0, 1.0), SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode()


def num_frames(num_samples: int) -> int:
    return -(-num_samples // HOP)


def dmel_bins(wave: np.ndarray) -> torch.Tensor:
    """dMel bins [frames, 80] (uint8) of 16 kHz samples, by tml-renderers' encoder."""
    from tml_renderers import chat

    from sgl_inkling.chat.render import render_media_message

    pointer = chat.AudioPointer(
        "data:audio/wav;base64," + wav16k_base64(wave), chat.AudioFormat.Wav, len(wave), SAMPLE_RATE
    )
    spans = render_media_message(pointer)
    return next(s.span.dmel for s in spans if isinstance(s.span, chat.DmelTokenSpan)).clone()
