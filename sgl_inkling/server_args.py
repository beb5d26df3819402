"""Server configuration: SGLang's flag names, one dataclass, validation before anything loads.

Only flags for features that exist are accepted; an unknown flag is an error rather than being
ignored, so a user who relies on an SGLang feature we lack learns it at start-up, not in production.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass

import torch

from sgl_inkling.models.inkling.quant_config import NVFP4_METHODS
from sgl_inkling.models.inkling.tiny import TINY_NAME
from sgl_inkling.server_args_upstream import add_upstream_cli_args, check_upstream_flags

DTYPES = ("auto", "float32", "bfloat16", "float16", "float", "half")  # upstream's names; float = float32
DEVICES = ("auto", "cpu", "cuda")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
ATTENTION_BACKENDS = ("torch_native", "triton")
SCHEDULE_POLICIES = ("fcfs", "lpm")
LOAD_BALANCE_METHODS = ("round_robin", "shortest_queue")
PARSERS = ("inkling",)

_TORCH_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16}


SPEC_ALGORITHMS = ("MTP", "EAGLE", "NEXTN")
MAX_MTP_STEPS = 8  # Inkling ships eight MTP depths
# A quarter of Inkling's 512-token window: the first request to diverge from a cached prefix
# recomputes at most this many tokens; a checkpoint costs ~10 KV tokens of memory at full size.
DEFAULT_SCONV_CHECKPOINT_INTERVAL = 128


class ServerArgsError(ValueError):
    """An invalid flag value or combination; the message names the flag."""


@dataclass
class ServerArgs:
    # Model and tokenizer
    model_path: str | None = None  # None: the embedded inkling-tiny
    tokenizer_path: str | None = None  # None: the model's directory
    revision: str | None = None  # hub branch, tag or commit of --model-path (None: main)
    download_dir: str | None = None  # hub cache directory (None: huggingface_hub's default)
    load_format: str = "auto"
    quantization: str | None = None  # None: the checkpoint's (BF16 or ModelOpt NVFP4 routed experts)
    trust_remote_code: bool = False  # accepted for SGLang compatibility; nothing remote is ever run
    served_model_name: str | None = None
    context_length: int | None = None  # None: the model's max_position_embeddings
    dtype: str = "auto"
    device: str = "auto"
    enable_multimodal: bool | None = None  # None: on when the checkpoint has vision/audio towers
    allowed_local_media_path: str | None = None  # media may be read from files under this directory
    # HTTP
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    max_payload_bytes: int = 8 * 1024 * 1024
    skip_server_warmup: bool = False
    graceful_shutdown_timeout: float = 30.0  # SIGTERM: seconds requests in flight may still run
    # Memory and scheduling
    mem_fraction_static: float | None = None  # None: 0.85 on cuda
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None  # None: 8192 on cuda, 512 on cpu; -1: no chunking
    max_prefill_tokens: int = 16384
    enable_mixed_chunk: bool | None = None  # None: on on cuda (measured faster), off on cpu and with MTP
    schedule_policy: str = "lpm"  # longest cached prefix first when the queue is long (aging prevents starvation)
    disable_radix_cache: bool = False
    sconv_checkpoint_interval: int | None = None  # None: DEFAULT_SCONV_CHECKPOINT_INTERVAL
    stream_interval: int = 1
    incremental_streaming_output: bool = False  # /generate streams: each chunk only what is new (as upstream)
    disable_overlap_schedule: bool = False  # overlap: the host prepares decode step n+1 while the device runs n
    # Parallelism and kernels
    tp_size: int = 1
    dp_size: int = 1  # data-parallel replicas, each its own scheduler group with its own model and pools
    load_balance_method: str = "round_robin"
    ep_size: int = 1  # routed experts split into this many sets within the TP group
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # host:port of node 0's rendezvous (multi-node)
    attention_backend: str | None = None  # None: triton on cuda, torch_native on cpu
    cuda_graph_max_bs: int = 128
    cuda_graph_bs: list[int] | None = None  # the decode batch sizes captured (None: standard buckets up to the max)
    grammar_backend: str = "xgrammar"
    disable_cuda_graph: bool = False
    # Speculative decoding (MTP draft depths)
    speculative_algorithm: str | None = None  # MTP (EAGLE and NEXTN are accepted aliases)
    speculative_num_steps: int | None = None  # None: every MTP depth of the checkpoint (8 for Inkling)
    speculative_num_draft_tokens: int | None = None  # None: num_steps + 1 (chain: one token per depth)
    speculative_eagle_topk: int = 1
    speculative_adaptive: bool = True  # drafts per step chosen from measured costs and acceptance
    speculative_token_map: str | None = None  # draft vocabulary: a .pt tensor of token ids (upstream's format)
    speculative_draft_model_quantization: str | None = None  # fp8: the MTP depths' dense weights in fp8
    # Chat parsing
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    # Misc
    random_seed: int | None = None
    log_level: str = "info"
    enable_metrics: bool = False
    watchdog_timeout: float = 300.0
    decode_log_interval: int = 40  # decode steps between the scheduler's "Decode batch." log lines
    gc_warning_threshold_secs: float = 0.0  # log garbage collections longer than this (0: off)
    log_requests: bool = False
    log_requests_level: int = 2
    enable_cache_report: bool = False
    # Upstream flags accepted only at their neutral value (checked in server_args_upstream).
    kv_cache_dtype: str = "auto"
    page_size: int | None = None
    chat_template: str | None = None
    enable_torch_compile: bool = False
    enable_lora: bool = False
    lora_paths: list[str] | None = None
    moe_runner_backend: str = "auto"
    enable_dp_attention: bool = False

    def __post_init__(self) -> None:
        if self.served_model_name is None:
            self.served_model_name = self.model_path if self.model_path is not None else TINY_NAME

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        d = ServerArgs  # class attributes hold the dataclass defaults
        g = parser.add_argument_group("model")
        g.add_argument("--model-path", "--model", dest="model_path", default=d.model_path,
                       help=f"Local checkpoint directory or Hugging Face repo id (read from the local cache "
                            f"only; nothing is downloaded). Default: the embedded {TINY_NAME}.")
        g.add_argument("--tokenizer-path", default=d.tokenizer_path, help="Default: the model path.")
        g.add_argument("--revision", default=d.revision,
                       help="Branch, tag or commit of a hub --model-path, looked up in the local hub cache.")
        g.add_argument("--download-dir", default=d.download_dir,
                       help="Hub cache directory to find --model-path in (default: huggingface_hub's cache).")
        g.add_argument("--load-format", choices=LOAD_FORMATS, default=d.load_format,
                       help="'dummy' initialises random weights on the device (benchmarks without a checkpoint).")
        g.add_argument("--quantization", default=d.quantization,
                       help=f"Routed-expert weight format; default: detected from the checkpoint "
                            f"(hf_quant_config.json). {'/'.join(NVFP4_METHODS)}: ModelOpt NVFP4, which must match "
                            "the checkpoint (with --load-format dummy: random NVFP4 experts).")
        g.add_argument("--trust-remote-code", action="store_true",
                       help="Accepted and ignored, for SGLang compatibility: Inkling's code is built in.")
        g.add_argument("--served-model-name", default=d.served_model_name,
                       help="Model name reported by the API. Default: the --model-path value as given.")
        g.add_argument("--context-length", type=int, default=d.context_length,
                       help="Default: the model's max_position_embeddings.")
        g.add_argument("--dtype", choices=DTYPES, default=d.dtype,
                       help="auto: bfloat16 on cuda, float32 on cpu.")
        g.add_argument("--device", choices=DEVICES, default=d.device, help="auto: cuda when available.")
        g.add_argument("--enable-multimodal", action=argparse.BooleanOptionalAction, default=d.enable_multimodal,
                       help="Image and audio input. Default: on when the checkpoint has the vision/audio towers.")
        g.add_argument("--allowed-local-media-path", default=d.allowed_local_media_path,
                       help="Directory whose files requests may name as image/audio input (default: none).")

        g = parser.add_argument_group("http")
        g.add_argument("--host", default=d.host)
        g.add_argument("--port", type=int, default=d.port)
        g.add_argument("--api-key", default=d.api_key, help="Require this bearer token on every request.")
        g.add_argument("--max-payload-bytes", type=int, default=d.max_payload_bytes,
                       help="Larger request bodies are rejected with 413.")
        g.add_argument("--skip-server-warmup", action="store_true")
        g.add_argument("--graceful-shutdown-timeout", type=float, default=d.graceful_shutdown_timeout,
                       help="On SIGTERM, stop taking requests and let those in flight run this many seconds; "
                            "the rest then end with an abort (streams with an error event and [DONE]).")

        g = parser.add_argument_group("memory and scheduling")
        g.add_argument("--mem-fraction-static", type=float, default=d.mem_fraction_static,
                       help="Fraction of GPU memory for weights and KV cache, in (0, 1). Default 0.85 on cuda.")
        g.add_argument("--max-running-requests", type=int, default=d.max_running_requests)
        g.add_argument("--max-total-tokens", type=int, default=d.max_total_tokens,
                       help="KV cache capacity in tokens. Default: derived from memory.")
        g.add_argument("--chunked-prefill-size", type=int, default=d.chunked_prefill_size,
                       help="Tokens per prefill chunk; -1 disables chunking. Default 8192 on cuda, 512 on cpu.")
        g.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens,
                       help="Most tokens in one prefill batch.")
        g.add_argument("--enable-mixed-chunk", action=argparse.BooleanOptionalAction, default=d.enable_mixed_chunk,
                       help="A step that prefills a chunk also decodes one token of every running request "
                            "(within --chunked-prefill-size); mixed steps overlap as decode steps do unless "
                            "--disable-overlap-schedule. Default: on on cuda (faster at every concurrency measured on "
                            "the H200), off on cpu; off with MTP, refused when asked for.")
        g.add_argument("--schedule-policy", choices=SCHEDULE_POLICIES, default=d.schedule_policy,
                       help="fcfs: arrival order; lpm: longest cached prefix first.")
        g.add_argument("--disable-radix-cache", action="store_true")
        g.add_argument("--sconv-checkpoint-interval", type=int, default=None,
                       help="Prompt tokens between short-conv checkpoints in the prefix cache (default: "
                       f"{DEFAULT_SCONV_CHECKPOINT_INTERVAL}). A first request diverging from a cached prefix "
                       "recomputes less than this; later ones resume exactly at the divergence. Under memory "
                       "pressure the cache thins these checkpoints before it evicts KV.")
        g.add_argument("--stream-interval", type=int, default=d.stream_interval,
                       help="Decode steps between streamed chunks.")
        g.add_argument("--incremental-streaming-output", action="store_true",
                       help="Streamed /generate (and Engine) chunks carry only what is new: the text, output "
                            "ids and output logprobs since the previous chunk. Default: each chunk carries "
                            "everything so far, as upstream.")
        g.add_argument("--disable-overlap-schedule", action="store_true",
                       help="Run every step synchronously. Default: decode, mixed and prefill steps overlap (the host "
                            "builds and launches step n+1, then reads step n's tokens); MTP is always synchronous.")

        g = parser.add_argument_group("parallelism and kernels")
        g.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=d.tp_size,
                       help="tensor-parallel ranks (one scheduler process and GPU each; gloo on cpu)")
        g.add_argument("--ep-size", "--ep", "--expert-parallel-size", dest="ep_size", type=int, default=d.ep_size,
                       help="split the routed experts into this many sets over the TP ranks (divides --tp-size)")
        g.add_argument("--nnodes", type=int, default=d.nnodes, help="nodes the TP group spans")
        g.add_argument("--node-rank", type=int, default=d.node_rank, help="this node's index; node 0 serves HTTP")
        g.add_argument("--dist-init-addr", default=d.dist_init_addr,
                       help="host:port where the ranks meet (required with --nnodes > 1)")
        g.add_argument("--dp-size", "--dp", "--data-parallel-size", dest="dp_size", type=int, default=d.dp_size,
                       help="Data-parallel replicas in this server; a controller dispatches requests to them "
                            "(on cuda, replica i uses GPUs i*tp-size .. (i+1)*tp-size-1).")
        g.add_argument("--load-balance-method", choices=LOAD_BALANCE_METHODS, default=d.load_balance_method,
                       help="How --dp-size replicas share requests: round_robin, or shortest_queue (fewest "
                            "requests in flight).")
        g.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default=d.attention_backend,
                       help="default: triton on cuda, torch_native on cpu")
        g.add_argument("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", dest="cuda_graph_max_bs", type=int,
                       default=d.cuda_graph_max_bs,
                       help="largest decode batch replayed from a CUDA graph (larger ones run eagerly)")
        g.add_argument("--cuda-graph-bs", nargs="+", type=int, default=d.cuda_graph_bs,
                       help="the decode batch sizes captured as CUDA graphs, e.g. 1 2 4 8 16 32 64 (a batch "
                            "pads to the next one); its largest replaces --cuda-graph-max-bs; sizes above "
                            "--max-running-requests are not captured (logged)")
        g.add_argument("--disable-cuda-graph", action="store_true")
        g.add_argument("--grammar-backend", choices=("xgrammar", "none"), default=d.grammar_backend,
                       help="constrained decoding (json_schema, regex, ebnf, tool calls)")

        g = parser.add_argument_group("speculative decoding")
        g.add_argument("--speculative-algorithm", choices=SPEC_ALGORITHMS, default=d.speculative_algorithm,
                       help="MTP: the checkpoint's chained MTP depths draft tokens the trunk verifies "
                            "(EAGLE and NEXTN mean the same here)")
        g.add_argument("--speculative-num-steps", type=int, default=d.speculative_num_steps,
                       help="draft depths per step, 1..num MTP layers (default: all of them)")
        g.add_argument("--speculative-num-draft-tokens", type=int, default=d.speculative_num_draft_tokens,
                       help="tokens the trunk verifies per step; must be num-steps + 1 (a chain)")
        g.add_argument("--speculative-eagle-topk", type=int, default=d.speculative_eagle_topk,
                       help="branching of the draft tree; only 1 (a chain) is supported")
        g.add_argument("--speculative-adaptive", action=argparse.BooleanOptionalAction, default=d.speculative_adaptive,
                       help="each step drafts the number of tokens (0..num-steps) that the start-up cost "
                            "measurements and the running acceptance rates say is fastest (default on)")
        g.add_argument("--speculative-token-map", default=d.speculative_token_map,
                       help="draft vocabulary: a torch-saved 1-D tensor of token ids (as upstream's EAGLE "
                            "hot-token map); depths compute logits over it only, the trunk still verifies "
                            "over the full vocabulary")
        g.add_argument("--speculative-draft-model-quantization", choices=("fp8", "unquant"),
                       default=d.speculative_draft_model_quantization,
                       help="fp8: the MTP depths' input projections and dense MLPs in fp8 e4m3 with a scale "
                            "per output row, quantized at load (half their bytes a drafted token; drafts "
                            "may differ, the trunk still verifies, so outputs do not); unquant (default): "
                            "as the checkpoint has them")

        g = parser.add_argument_group("chat parsing")
        g.add_argument("--reasoning-parser", choices=PARSERS, default=d.reasoning_parser)
        g.add_argument("--tool-call-parser", choices=PARSERS, default=d.tool_call_parser)

        g = parser.add_argument_group("misc")
        g.add_argument("--random-seed", type=int, default=d.random_seed)
        g.add_argument("--log-level", choices=LOG_LEVELS, default=d.log_level)
        g.add_argument("--enable-metrics", action="store_true",
                       help="Serve Prometheus metrics at /metrics (404 without this flag, as upstream).")
        g.add_argument("--watchdog-timeout", type=float, default=d.watchdog_timeout,
                       help="Seconds one scheduler step may take; a longer one is a hang and the server exits.")
        g.add_argument("--decode-log-interval", type=int, default=d.decode_log_interval,
                       help="Decode steps between the scheduler's 'Decode batch.' log lines (running and queued "
                            "requests, KV tokens in use, generated tokens per second).")
        g.add_argument("--gc-warning-threshold-secs", type=float, default=d.gc_warning_threshold_secs,
                       help="Log a warning for every garbage collection longer than this many seconds in a "
                            "serving process (0: off). Objects alive after start-up are frozen out of them.")
        g.add_argument("--log-requests", action="store_true", help="Log every request and its result.")
        g.add_argument("--log-requests-level", type=int, choices=(0, 1, 2, 3), default=d.log_requests_level,
                       help="0: metadata; 1: and sampling params; 2: and the first 2048 characters of "
                            "input and output; 3: all of them.")
        g.add_argument("--enable-cache-report", action="store_true",
                       help="Report cached prompt tokens in the OpenAI usage (prompt_tokens_details).")
        add_upstream_cli_args(parser, d)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.resolved_device() == "cuda" else torch.float32
        return _TORCH_DTYPES[self.dtype]

    def check(self) -> None:
        """Validate, then fill the device-dependent defaults (so later code sees concrete numbers)."""

        def fail(flag: str, why: str) -> None:
            raise ServerArgsError(f"{flag}: {why}")

        def choice(flag: str, value: str | None, allowed: tuple[str, ...], optional: bool = False) -> None:
            if not (value in allowed or (optional and value is None)):
                fail(flag, f"{value!r} is not one of {', '.join(allowed)}")

        # Choices are re-checked here because ServerArgs is also built directly (sglang.Engine kwargs).
        choice("--dtype", self.dtype, DTYPES)
        choice("--device", self.device, DEVICES)
        choice("--load-format", self.load_format, LOAD_FORMATS)
        if self.quantization is not None and self.quantization not in NVFP4_METHODS:
            fail("--quantization", f"{self.quantization!r} is not supported; Inkling serves BF16 or ModelOpt NVFP4 "
                                   f"routed experts ({', '.join(NVFP4_METHODS)}); the checkpoint's is detected")
        choice("--log-level", self.log_level, LOG_LEVELS)
        choice("--attention-backend", self.attention_backend, ATTENTION_BACKENDS, optional=True)
        choice("--grammar-backend", self.grammar_backend, ("xgrammar", "none"))
        choice("--schedule-policy", self.schedule_policy, SCHEDULE_POLICIES)
        choice("--load-balance-method", self.load_balance_method, LOAD_BALANCE_METHODS)
        choice("--reasoning-parser", self.reasoning_parser, PARSERS, optional=True)
        choice("--tool-call-parser", self.tool_call_parser, PARSERS, optional=True)

        if self.device == "cuda" and not torch.cuda.is_available():
            fail("--device", "cuda was requested but torch sees no CUDA device (use --device cpu or auto)")
        if self.dtype in ("float16", "half"):
            fail("--dtype", f"{self.dtype} is not supported: Inkling is trained in bfloat16 and its activations "
                            "can exceed float16's range; use bfloat16 (or float32)")
        check_upstream_flags(self, fail)
        if not 1 <= self.port <= 65535:
            fail("--port", f"{self.port} is outside 1..65535")
        if self.tp_size < 1:
            fail("--tp-size", f"must be >= 1, got {self.tp_size}")
        if self.dp_size < 1:
            fail("--dp-size", f"must be >= 1, got {self.dp_size}")
        if self.dp_size > 1 and self.resolved_device() == "cuda":
            gpus = self.dp_size * self.tp_size
            if gpus > torch.cuda.device_count():
                fail("--dp-size", f"{self.dp_size} replicas x --tp-size {self.tp_size} need {gpus} GPUs; "
                                  f"torch sees {torch.cuda.device_count()}")
        self._check_parallel(fail)
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static < 1.0:
            fail("--mem-fraction-static", f"must be in (0, 1), got {self.mem_fraction_static}")
        if self.allowed_local_media_path is not None and not os.path.isdir(self.allowed_local_media_path):
            fail("--allowed-local-media-path", f"{self.allowed_local_media_path!r} is not a directory")
        if not 0 <= self.gc_warning_threshold_secs < float("inf"):
            fail("--gc-warning-threshold-secs", f"must be a number of seconds >= 0, got {self.gc_warning_threshold_secs}")
        if not 0 <= self.graceful_shutdown_timeout < float("inf"):
            fail("--graceful-shutdown-timeout", f"must be a number of seconds >= 0, got {self.graceful_shutdown_timeout}")
        if self.context_length is not None and self.context_length < 1:
            fail("--context-length", f"must be >= 1, got {self.context_length}")
        for flag, value in (
            ("--max-running-requests", self.max_running_requests),
            ("--max-total-tokens", self.max_total_tokens),
            ("--max-prefill-tokens", self.max_prefill_tokens),
            ("--stream-interval", self.stream_interval),
            ("--max-payload-bytes", self.max_payload_bytes),
            ("--watchdog-timeout", self.watchdog_timeout),
            ("--decode-log-interval", self.decode_log_interval),
            ("--sconv-checkpoint-interval", self.sconv_checkpoint_interval),
        ):
            if value is not None and value <= 0:
                fail(flag, f"must be positive, got {value}")
        if self.chunked_prefill_size is not None and (
            self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1
        ):
            fail("--chunked-prefill-size", f"must be positive or -1 (no chunking), got {self.chunked_prefill_size}")

        self._check_speculative(fail)
        if self.speculative_algorithm is not None:
            if self.enable_mixed_chunk:
                fail("--enable-mixed-chunk", "not supported with --speculative-algorithm MTP: a step verifies "
                                             "drafts of every running request and drafts after the prompt, which "
                                             "a prefill chunk cannot carry; leave it unset (off with MTP)")
            self.enable_mixed_chunk = False
        elif self.enable_mixed_chunk is None:
            # On the H200 (NVFP4 slice, 8K in / 1K out, overlapped) mixed steps served 1,784 tok/s at
            # concurrency 64 against 1,599 without, and 3,002 against 2,588 at 16; the CPU is unmeasured.
            self.enable_mixed_chunk = self.resolved_device() == "cuda"

        on_cuda = self.resolved_device() == "cuda"
        if self.attention_backend is None:
            self.attention_backend = "triton" if on_cuda else "torch_native"
        if self.cuda_graph_max_bs < 0:
            fail("--cuda-graph-max-bs", f"must be >= 0, got {self.cuda_graph_max_bs}")
        if self.cuda_graph_bs is not None:
            if not self.cuda_graph_bs or min(self.cuda_graph_bs) < 1:
                fail("--cuda-graph-bs", f"batch sizes must be >= 1, got {self.cuda_graph_bs}")
            if self.disable_cuda_graph:
                fail("--cuda-graph-bs", "given with --disable-cuda-graph, which captures no graphs")
            self.cuda_graph_bs = sorted(set(self.cuda_graph_bs))
            if self.cuda_graph_max_bs not in (ServerArgs.cuda_graph_max_bs, self.cuda_graph_bs[-1]):
                fail("--cuda-graph-bs", f"its largest size {self.cuda_graph_bs[-1]} is the graphs' largest; "
                                        f"--cuda-graph-max-bs {self.cuda_graph_max_bs} contradicts it (give one)")
            self.cuda_graph_max_bs = self.cuda_graph_bs[-1]
        if self.chunked_prefill_size is None:
            self.chunked_prefill_size = 8192 if on_cuda else 512
        if self.mem_fraction_static is None and on_cuda:
            self.mem_fraction_static = 0.85
        # A chunk is prefilled in one batch, so a chunk larger than the batch budget could never run.
        if self.chunked_prefill_size != -1 and self.max_prefill_tokens < self.chunked_prefill_size:
            fail("--max-prefill-tokens", f"{self.max_prefill_tokens} is smaller than --chunked-prefill-size "
                                         f"{self.chunked_prefill_size}; raise it or lower the chunk size")

    def _check_speculative(self, fail) -> None:
        if self.speculative_draft_model_quantization not in (None, "unquant", "fp8"):
            fail("--speculative-draft-model-quantization",
                 f"must be fp8 or unquant, got {self.speculative_draft_model_quantization!r}")
        steps, drafts = self.speculative_num_steps, self.speculative_num_draft_tokens
        if self.speculative_algorithm is None:
            if steps is not None or drafts is not None:
                fail("--speculative-num-steps", "needs --speculative-algorithm MTP")
            if self.speculative_token_map is not None:
                fail("--speculative-token-map", "needs --speculative-algorithm MTP")
            if self.speculative_draft_model_quantization not in (None, "unquant"):
                fail("--speculative-draft-model-quantization", "needs --speculative-algorithm MTP")
            return
        if self.speculative_algorithm not in SPEC_ALGORITHMS:
            fail("--speculative-algorithm", f"{self.speculative_algorithm!r} is not one of {', '.join(SPEC_ALGORITHMS)}")
        self.speculative_algorithm = "MTP"
        if steps is not None and not 1 <= steps <= MAX_MTP_STEPS:
            fail("--speculative-num-steps", f"must be in 1..{MAX_MTP_STEPS}, got {steps}")
        if drafts is not None and steps is not None and drafts != steps + 1:
            fail("--speculative-num-draft-tokens", f"must be num-steps + 1 = {steps + 1} for a draft chain, got {drafts}")
        if drafts is not None and not 2 <= drafts <= MAX_MTP_STEPS + 1:
            fail("--speculative-num-draft-tokens", f"must be in 2..{MAX_MTP_STEPS + 1}, got {drafts}")
        if steps is None and drafts is not None:
            self.speculative_num_steps = drafts - 1
        if self.speculative_eagle_topk != 1:
            fail("--speculative-eagle-topk", f"only 1 (a chain of drafts) is supported, got {self.speculative_eagle_topk}")


    def _check_parallel(self, fail) -> None:
        # Whether the TP size divides the heads is checked when the model is built (it knows them).
        if self.ep_size < 1 or self.tp_size % self.ep_size:
            fail("--ep-size", f"must divide --tp-size {self.tp_size}, got {self.ep_size}")
        if self.nnodes < 1 or self.tp_size % self.nnodes:
            fail("--nnodes", f"must divide --tp-size {self.tp_size}, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            fail("--node-rank", f"must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        if self.nnodes > 1 and self.dp_size > 1:
            fail("--dp-size", "data-parallel replicas within a multi-node launch are not supported; run one "
                              "launch per replica behind sglang-router")
        if self.nnodes > 1 and not self.dist_init_addr:
            fail("--dist-init-addr", "required with --nnodes > 1 (host:port of node 0)")
        if self.dist_init_addr is not None and not _is_host_port(self.dist_init_addr):
            fail("--dist-init-addr", f"expected host:port, got {self.dist_init_addr!r}")
        per_node = self.tp_size // self.nnodes
        if per_node > 1 and self.resolved_device() == "cuda" and per_node > torch.cuda.device_count():
            fail("--tp-size", f"{per_node} ranks per node need as many GPUs; {torch.cuda.device_count()} visible")


def _is_host_port(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535


def make_parser() -> argparse.ArgumentParser:
    # allow_abbrev off: `--model` must never silently resolve to some other `--model-*` flag.
    parser = argparse.ArgumentParser(
        prog="python -m sglang.launch_server",
        description="Serve TML Inkling with an SGLang-compatible HTTP API.",
        allow_abbrev=False,
    )
    ServerArgs.add_cli_args(parser)
    return parser


def parse_server_args(argv: list[str]) -> ServerArgs:
    """Parse and validate; on bad input print the error and exit with status 2, as argparse does."""
    parser = make_parser()
    args = ServerArgs.from_cli_args(parser.parse_args(argv))
    try:
        args.check()
    except ServerArgsError as e:
        parser.error(str(e))
    return args
