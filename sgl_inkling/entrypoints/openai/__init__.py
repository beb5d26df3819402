"""OpenAI-compatible API: request/response models, the completions and chat endpoints, the router."""

from sgl_inkling.entrypoints.openai.router import build_openai_router
from sgl_inkling.entrypoints.openai.serving_base import TokenizerManager

__all__ = ["TokenizerManager", "build_openai_router"]
