"""Image and audio input: loading and validating media, preprocessing, prompt expansion, cache keys,
and the per-chunk input embeddings of the scheduler."""

from sgl_inkling.multimodal.errors import MediaError
from sgl_inkling.multimodal.items import MediaItem

__all__ = ["MediaError", "MediaItem"]
