"""What travels from the HTTP process to the scheduler to describe a request's grammar."""

from __future__ import annotations

from dataclasses import dataclass


class GrammarError(ValueError):
    """A grammar the client sent (schema, regex, EBNF, tools) is invalid; the API answers 400."""


@dataclass(frozen=True)
class GrammarSpec:
    """One request's grammar as an xgrammar structural tag (JSON text).

    Every kind of constraint (JSON schema, regex, EBNF, TMLv0 framing, tool calls) is lowered to a
    structural tag in the HTTP process, so the scheduler has one compile path and the JSON text is
    the compile-cache key. Small, frozen and picklable: it rides on TokenizedGenerateReq over ZMQ.
    """

    structural_tag: str
    kind: str = "structural_tag"  # what the client asked for, for logs and errors: json_schema, tools, ...

    @property
    def key(self) -> str:
        return self.structural_tag
