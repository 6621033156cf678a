"""`response_format`, `tools` and `tool_choice`, in OpenAI's shapes, read for every door. Tools are only checked
here: they become a prompt and a constraint in `open_chat` (chats.py), which knows the model's template.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..engine.constraints import json_object_schema
from ..engine.request import Constraint, ConstraintKind
from ..errors import InvalidRequest

MAX_TOOLS = 32
TOOL_CHOICES = ("none", "auto", "required")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function and schema names


@dataclass(frozen=True)
class Tools:
    """`choice` is "auto", "required" or "function" (then `forced` names it); "none" gives no Tools at all."""

    functions: tuple[dict[str, Any], ...]  # {"name", "description"?, "parameters"?}, OpenAI's function objects
    choice: str
    forced: str | None = None
    strict: bool = True  # every function said strict (or none said): its arguments must match exactly

    @property
    def must_call(self) -> bool:
        return self.choice in ("required", "function")

    def offered(self) -> tuple[dict[str, Any], ...]:
        """The functions a forced call may be of."""
        return tuple(f for f in self.functions if self.forced in (None, f["name"]))

    def for_template(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": f} for f in self.functions]


def parse_response_format(value: object, where: str = "response_format") -> Constraint | None:
    """None for text; a constraint for `json_object`, `json_schema` (`strict`: unknown schema keywords are refused,
    else ignored), and this server's `regex` and `grammar` (Lark) extensions."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidRequest(where, 'must be an object with a "type": text, json_object, json_schema, regex or grammar')
    kind = value["type"]
    allowed = {"text": ("type",), "json_object": ("type",), "json_schema": ("type", "json_schema"),
               "regex": ("type", "regex"), "grammar": ("type", "grammar")}
    if kind not in allowed:
        raise InvalidRequest(f"{where}.type", f"must be text, json_object, json_schema, regex or grammar, got {kind!r}")
    extra = sorted(set(value) - set(allowed[kind]))
    if extra:
        raise InvalidRequest(f"{where}.{extra[0]}", f"unknown field for type {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT, json_object_schema(), where)
    if kind in ("regex", "grammar"):
        if not isinstance(value.get(kind), str) or not value[kind]:
            raise InvalidRequest(f"{where}.{kind}", "must be a non-empty string")
        return Constraint(ConstraintKind.REGEX if kind == "regex" else ConstraintKind.GRAMMAR, value[kind], where)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequest(f"{where}.json_schema", "must be an object with name and schema")
    extra = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if extra:
        raise InvalidRequest(f"{where}.json_schema.{extra[0]}", "unknown field; known: name, schema, strict, description")
    if not isinstance(spec.get("name"), str) or not _NAME.fullmatch(spec["name"]):
        raise InvalidRequest(f"{where}.json_schema.name", "must be 1 to 64 letters, digits, _ or -")
    strict = _flag(spec, "strict", f"{where}.json_schema.strict")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{where}.json_schema.schema", "must be a JSON Schema object")
    return Constraint(ConstraintKind.JSON_SCHEMA, _schema_text(schema, strict), f"{where}.json_schema.schema")


def parse_tools(tools: object, tool_choice: object, flat: bool = False) -> Tools | None:
    """The tools and the choice, or None when no tool is offered (`tool_choice` "none", or no tools). `flat`: the
    Responses API's shape, `{"type": "function", "name", "parameters"}`, instead of the nested `function`."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequest("tool_choice", "names a tool, but no tools were given")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise InvalidRequest("tools", f"must be a list of at most {MAX_TOOLS} function tools")
    functions = tuple(_function(i, t, flat) for i, t in enumerate(tools))
    names = [f["name"] for f in functions]
    if len(set(names)) < len(names):
        raise InvalidRequest("tools", "two tools have the same name")
    strict = all([f.pop("strict") for f in functions])  # noqa: C419 (a list: every function loses its flag)
    choice, forced = _choice(tool_choice, names, flat)
    if choice == "none":
        return None
    return Tools(functions, choice, forced, strict)


def _function(i: int, tool: object, flat: bool) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise InvalidRequest(f"{where}.type", 'only {"type": "function"} tools are supported')
    if flat:
        function = {k: v for k, v in tool.items() if k != "type"}
    else:
        if sorted(tool) != ["function", "type"] or not isinstance(tool["function"], dict):
            raise InvalidRequest(where, 'must be {"type": "function", "function": {name, description, parameters}}')
        function, where = dict(tool["function"]), f"{where}.function"
    extra = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if extra:
        raise InvalidRequest(f"{where}.{extra[0]}", "unknown field; known: name, description, parameters, strict")
    if not isinstance(function.get("name"), str) or not _NAME.fullmatch(function["name"]):
        raise InvalidRequest(f"{where}.name", "must be 1 to 64 letters, digits, _ or -")
    if "description" in function and not isinstance(function["description"], str):
        raise InvalidRequest(f"{where}.description", "must be a string")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"{where}.parameters", "must be a JSON Schema object")
    function["parameters"] = parameters
    function["strict"] = _flag(function, "strict", f"{where}.strict", default=True)
    return function


def _choice(value: object, names: list[str], flat: bool) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise InvalidRequest("tool_choice", f"must be none, auto, required or a named function, got {value!r}")
        return value, None
    name = None
    if isinstance(value, dict) and value.get("type") == "function":
        function = value if flat else value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        shape = '{"type": "function", "name": ...}' if flat else '{"type": "function", "function": {"name": ...}}'
        raise InvalidRequest("tool_choice", f"must be none, auto, required or {shape}")
    if name not in names:
        raise InvalidRequest("tool_choice", f"names {name!r}, which is not among the tools")
    return "function", name


def _flag(spec: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = spec.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(where, "must be true or false")
    return value


def _schema_text(schema: dict[str, Any], strict: bool) -> str:
    """Strict: a schema keyword the engine cannot enforce is refused. Not strict: it is ignored (`lenient`)."""
    options = schema.get("x-guidance", {})
    if not isinstance(options, dict):
        raise InvalidRequest("response_format.json_schema.schema.x-guidance", "must be an object of llguidance's "
                                                                             "JSON options")
    if not strict:
        schema = {**schema, "x-guidance": {**options, "lenient": True}}
    return json.dumps(schema, ensure_ascii=False)
