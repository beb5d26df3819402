"""Runtime's process handling and `import sglang` staying cheap, without a model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang.lang.backend.runtime import Runtime, server_flags
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint


def test_server_flags_follow_launch_server_spelling():
    argv = server_flags(
        {
            "model_path": "m",
            "tp_size": 2,
            "skip_server_warmup": True,
            "disable_radix_cache": False,
            "api_key": None,
        }
    )
    assert argv == ["--model-path", "m", "--tp-size", "2", "--skip-server-warmup"]


def test_import_sglang_and_the_frontend_api_do_not_load_torch():
    code = (
        "import sys, sglang as sgl\n"
        "sgl.function, sgl.gen, sgl.select, sgl.user, sgl.image, sgl.audio, sgl.set_default_backend\n"
        "sgl.RuntimeEndpoint, sgl.Runtime\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_runtime_endpoint_sends_the_api_key():
    endpoint = RuntimeEndpoint("http://127.0.0.1:1/", api_key="sk-test")
    assert endpoint.base_url == "http://127.0.0.1:1"
    assert endpoint._session.headers["Authorization"] == "Bearer sk-test"


def test_engine_is_still_exported():
    import sglang
    from sgl_inkling.entrypoints.engine import Engine

    assert sglang.Engine is Engine


def test_runtime_that_cannot_start_says_why():
    with pytest.raises(RuntimeError, match="no-such-flag"):
        Runtime(no_such_flag=1, launch_timeout=60)
