"""How `select` picks among choices from their token log-probabilities (upstream's `sgl.choices` API).

Each method gets, per choice, the log-probabilities of the choice's own tokens given the prompt
(`input_token_logprobs`: lists of (logprob, token_id, text|None)) and their length-normalised sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TokenLogprob = tuple[float | None, int, str | None]


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


def normalized_logprob(token_logprobs: Sequence[TokenLogprob]) -> float:
    """Mean log-probability of a choice's tokens (entries without a value do not count)."""
    values = [lp for lp, *_ in token_logprobs if lp is not None]
    if not values:
        raise ValueError("a choice has no scored tokens")
    return sum(values) / len(values)


class ChoicesSamplingMethod:
    """A rule for turning per-choice token log-probabilities into a decision."""

    def __call__(
        self,
        *,
        choices: Sequence[str],
        normalized_prompt_logprobs: Sequence[float],
        input_token_logprobs: Sequence[Sequence[TokenLogprob]],
    ) -> ChoicesDecision:
        raise NotImplementedError


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token log-probability (upstream's default)."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs) -> ChoicesDecision:
        best = max(range(len(choices)), key=lambda i: normalized_prompt_logprobs[i])
        return ChoicesDecision(
            choices[best],
            {"normalized_prompt_logprobs": list(normalized_prompt_logprobs)},
        )


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare choices token by token, keeping those with the best logprob at each position.

    Shorter choices are padded with their own mean so that length alone neither wins nor loses.
    """

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs) -> ChoicesDecision:
        rows = [[lp for lp, *_ in tokens if lp is not None] for tokens in input_token_logprobs]
        width = max(len(r) for r in rows)
        padded = [r + [normalized_prompt_logprobs[i]] * (width - len(r)) for i, r in enumerate(rows)]
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(padded[i][j] for i in remaining)
            remaining = [i for i in remaining if padded[i][j] == best]
            if len(remaining) == 1:
                break
        return ChoicesDecision(
            choices[remaining[0]],
            {"normalized_prompt_logprobs": list(normalized_prompt_logprobs)},
        )


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
