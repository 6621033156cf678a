"""A calculator tool answers an arithmetic question: the model writes the expression as a tool call (its arguments
always match the tool's schema: the engine keeps them so), this script computes it, and the model answers with
the result. Any model calls it (the embedded SmolLM2's template has no tools: it gets the server's generic format),
but the arithmetic needs one such as Qwen2.5 (scripts/fetch-qwen-0.5b.sh).

    typewriter serve --model "$(scripts/fetch-qwen-0.5b.sh)" &
    python examples/calculator_tool.py "What is 37 times 91, plus 15?"

TYPEWRITER_URL (default http://127.0.0.1:8000) and TYPEWRITER_API_KEY say where the server is and its key.
"""

import ast
import json
import operator
import os
import sys

from openai import OpenAI

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["expression"],
                   "properties": {"expression": {"type": "string", "pattern": "^[0-9+*/(). -]{1,60}$"}}}}}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.USub: operator.neg}


def calculate(expression: str) -> float:
    """The value of an arithmetic expression, read as a syntax tree (never eval)."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)}")

    return value(ast.parse(expression, mode="eval").body)


def main(question: str) -> None:
    url = os.environ.get("TYPEWRITER_URL", "http://127.0.0.1:8000")
    client = OpenAI(base_url=f"{url}/v1", api_key=os.environ.get("TYPEWRITER_API_KEY") or "unused")
    messages = [{"role": "user", "content": question}]
    first = client.chat.completions.create(model="tutor", messages=messages, tools=[CALCULATOR],
                                           tool_choice="required", temperature=0, max_tokens=200).choices[0]
    (call,) = first.message.tool_calls
    expression = json.loads(call.function.arguments)["expression"]
    try:
        result = calculate(expression)
        shown = f"{result:g}"
    except (ValueError, SyntaxError, ZeroDivisionError) as e:
        shown = f"error: {e}"
    print(f"calculator({expression!r}) = {shown}")
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
                 {"role": "tool", "tool_call_id": call.id, "content": shown}]
    final = client.chat.completions.create(model="tutor", messages=messages, tools=[CALCULATOR], tool_choice="none",
                                           temperature=0, max_tokens=120).choices[0]
    print(final.message.content)


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "What is 37 times 91, plus 15?")
