"""Chat programs: prompts rendered as TMLv0 by tml-renderers, model turns parsed to visible text."""

from __future__ import annotations

import pytest

import sglang as sgl
from sgl_inkling.chat.render import render_chat
from sgl_inkling.chat.tokenizer import get_tokenizer
from sglang.lang.backend.base_backend import BaseBackend
from sglang.lang.executor import ProgramError


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer()


class ScriptedChatBackend(BaseBackend):
    """Returns the queued output ids, one list per gen, and records every body."""

    def __init__(self, outputs: list[list[int]], choice_logprobs: list[float] | None = None):
        self.outputs = list(outputs)
        self.choice_logprobs = choice_logprobs
        self.bodies: list[dict] = []

    def generate(self, body):
        self.bodies.append(body)
        if isinstance(body["input_ids"][0], list):  # select's scoring batch: a constant per choice
            return [
                {"meta_info": {"input_token_logprobs": [[lp, t, None] for t in ids[start:]]}}
                for lp, ids, start in zip(self.choice_logprobs, body["input_ids"], body["logprob_start_len"])
            ]
        ids = self.outputs.pop(0)
        return {"text": "", "output_ids": ids, "meta_info": {"finish_reason": {"type": "stop"}}}


def special(tok, name: str) -> int:
    return tok.token_id(name)


def closing_stripped(tok, ids: list[int]) -> list[int]:
    """A rendered conversation without its last message's `<|end_message|>` and end of turn."""
    assert ids[-2:] == [special(tok, "end_message"), special(tok, "content_model_end_sampling")]
    return ids[:-2]


@sgl.function
def two_turns(s):
    s += sgl.system("Be brief.")
    s += sgl.user("Hi there")
    s += sgl.assistant(sgl.gen("a1", max_tokens=32))
    s += sgl.user("And then?")
    s += sgl.assistant_begin()
    s += "Sure:"
    s += sgl.gen("a2", max_tokens=8)
    s += sgl.assistant_end()


def test_two_turns_prompts_and_parsed_answers(tok):
    msg_model, thinking, text = (
        special(tok, n) for n in ("message_model", "content_thinking", "content_text")
    )
    end_msg, end_turn = special(tok, "end_message"), special(tok, "content_model_end_sampling")
    # Turn 1: the model opens its turn, thinks, then answers; only the answer is the variable.
    turn1 = [
        msg_model,
        thinking,
        *tok.encode("hmm"),
        end_msg,
        msg_model,
        text,
        *tok.encode("Hello!"),
        end_msg,
    ]
    # Turn 2: the model continues the text block the program started.
    turn2 = [*tok.encode(" fine"), end_msg, end_turn]
    backend = ScriptedChatBackend([turn1 + [end_turn], turn2])
    state = two_turns.run(backend=backend, temperature=0)

    assert state["a1"] == "Hello!"
    assert state.get_meta_info("a1")["reasoning_content"] == "hmm"
    assert state["a2"] == " fine"
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "And then?"},
    ]
    assert state.messages() == [*history, {"role": "assistant", "content": "Sure: fine"}]

    first, second = backend.bodies
    # The open turn's prompt is exactly the rendered conversation (it ends with <|end_message|>).
    assert first["input_ids"] == render_chat(history[:2]).input_ids
    assert first["sampling_params"]["max_new_tokens"] == 32
    # The continuation sees the partial assistant message, left open after its text.
    partial = [*history, {"role": "assistant", "content": "Sure:"}]
    assert second["input_ids"] == closing_stripped(tok, render_chat(partial).input_ids)
    assert "text" not in second  # TMLv0 framing must travel as ids, never as spelled-out text
    assert state.text() == tok.decode(render_chat(state.messages()).input_ids)


def test_gen_inside_a_user_message_stops_at_the_message_end(tok):
    backend = ScriptedChatBackend([tok.encode(" world")])

    @sgl.function
    def prog(s):
        s += sgl.user("hello" + sgl.gen("u", max_tokens=4))

    state = prog.run(backend=backend)
    assert state["u"] == " world"
    assert backend.bodies[0]["sampling_params"]["stop_token_ids"] == [special(tok, "end_message")]
    assert state.messages() == [{"role": "user", "content": "hello world"}]


def test_select_in_a_chat_scores_choices_inside_the_assistant_text_block(tok):
    backend = ScriptedChatBackend([], choice_logprobs=[-3.0, -1.0])

    @sgl.function
    def prog(s):
        s += sgl.user("Pick a colour")
        s += sgl.assistant(sgl.select("c", choices=["red", "blue"]))

    state = prog.run(backend=backend)
    assert state["c"] == "blue"
    assert state.messages()[-1] == {"role": "assistant", "content": "blue"}
    (body,) = backend.bodies
    for choice, ids, start in zip(["red", "blue"], body["input_ids"], body["logprob_start_len"]):
        rendered = closing_stripped(
            tok,
            render_chat(
                [{"role": "user", "content": "Pick a colour"}, {"role": "assistant", "content": choice}]
            ).input_ids,
        )
        assert ids == rendered
        assert tok.decode(ids[start:]) == choice


def test_with_block_roles_on_the_state(tok):
    backend = ScriptedChatBackend([])

    @sgl.function
    def prog(s):
        with s.user():
            s += "one "
            s += "two"
        s.system("rules")

    assert prog.run(backend=backend).messages() == [
        {"role": "user", "content": "one two"},
        {"role": "system", "content": "rules"},
    ]


@pytest.mark.parametrize(
    "body, message",
    [
        (lambda s: [s.__iadd__("plain text"), s.__iadd__(sgl.user("hi"))], "chat role after plain text"),
        (lambda s: [s.__iadd__(sgl.user("hi")), s.__iadd__("stray")], "outside a role"),
        (lambda s: [s.__iadd__(sgl.user("hi")), s.__iadd__(sgl.gen("x"))], "inside a role"),
        (lambda s: [s.__iadd__(sgl.user_begin()), s.__iadd__(sgl.assistant_end())], "without a matching"),
    ],
)
def test_chat_programs_that_tmlv0_cannot_express_fail_clearly(tok, body, message):
    with pytest.raises(ProgramError, match=message):
        sgl.function(body).run(backend=ScriptedChatBackend([]))
