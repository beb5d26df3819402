"""`python -m sglang.launch_server [flags]`: SGLang's entry point, serving TML Inkling."""

from __future__ import annotations

import sys

from sgl_inkling.entrypoints.launch import launch_server
from sgl_inkling.server_args import parse_server_args

__all__ = ["launch_server", "main"]


def main(argv: list[str] | None = None) -> None:
    launch_server(parse_server_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
