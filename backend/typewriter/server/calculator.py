"""The calculator the server offers the tutor (text/calculator.py), where the model's template takes tools and the
setting is on: which chats are offered it, what the model is told, and each call as a step of the answer that the
student is shown (a `tool_step` frame; a line of text on `/v1`). The loop that runs the steps is tool_loop.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..text.calculator import MAX_LENGTH, CalculatorError, evaluate
from ..text.tool_format import ToolFormat
from .chat_request import Chat
from .tool_calls import ToolCallDone

NAME = "calculator"
MAX_STEPS = 4  # calculations per answer; past them the answer must finish without one
FUNCTION: dict[str, Any] = {
    "name": NAME,
    "description": "Exact arithmetic. Call it for every calculation with numbers instead of working it out yourself, "
                   "then use its result.",
    # No example expression: the 0.5B copied one into its calls instead of its own numbers.
    "parameters": {"type": "object", "required": ["expression"], "properties": {"expression": {
        "type": "string", "description": "one arithmetic expression of numbers with + - * / ^, parentheses, % and "
                                        "sqrt()"}}},
}


@dataclass(frozen=True)
class ToolStep:
    """One calculation, in the order the answer made them (`index` from 0)."""

    request_id: str
    index: int
    expression: str  # as the model wrote it, cut to a little past what the calculator reads
    result: str  # what the student reads: the value (text/calculator.py's Result.text), or why there is none
    error: str | None = None  # a named code when there is no value

    def for_model(self) -> str:
        """The tool message's content: the value, or the refusal in a sentence the model can act on."""
        return self.result if self.error is None else f"error: {self.result}"

    def as_text(self) -> str:
        """The step as a paragraph of the answer's text, where a door has no frame for it (`/v1`)."""
        said = f"= {self.result}" if self.error is None else f"(error: {self.result})"
        return f"\n\n> {NAME}: {self.expression} {said}\n\n"


def offered(chat: Chat, fmt: ToolFormat | None, enabled: bool) -> bool:
    """A chat is offered the calculator when the setting is on, the model's own template takes tools (not the
    generic format the server writes for one that has none), and the chat is a plain question: no tools or tool
    calls of its own, no response_format, one answer, no continued start, no log probabilities (its text would
    hold a step that no token spelt)."""
    own_tools = chat.own_tools or any(m.tool_calls or m.role == "tool" for m in chat.messages)
    return (enabled and fmt is not None and fmt.in_template and not own_tools and chat.response_format is None
            and chat.n == 1 and chat.answer_start is None and chat.logprobs is None)


def tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": FUNCTION}]


def step(request_id: str, index: int, call: ToolCallDone) -> ToolStep:
    """Evaluate one call the model made; a call that is not the calculator's, or not its shape, is a named step."""
    expression = _expression(call.arguments)
    shown = "" if expression is None else expression if len(expression) <= MAX_LENGTH else \
        expression[:MAX_LENGTH] + "…"
    if call.name != NAME or expression is None:
        why = (f"there is no tool {call.name!r}; the only one is {NAME}" if call.name != NAME else
               'the call must be {"expression": "..."} with one arithmetic expression')
        return ToolStep(request_id, index, shown, why, "not_a_call")
    try:
        return ToolStep(request_id, index, shown, evaluate(expression).text)
    except CalculatorError as e:
        return ToolStep(request_id, index, shown, e.message, e.code)


def over_limit(request_id: str, index: int, call: ToolCallDone) -> ToolStep:
    expression = _expression(call.arguments) or ""
    return ToolStep(request_id, index, expression[:MAX_LENGTH], f"at most {MAX_STEPS} calculations per answer; "
                                                                "finish the answer without the calculator",
                    "step_limit")


def call_arguments(arguments: str) -> str:
    """The call's arguments as the conversation holds them: JSON text of an object, whatever the model wrote."""
    try:
        return arguments if isinstance(json.loads(arguments), dict) else "{}"
    except (ValueError, RecursionError):  # RecursionError: a model can write brackets nested thousands deep
        return "{}"


def _expression(arguments: str) -> str | None:
    """The expression from `{"expression": "..."}`, or from an object whose one value is a string or a number."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    found = value.get("expression", next(iter(value.values())) if len(value) == 1 else None)
    if isinstance(found, (int, float)) and not isinstance(found, bool):
        return str(found)
    return found if isinstance(found, str) else None
