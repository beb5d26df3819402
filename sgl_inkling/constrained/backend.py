"""The xgrammar backend of the scheduler: one compiler, compiled grammars cached by key, a matcher
per request, and the batch masker.

Building xgrammar's view of a 200k vocabulary takes about a second and compiling a grammar tens to
hundreds of milliseconds, so both run on a background thread: the vocabulary with the first grammar
request, each grammar from the moment its request arrives, overlapping the request's prefill.
Requests with the same grammar share one compile (the cache holds futures, so even concurrent
arrivals compile once).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import xgrammar as xgr

from sgl_inkling.constrained.mask import GrammarMasker
from sgl_inkling.constrained.matcher import RequestGrammar
from sgl_inkling.constrained.spec import GrammarSpec
from sgl_inkling.constrained.vocab import build_tokenizer_info

logger = logging.getLogger(__name__)

DEFAULT_CACHE_ENTRIES = 256
# A compiled grammar over Inkling's 200k vocabulary holds about 1.5 MB of precomputed token masks.
DEFAULT_CACHE_BYTES = 512 << 20


class XGrammarBackend:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        *,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.vocab_size = vocab_size
        self.masker = GrammarMasker(vocab_size)
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._cache_entries = cache_entries
        self._cache_bytes = cache_bytes
        self._lock = threading.Lock()
        # One worker: compiles queue behind the vocabulary build and never compete with each other
        # for the cores the forward uses; xgrammar parallelises inside one compile.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._tokenizer = tokenizer
        self._compiler: Future | None = None  # built with the first grammar: servers without any pay nothing
        self.num_compiles = 0
        self.num_cache_hits = 0

    @staticmethod
    def _make_compiler(tokenizer: Any, vocab_size: int) -> xgr.GrammarCompiler:
        info = build_tokenizer_info(tokenizer, vocab_size)
        # Our own cache keeps compiled grammars; xgrammar's would hold a second copy.
        return xgr.GrammarCompiler(info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False)

    def compiler(self) -> xgr.GrammarCompiler:
        with self._lock:
            self._start_compiler()
        return self._compiler.result()  # type: ignore[union-attr]

    def _start_compiler(self) -> None:
        if self._compiler is None:
            self._compiler = self._pool.submit(self._make_compiler, self._tokenizer, self.vocab_size)

    def compile(self, spec: GrammarSpec) -> Future:
        """A future of the compiled grammar; shared by every request with the same spec."""
        with self._lock:
            fut = self._cache.get(spec.key)
            if fut is not None:
                self._cache.move_to_end(spec.key)
                self.num_cache_hits += 1
                return fut
            self._start_compiler()  # queued ahead of this compile on the one worker
            fut = self._pool.submit(self._compile, spec.structural_tag)
            self._cache[spec.key] = fut
            self.num_compiles += 1
            self._evict()
            return fut

    def _evict(self) -> None:
        """Drop least recently used grammars beyond the bounds (requests keep their own reference)."""
        while len(self._cache) > 1 and (
            len(self._cache) > self._cache_entries or self.cache_bytes() > self._cache_bytes
        ):
            self._cache.popitem(last=False)

    def cache_bytes(self) -> int:
        done = (f for f in self._cache.values() if f.done() and f.exception() is None)
        return sum(f.result().memory_size_bytes for f in done)

    def _compile(self, source: str) -> xgr.CompiledGrammar:
        return self.compiler().compile_structural_tag(source)

    def new_request(self, spec: GrammarSpec) -> RequestGrammar:
        return RequestGrammar(spec, self.compile(spec))

    def stats(self) -> dict[str, int]:
        return {
            "grammar_cache_entries": len(self._cache),
            "grammar_cache_bytes": self.cache_bytes(),
            "grammar_compiles": self.num_compiles,
            "grammar_cache_hits": self.num_cache_hits,
        }

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
