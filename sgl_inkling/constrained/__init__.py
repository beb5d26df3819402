"""Grammar-constrained decoding: xgrammar backend and TMLv0-aware grammars.

HTTP process: `native_grammar` / `chat_grammar` validate a request's constraints (GrammarError ->
400) and lower them to a GrammarSpec. Scheduler: `scheduler_hooks` compiles, matches and masks.
"""

from sgl_inkling.constrained.request_grammar import chat_grammar, native_grammar
from sgl_inkling.constrained.spec import GrammarError, GrammarSpec

__all__ = ["GrammarError", "GrammarSpec", "chat_grammar", "native_grammar"]
