"""`python -m sglang.launch_server`: resolve the model, start the backend processes, serve HTTP."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import uvicorn

from sgl_inkling.chat.hf_tokenizer import tokenizer_dir_for
from sgl_inkling.distributed.launch import serve_ranks_only
from sgl_inkling.entrypoints.drain import DrainingServer
from sgl_inkling.entrypoints.http_server import create_app
from sgl_inkling.entrypoints.subprocesses import start_backend
from sgl_inkling.managers.subprocess_utils import configure_logging
from sgl_inkling.managers.tokenizer_manager import TokenizerManager
from sgl_inkling.model_resolution import ModelNotFoundError, resolve_model_path
from sgl_inkling.models.inkling.quant_config import check_quantization

logger = logging.getLogger("sglang.launch_server")
KEEP_ALIVE_S = 75  # idle keep-alive connections: longer than clients keep theirs (see launch_server)


def launch_server(server_args) -> None:
    configure_logging(server_args.log_level)
    try:
        model_path = resolve_model_path(server_args.model_path, server_args.revision, server_args.download_dir)
        check_quantization(server_args.quantization, model_path, server_args.load_format)
    except (ModelNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    logger.info("loading %s from %s", server_args.served_model_name, model_path)
    if server_args.node_rank > 0:  # multi-node: only node 0 serves HTTP; this one runs TP ranks
        sys.exit(serve_ranks_only(server_args, str(model_path)))
    try:
        backend = start_backend(server_args, str(model_path))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    backend.info["model_path"] = str(model_path)
    # SGLang's tools load the tokenizer /get_model_info names; checkpoints carry none, so write one.
    backend.info["tokenizer_path"] = server_args.tokenizer_path or str(tokenizer_dir_for(Path(model_path)))
    tm = TokenizerManager(server_args, backend.info, backend.addrs["scheduler"], backend.addrs["tokenizer"])
    app = create_app(tm, backend, server_args)
    config = uvicorn.Config(
        app,
        host=server_args.host,
        port=server_args.port,
        log_level=server_args.log_level,
        timeout_graceful_shutdown=10,  # after the drain: connections still open then are closed
        # An idle keep-alive connection outlives the clients' own expiry (httpx, and so the OpenAI
        # client, drop theirs after 5 s, uvicorn's default too): with equal timeouts a request sent on
        # a pooled connection as the server closes it fails with "Server disconnected" (seen at 100
        # concurrent chat requests after a 30 s pause in test_grammar.py).
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    try:
        DrainingServer(config, tm, server_args.graceful_shutdown_timeout).run()
    finally:
        backend.shutdown()
