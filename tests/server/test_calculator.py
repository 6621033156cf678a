"""The calculator as the server offers it: which chats get it, and each call the model makes as a named step."""

from __future__ import annotations

import dataclasses

import pytest

from typewriter.server.calculator import MAX_STEPS, ToolStep, call_arguments, offered, over_limit, step
from typewriter.server.chat_request import ChatMessage, ToolCall, read_chat
from typewriter.server.tool_calls import ToolCallDone
from typewriter.text.calculator import MAX_LENGTH
from typewriter.text.tool_format import GENERIC, HERMES


def call(arguments: str, name: str = "calculator") -> ToolCallDone:
    return ToolCallDone("call_1", name, arguments)


@pytest.mark.parametrize("arguments, expression, result, error", [
    ('{"expression": "12 * 7"}', "12 * 7", "84", None),
    ('{"expression": "7/3"}', "7/3", "7/3 ≈ 2.33333333333", None),
    ('{"expr": "2^10"}', "2^10", "1024", None),  # one argument, whatever the model named it
    ('{"expression": 42}', "42", "42", None),
    ('{"expression": "1/0"}', "1/0", "division by zero: the divisor is 0", "division_by_zero"),
    ('{"expression": "9^9^9"}', "9^9^9", "the power is too large for this calculator", "too_large"),
    ('{"expression": "import os"}', "import os", None, "not_an_expression"),
    ('{"a": "1", "b": "2"}', "", None, "not_a_call"),
    ('{"expression": ["1"]}', "", None, "not_a_call"),
    ('"12 * 7"', "", None, "not_a_call"),
    ('{"expression": "1 +', "", None, "not_a_call"),
    ("[" * 5000, "", None, "not_a_call"),  # nested past the JSON reader's recursion: still a named step
])
def test_a_call_becomes_a_step_with_a_value_or_a_named_refusal(arguments, expression, result, error):
    made = step("r1", 2, call(arguments))
    assert (made.request_id, made.index, made.expression, made.error) == ("r1", 2, expression, error)
    if result is not None:
        assert made.result == result
    assert made.result  # always a sentence or a value to read


def test_a_call_of_another_tool_is_named_and_says_which_one_there_is():
    made = step("r1", 0, call('{"city": "Oslo"}', name="weather"))
    assert made.error == "not_a_call" and "'weather'" in made.result and "calculator" in made.result


def test_a_long_expression_is_shown_cut_and_refused():
    made = step("r1", 0, call('{"expression": "' + "1+" * MAX_LENGTH + '1"}'))
    assert made.error == "too_long" and len(made.expression) == MAX_LENGTH + 1 and made.expression.endswith("…")


def test_past_the_limit_a_call_is_answered_with_a_refusal_to_finish_without_it():
    made = over_limit("r1", MAX_STEPS, call('{"expression": "1+1"}'))
    assert made.error == "step_limit" and f"at most {MAX_STEPS}" in made.for_model()


def test_what_the_model_reads_and_what_a_v1_client_reads():
    good, bad = ToolStep("r1", 0, "12 * 7", "84"), ToolStep("r1", 1, "1/0", "division by zero", "division_by_zero")
    assert (good.for_model(), bad.for_model()) == ("84", "error: division by zero")
    assert good.as_text() == "\n\n> calculator: 12 * 7 = 84\n\n"
    assert bad.as_text() == "\n\n> calculator: 1/0 (error: division by zero)\n\n"


@pytest.mark.parametrize("arguments, kept", [
    ('{"expression": "1+1"}', '{"expression": "1+1"}'), ('"1+1"', "{}"), ("{oops", "{}"), ("[" * 5000, "{}")])
def test_the_conversation_holds_a_call_s_arguments_as_an_object_whatever_was_written(arguments, kept):
    assert call_arguments(arguments) == kept


def plain(**fields) -> object:
    frame = {"type": "chat", "id": "c1", "messages": [{"role": "user", "content": "what is 2 + 2"}], **fields}
    return read_chat(frame, "c1", 8)


def test_only_a_plain_question_with_the_setting_on_and_a_template_with_tools_is_offered_it():
    chat = plain()
    assert offered(chat, HERMES, enabled=True)
    assert not offered(chat, HERMES, enabled=False)
    assert not offered(chat, None, enabled=True)
    assert not offered(chat, GENERIC, enabled=True)  # the model's own template takes no tools
    weather = [{"type": "function", "function": {"name": "weather"}}]
    assert not offered(plain(tools=weather), HERMES, True)
    assert not offered(plain(tools=weather, tool_choice="none"), HERMES, True)  # no calls, said the client
    assert not offered(plain(tool_choice="none"), HERMES, True)
    assert not offered(plain(response_format={"type": "json_object"}), HERMES, True)
    assert not offered(plain(**{"continue": {"text": "Two and"}}), HERMES, True)
    assert not offered(dataclasses.replace(chat, n=2), HERMES, True)
    assert not offered(dataclasses.replace(chat, logprobs=0), HERMES, True)
    history = (ChatMessage("assistant", "", (ToolCall("c1", "weather", "{}"),)), ChatMessage("tool", "9", (), "c1"),
               *chat.messages)
    assert not offered(dataclasses.replace(chat, messages=history), HERMES, True)  # the client runs its own tools
