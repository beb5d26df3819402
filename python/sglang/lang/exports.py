"""Names the frontend API module exports, in a module with no imports, so that `import sglang` can
list them lazily without loading the frontend."""

API_NAMES = (
    "assistant",
    "assistant_begin",
    "assistant_end",
    "audio",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_server_info",
    "image",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
    "video",
)
