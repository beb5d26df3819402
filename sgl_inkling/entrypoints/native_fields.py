"""SGLang /generate fields this server accepts without implementing them.

sglang-router re-serialises every /generate body with its own request type, so a request through it
carries SGLang fields at their defaults even when the client never sent them. Logging knobs are
accepted with any value; a field that asks for an output this server cannot produce is accepted only
at its neutral value, and otherwise refused with a 400 that names it.
"""

from __future__ import annotations

from sgl_inkling.managers.io_struct import RequestError

_IGNORED = {"model", "log_metrics", "no_logs"}  # routing by model name is the router's job
_NEUTRAL = {
    "return_hidden_states": False,
    "return_bytes": False,
    "return_entropy": False,
    "background": False,
    "lora_path": None,
    "session_params": None,
    "custom_logit_processor": None,
}


def strip_accepted_fields(data: dict) -> dict:
    """The body without the fields above; raises RequestError for one set to a value we lack."""
    out = {}
    for key, value in data.items():
        if key in _IGNORED:
            continue
        if key in _NEUTRAL:
            if value != _NEUTRAL[key]:
                raise RequestError(f"'{key}' is not supported by this server (got {value!r})")
            continue
        out[key] = value
    return out
